"""The published DuckDB file: atomic swap under readers, the SQL surface, bi-temporal queries."""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import replace

import duckdb
import pyarrow.parquet as pq
import pytest

from tkg.build.catalog import raw_tables
from tkg.store.parquet import ParquetStore
from tkg.store.warehouse import (
    applied_sha256,
    describe_model,
    load_models,
    model,
    publish,
    reapply_model,
)

SURFACE = {"transcripts", "chunks", "statements", "events", "triplets", "entities", "facts", "canonical_entities",
           "entity_aliases", "invalidation_judgments", "officers"}


def test_sql_surface(sample_home):
    with duckdb.connect(str(sample_home / "tkg.duckdb"), read_only=True) as connection:
        views = {name for (name,) in connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}
        assert SURFACE <= views
        columns = {name for (name,) in connection.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'facts'").fetchall()}
        assert {"company", "fiscal_quarter", "call_date", "subject", "subject_id", "predicate", "object", "object_id",
                "value", "statement", "statement_type", "temporal_type", "valid_at", "invalid_at", "created_at",
                "expired_at", "invalidated_by", "chunk_id"} <= columns
        embedding_type = connection.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_name = 'events' AND column_name = 'embedding'").fetchone()[0]
        assert embedding_type == "FLOAT[]"
        # every chunk's offsets point back into its transcript text
        mismatched = connection.execute(
            "SELECT count(*) FROM chunks c JOIN transcripts t USING (transcript_id) "
            "WHERE substr(t.text, c.start_offset + 1, c.end_offset - c.start_offset) <> c.text").fetchone()[0]
        assert mismatched == 0


def test_bitemporal_known_as_of(sample_home):
    """On 2024-07-30 Quantaris announced Elena Vasquez as CEO from October 1: a query for
    2024-09-01 as known on 2024-08-01 already has Becker retiring; as known on 2024-07-01 it does not."""
    query = ("SELECT DISTINCT subject, invalid_at::DATE::VARCHAR FROM facts_known_as_of(TIMESTAMP '2024-09-01', CAST(? AS TIMESTAMP)) "
             "WHERE company = 'QNTX' AND object = 'CEO of Quantaris Networks Corporation' ORDER BY ALL")
    with duckdb.connect(str(sample_home / "tkg.duckdb"), read_only=True) as connection:
        assert connection.execute(query, ["2024-07-01"]).fetchall() == [("Thomas Becker", None)]
        assert connection.execute(query, ["2024-08-01"]).fetchall() == [("Thomas Becker", "2024-10-01")]
        current = connection.execute(
            "SELECT DISTINCT subject FROM facts_as_of(TIMESTAMP '2024-11-01') "
            "WHERE company = 'QNTX' AND object = 'CEO of Quantaris Networks Corporation'").fetchall()
        assert current == [("Elena Vasquez",)]


def facts_count(connection) -> int:
    return connection.execute("SELECT count(*) FROM facts").fetchone()[0]


def test_publish_swaps_atomically_under_a_reader(sample_home, tmp_path):
    """A reader keeps the file it opened while a publish with different data swaps in; a new
    reader sees the new file."""
    target = tmp_path / "tkg.duckdb"
    publish(ParquetStore(sample_home), target, raw_tables())
    # the next build has lost one call: its transcript is gone, and with it the call's facts
    smaller = tmp_path / "smaller"
    shutil.copytree(sample_home / "parquet", smaller / "parquet")
    shutil.rmtree(smaller / "parquet" / "transcripts" / "company=QNTX" / "quarter=2024-10-01")
    reader = duckdb.connect(str(target), read_only=True)
    try:
        before = facts_count(reader)
        publish(ParquetStore(smaller), target, raw_tables())  # a reader holds the old file open: the publish must neither block nor fail
        assert facts_count(reader) == before  # still its snapshot
    finally:
        reader.close()
    with duckdb.connect(str(target), read_only=True) as fresh:
        after = facts_count(fresh)
        assert 0 < after < before
        assert fresh.execute("SELECT count(*) FROM transcripts WHERE transcript_id LIKE 'QNTX_202410%'").fetchone()[0] == 0
    assert not list(tmp_path.glob(".tkg.duckdb.*")), "no temporary files are left behind"


def test_changed_model_is_reapplied(sample_home, tmp_path):
    """A model whose SQL changed is re-created in the published file: the view answers with
    the new SQL, and the file records the new SQL's hash."""
    target = tmp_path / "tkg.duckdb"
    publish(ParquetStore(sample_home), target, raw_tables())
    officers = model("officers")
    assert applied_sha256(target, officers) == officers.sha256

    def roles() -> Counter:
        with duckdb.connect(str(target), read_only=True) as connection:
            return Counter(role for (role,) in connection.execute("SELECT role FROM officers").fetchall())

    before = roles()
    assert before["CFO"] > 0 and set(before) - {"CFO"}
    cfo_only = replace(officers, sql=officers.sql.replace("WHERE predicate = 'HOLDS_ROLE'",
                                                          "WHERE predicate = 'HOLDS_ROLE' AND object LIKE 'CFO of %'"))
    assert cfo_only.sql != officers.sql and applied_sha256(target, cfo_only) != cfo_only.sha256
    reapply_model(target, cfo_only)
    assert roles() == Counter({"CFO": before["CFO"]})
    assert applied_sha256(target, cfo_only) == cfo_only.sha256
    assert describe_model(target, cfo_only).row_count == before["CFO"]


def test_models_are_ordered_by_their_dependencies():
    names = [m.name for m in load_models()]
    assert names.index("events") < names.index("facts") < names.index("facts_as_of")
    assert names.index("canonical_entities") < names.index("entity_aliases")


# --- incremental publish: the file is updated where the store changed, to the same rows ------------

# Columns that record when a row was written, not what it says.
_WHEN = {"ingested_at", "recorded_at"}


def published_rows(target) -> dict[str, tuple[int, int]]:
    """Every raw table and view of a published file as (rows, order-independent hash of its rows)."""
    with duckdb.connect(str(target), read_only=True) as connection:
        relations = connection.execute(
            "SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema IN ('raw', 'main') "
            "AND table_name NOT IN ('build_info', 'loaded_files', 'sql_models') ORDER BY ALL").fetchall()
        found = {}
        for schema, name in relations:
            columns = ", ".join(f'"{column}"' for (column, *_) in connection.execute(f'DESCRIBE "{schema}"."{name}"').fetchall()
                                if column not in _WHEN)
            found[f"{schema}.{name}"] = connection.execute(
                f'SELECT count(*), sum(hash(({columns}))) FROM (SELECT {columns} FROM "{schema}"."{name}")').fetchall()[0]
        return found


def test_an_incremental_publish_replaces_only_changed_partitions_and_equals_a_fresh_one(sample_home, tmp_path):
    store_root = tmp_path / "store"
    shutil.copytree(sample_home / "parquet", store_root / "parquet")
    store, target = ParquetStore(store_root), tmp_path / "tkg.duckdb"
    first = publish(store, target, raw_tables())
    assert not first.incremental and first.summary() == "fresh"
    # one partition is gone (every stage's file of it), another's statements lost rows, and a
    # global step rewrote its file with the same rows
    for stage_folder in (store_root / "parquet").iterdir():
        shutil.rmtree(stage_folder / "company=QNTX" / "quarter=2024-10-01", ignore_errors=True)
    statements = store_root / "parquet" / "statements" / "company=HLIO" / "quarter=2024-04-01" / "statements.parquet"
    table = pq.read_table(statements)
    pq.write_table(table.slice(0, table.num_rows // 2), statements)
    relevance = store_root / "parquet" / "fact_relevance" / "fact_relevance.parquet"
    pq.write_table(pq.read_table(relevance), relevance)

    updated = publish(store, target, raw_tables())
    assert updated.incremental
    assert updated.tables["statements"] == "2 partition(s) replaced"
    assert updated.tables["events"] == "1 partition(s) replaced"
    assert updated.tables["fact_relevance"] == "reloaded" and updated.tables["canonical_entities"] == "kept"
    fresh = publish(store, tmp_path / "fresh.duckdb", raw_tables())
    assert published_rows(target) == published_rows(fresh.path)
    assert published_rows(target)["raw.statements"][0] == first.raw_rows["statements"] - updated_loss(sample_home, table)


def updated_loss(sample_home, halved) -> int:
    """Statements the change above removed: QNTX's last quarter whole, and half of one HLIO quarter."""
    gone = pq.read_table(sample_home / "parquet" / "statements" / "company=QNTX" / "quarter=2024-10-01" / "statements.parquet")
    return gone.num_rows + halved.num_rows - halved.num_rows // 2


def test_a_file_of_other_models_or_a_failed_check_is_never_updated_in_place(sample_home, tmp_path):
    store, target = ParquetStore(sample_home), tmp_path / "tkg.duckdb"
    publish(store, target, raw_tables())
    officers = model("officers")
    other_models = [replace(m, sql=m.sql + "\n") if m.name == "officers" else m for m in load_models()]
    assert other_models != load_models() and officers.sha256 != other_models[[m.name for m in other_models].index("officers")].sha256
    assert not publish(store, target, raw_tables(), models=other_models).incremental
    assert publish(store, target, raw_tables(), models=other_models).incremental
    before = target.read_bytes()

    def refuse(connection):
        raise RuntimeError("a blocking check failed")

    with pytest.raises(RuntimeError, match="blocking check"):
        publish(store, target, raw_tables(), models=other_models, check=refuse)
    assert target.read_bytes() == before, "the last good file stays as it was"
    assert not list(tmp_path.glob(".tkg.duckdb.*")), "no temporary files are left behind"


def test_a_table_loaded_in_pieces_equals_one_loaded_at_once_row_for_row(sample_home, tmp_path, monkeypatch):
    """Raw tables are loaded a few MB of Parquet per statement (one statement over every
    transcript of 5M events held them all in memory); cut down to one file per statement, the
    published file has the same rows, and each table keeps the order of its files."""
    from tkg.store import warehouse

    store = ParquetStore(sample_home)
    whole = publish(store, tmp_path / "whole.duckdb", raw_tables())
    monkeypatch.setattr(warehouse, "LOAD_PIECE_BYTES", 1)
    pieces = publish(store, tmp_path / "pieces.duckdb", raw_tables())
    assert pieces.raw_rows == whole.raw_rows and whole.raw_rows["statements"] > 0
    assert published_rows(pieces.path) == published_rows(whole.path)
    in_order = "SELECT statement_id FROM raw.statements"
    with duckdb.connect(str(whole.path), read_only=True) as a, duckdb.connect(str(pieces.path), read_only=True) as b:
        assert a.execute(in_order).fetchall() == b.execute(in_order).fetchall()
        assert a.execute("SELECT triplet_id FROM facts").fetchall() == b.execute("SELECT triplet_id FROM facts").fetchall()
