"""The checks that guard the warehouse: each passes on the sample and fails on crafted bad data,
and a blocking failure keeps the last good tkg.duckdb. In a Dagster run, a failed blocking check
stops the SQL models downstream of the warehouse; a failed warning stops nothing."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from datetime import timedelta

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from resources.tkg import ExtractionBackend, TkgStorage, TranscriptSource
from tests.conftest import run_tkg
from tests.test_safety import facts_digest
from tkg.store.checks import CHECKS, run_checks
from tkg.store.parquet import ParquetStore
from tkg.store.warehouse import apply_model, load_models
from tkg_assets.assets.warehouse import sql_models, warehouse


@pytest.fixture
def copy(tmp_path, sample_home):
    """A writable in-memory copy of the sample's published file."""
    connection = duckdb.connect()
    connection.execute(f"ATTACH '{sample_home / 'tkg.duckdb'}' AS published (READ_ONLY)")
    connection.execute("COPY FROM DATABASE published TO memory")
    connection.execute("DETACH published")
    yield connection
    connection.close()


@pytest.fixture
def home(tmp_path, sample_home):
    """A writable copy of the sample's data folder: Parquet tree and published file."""
    copied = tmp_path / "home"
    shutil.copytree(sample_home, copied)
    return copied


def results(connection) -> dict[str, int]:
    return {result.name: result.failures for result in run_checks(connection)}


def test_every_check_passes_on_the_sample(copy):
    assert results(copy) == {check.name: 0 for check in CHECKS}


@dataclass(frozen=True)
class Breakage:
    """Rows a stage gone wrong could leave, the check that must catch them and what its example
    says (a regular expression), so the failure is shown to be about the crafted rows."""

    check: str
    name: str
    sql: str
    example: str


# Ids of crafted rows are picked with min(): the same row in every run.
BREAKAGES = (
    Breakage("predicates_in_vocabulary", "unknown_predicate",
             "UPDATE raw.triplets SET predicate = 'LIKES' WHERE triplet_id IN (SELECT min(triplet_id) FROM raw.triplets)",
             r": LIKES$"),
    Breakage("timestamps_are_utc", "naive_timestamp", "ALTER TABLE raw.events ALTER created_at TYPE TIMESTAMP",
             r"^events\.created_at is TIMESTAMP$"),
    Breakage("no_orphans", "triplet_without_event",
             "DELETE FROM raw.events WHERE event_id IN (SELECT min(event_id) FROM raw.triplets)", r"^triplet \w+ has no event$"),
    # Provenance: every statement points at the chunk (and so the offsets in the transcript) it came from.
    Breakage("statements_have_provenance", "statement_without_chunk",
             "UPDATE raw.statements SET chunk_id = 'no such chunk' WHERE statement_id IN (SELECT min(statement_id) FROM raw.statements)",
             r"^statement \w+ has no chunk$"),
    Breakage("statements_have_provenance", "statement_in_another_calls_chunk",
             "UPDATE raw.statements SET chunk_id = (SELECT max(chunk_id) FROM raw.chunks WHERE transcript_id <> "
             "(SELECT min(transcript_id) FROM raw.statements)) WHERE statement_id IN (SELECT min(statement_id) FROM raw.statements "
             "WHERE transcript_id = (SELECT min(transcript_id) FROM raw.statements))", r" of another call$"),
    Breakage("statements_have_provenance", "empty_statement",
             "UPDATE raw.statements SET statement = '  ' WHERE statement_id IN (SELECT min(statement_id) FROM raw.statements)",
             r"^statement \w+ has no text$"),
    Breakage("no_orphans", "figure_without_event",
             "DELETE FROM raw.events WHERE event_id IN (SELECT min(event_id) FROM raw.figures)", r"^figure \w+ has no event$"),
    Breakage("retirements_are_complete", "retired_without_expiry",
             "UPDATE raw.event_invalidations SET expired_at = NULL "
             "WHERE event_id IN (SELECT min(event_id) FROM raw.event_invalidations)", r": invalidated_by without expired_at$"),
    Breakage("validity_ranges_are_ordered", "ends_before_it_starts",
             "UPDATE raw.events SET invalid_at = valid_at - INTERVAL 1 DAY "
             "WHERE event_id IN (SELECT min(event_id) FROM raw.events WHERE temporal_type = 'DYNAMIC' "
             "AND event_id NOT IN (SELECT event_id FROM raw.event_invalidations))", r": ends .+ before it starts "),
    Breakage("validity_ranges_are_ordered", "dynamic_without_valid_at",
             "UPDATE raw.events SET valid_at = NULL "
             "WHERE event_id IN (SELECT min(event_id) FROM raw.events WHERE temporal_type = 'DYNAMIC')", r": DYNAMIC without valid_at$"),
    Breakage("row_counts_within_bounds", "call_without_chunks",
             "DELETE FROM raw.chunks WHERE transcript_id IN (SELECT min(transcript_id) FROM raw.transcripts)", r" has 0 chunk\(s\)$"),
    Breakage("one_holder_per_office", "no_retirements",
             "UPDATE raw.event_invalidations SET invalid_at = NULL, invalidated_by = NULL, expired_at = NULL",
             r"^HLIO CFO of Helio Robotics, Inc\.: Marcus J\. Ortega and Dana Whitfield from 2024-07-01"),
)


def test_every_check_has_a_breakage():
    assert {breakage.check for breakage in BREAKAGES} == {check.name for check in CHECKS}


