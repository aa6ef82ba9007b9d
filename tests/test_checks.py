"""The checks that guard the warehouse: each passes on the sample and fails on crafted bad data,
and a blocking failure keeps the last good tkg.duckdb."""

from __future__ import annotations

import shutil

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import run_tkg
from tests.test_safety import facts_digest
from tkg.checks import CHECKS, run_checks
from tkg.store import ParquetStore
from tkg.warehouse import apply_model, load_models


@pytest.fixture
def copy(tmp_path, sample_home):
    """A writable in-memory copy of the sample's published file."""
    connection = duckdb.connect()
    connection.execute(f"ATTACH '{sample_home / 'tkg.duckdb'}' AS published (READ_ONLY)")
    connection.execute("COPY FROM DATABASE published TO memory")
    connection.execute("DETACH published")
    yield connection
    connection.close()


def results(connection) -> dict[str, int]:
    return {result.name: result.failures for result in run_checks(connection)}


def test_every_check_passes_on_the_sample(copy):
    assert results(copy) == {check.name: 0 for check in CHECKS}


BREAKAGES = {
    "predicates_in_vocabulary": "UPDATE raw.triplets SET predicate = 'LIKES' WHERE triplet_id IN (SELECT min(triplet_id) FROM raw.triplets)",
    "timestamps_are_utc": "ALTER TABLE raw.events ALTER created_at TYPE TIMESTAMP",
    "no_orphans": "DELETE FROM raw.events WHERE event_id IN (SELECT min(event_id) FROM raw.triplets)",
    "retirements_are_complete": "UPDATE raw.event_invalidations SET expired_at = NULL "
                                "WHERE event_id IN (SELECT min(event_id) FROM raw.event_invalidations)",
    "validity_ranges_are_ordered": "UPDATE raw.events SET invalid_at = valid_at - INTERVAL 1 DAY "
                                   "WHERE event_id IN (SELECT min(event_id) FROM raw.events WHERE temporal_type = 'DYNAMIC' "
                                   "AND event_id NOT IN (SELECT event_id FROM raw.event_invalidations))",
    "row_counts_within_bounds": "DELETE FROM raw.chunks WHERE transcript_id IN (SELECT min(transcript_id) FROM raw.transcripts)",
    "one_holder_per_office": "UPDATE raw.event_invalidations SET invalid_at = NULL, invalidated_by = NULL, expired_at = NULL",
}


@pytest.mark.parametrize("check", [check.name for check in CHECKS])
def test_each_check_fails_on_crafted_bad_data(copy, check):
    copy.execute(BREAKAGES[check])
    for model in load_models():  # as publish does: tables derived from raw are built after it
        if model.kind == "TABLE":
            apply_model(copy, model, record=False)
    failed = {name for name, failures in results(copy).items() if failures}
    assert check in failed, failed


def test_a_blocking_failure_keeps_the_last_good_file(tmp_path, sample_home):
    home = tmp_path / "home"
    shutil.copytree(sample_home, home)
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