@pytest.mark.parametrize("breakage", BREAKAGES, ids=lambda breakage: f"{breakage.check}-{breakage.name}")
def test_each_check_fails_on_crafted_bad_data(copy, breakage):
    copy.execute(breakage.sql)
    for model in load_models():  # as publish does: tables derived from raw are built after it
        if model.kind == "TABLE":
            apply_model(copy, model, record=False)
    result = {result.name: result for result in run_checks(copy)}[breakage.check]
    assert not result.passed and result.failures >= 1
    assert any(re.search(breakage.example, example) for example in result.examples), result.examples


def test_a_blocking_failure_keeps_the_last_good_file(home):
    good = facts_digest(home)
    # An extractor gone wrong: a triplet with a predicate outside the vocabulary, in one partition.
    store = ParquetStore(home)
    path = store.partition_path("triplets", "QNTX", "2024-01-01")
    table = pq.read_table(path)
    predicates = table.column("predicate").to_pylist()
    predicates[0] = "LIKES"
    pq.write_table(table.set_column(table.schema.get_field_index("predicate"), "predicate", pa.array(predicates)), path)
    store.global_path("invalidated_events", "event_invalidations").unlink()  # so the global steps run again
    failed = run_tkg(home, "build")
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "predicates_in_vocabulary" in failed.stderr and "not published" in failed.stderr
    assert facts_digest(home) == good


# --- the checks in a Dagster run ---------------------------------------------------------------


@pytest.fixture
def instance(tmp_path):
    (tmp_path / "instance").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "instance")) as test_instance:
        yield test_instance


def materialise_warehouse(home, instance) -> dg.ExecuteInProcessResult:
    """The warehouse and the SQL models downstream of it, as the refresh_graph job runs them."""
    resources = {"storage": TkgStorage(home=str(home)), "source": TranscriptSource(source="sample"),
                 "extraction": ExtractionBackend(backend="offline")}
    return dg.materialize([warehouse, sql_models], resources=resources, instance=instance, raise_on_error=False)


def evaluations(instance, result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    """The check evaluations the run recorded (what the UI shows), read back from the instance:
    a failed step's evaluations are in its event log, not in the in-process result."""
    records = instance.get_records_for_run(result.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records
    return {record.event_log_entry.asset_check_evaluation.check_name: record.event_log_entry.asset_check_evaluation
            for record in records}


def failed_checks(found: dict[str, dg.AssetCheckEvaluation]) -> set[str]:
    return {name for name, evaluation in found.items() if not evaluation.passed}


def materialised(instance, keys) -> set[str]:
    return {key.to_user_string() for key in keys if instance.get_latest_materialization_event(key) is not None}


BLOCKING = {spec.name: spec.blocking for spec in warehouse.check_specs}  # as the asset declares them to Dagster
SQL_MODEL_KEYS = [dg.AssetKey(["sql", model.name]) for model in load_models()]


def test_a_failed_blocking_check_stops_the_downstream_sql_models(home, instance):
    """A DYNAMIC event written to Parquet with its end before its start: `validity_ranges_are_ordered`
    (blocking) fails, the warehouse is not materialised, the SQL models after it do not run and
    the last good tkg.duckdb stays."""
    good = facts_digest(home)
    store = ParquetStore(home)
    retired = set(store.read(store.global_path("invalidated_events", "event_invalidations")).column("event_id").to_pylist())
    path = store.partition_path("temporal_events", "QNTX", "2024-01-01")
    events = pq.read_table(path)
    rows = events.to_pylist()
    broken = next(row for row in rows if row["temporal_type"] == "DYNAMIC" and row["invalid_at"] is None
                  and row["event_id"] not in retired)
    broken["invalid_at"] = broken["valid_at"] - timedelta(days=1)
    pq.write_table(pa.Table.from_pylist(rows, schema=events.schema), path)  # the schema keeps the file's stamp

    result = materialise_warehouse(home, instance)

    assert not result.success
    found = evaluations(instance, result)
    assert set(found) == {check.name for check in CHECKS} and failed_checks(found) == {"validity_ranges_are_ordered"}
    failed = found["validity_ranges_are_ordered"]
    assert failed.severity == dg.AssetCheckSeverity.ERROR and BLOCKING["validity_ranges_are_ordered"]
    assert f"- {broken['event_id']}: ends " in failed.metadata["examples"].value
    assert result.get_failed_step_keys() == {"warehouse"}
    assert result.is_node_untouched("sql_models")  # the step after a failed one never starts
    assert materialised(instance, [warehouse.key, *SQL_MODEL_KEYS]) == set()
    assert facts_digest(home) == good


def test_a_failed_warning_check_is_reported_and_stops_nothing(home, instance):
    """Every retirement dropped from Parquet: Dana Whitfield and Marcus Ortega are both CFO of
    Helio from July 2024. `one_holder_per_office` (a warning) fails, and the warehouse and
    every SQL model after it are materialised all the same."""
    store = ParquetStore(home)
    path = store.global_path("invalidated_events", "event_invalidations")
    pq.write_table(pq.read_table(path).slice(0, 0), path)  # no rows; the schema keeps the file's stamp

    result = materialise_warehouse(home, instance)

    assert result.success
    found = evaluations(instance, result)
    assert set(found) == {check.name for check in CHECKS} and failed_checks(found) == {"one_holder_per_office"}
    failed = found["one_holder_per_office"]
    assert failed.severity == dg.AssetCheckSeverity.WARN and not BLOCKING["one_holder_per_office"]
    assert "HLIO CFO of Helio Robotics, Inc.: Marcus J. Ortega and Dana Whitfield" in failed.metadata["examples"].value
    assert materialised(instance, [warehouse.key, *SQL_MODEL_KEYS]) == {"warehouse", *(key.to_user_string() for key in SQL_MODEL_KEYS)}
    with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
        assert connection.execute("SELECT count(*) FROM raw.event_invalidations").fetchone()[0] == 0
