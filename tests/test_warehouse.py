"""The published DuckDB file: atomic swap under readers, the SQL surface, bi-temporal queries."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from dataclasses import replace

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tkg.answer.pictures import subgraph_rows
from tkg.answer.query import EntityMatch, Graph
from tkg.build.catalog import raw_tables
from tkg.core import tables
from tkg.core.versions import Stamp, stamp_of_schema, stamped
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
    # what each part took: the copy of the last file (a fresh file has none), every table and model
    parts = {"copy", "checkpoint", *(f"raw.{raw.name}" for raw in raw_tables()), *(f"model.{m.name}" for m in load_models())}
    assert set(updated.seconds) == parts and set(first.seconds) == parts - {"copy"}
    assert all(seconds >= 0 for seconds in updated.seconds.values()) and updated.seconds["model.facts"] > 0
    # facts: kept, with the rows of the gone partition's events deleted in place (the other
    # changes are not in it: statements are not read, the relevance file holds the same rows)
    gone_events = pq.read_table(sample_home / "parquet" / "temporal_events" / "company=QNTX" / "quarter=2024-10-01"
                                / "temporal_events.parquet").num_rows
    in_place = re.fullmatch(r"([\d,]+) event\(s\) replaced \(([\d,]+) row\(s\) deleted, 0 inserted\), 0 relevance\(s\) updated",
                            updated.in_place["facts"])
    assert in_place and int(in_place[1]) == gone_events > 0 and int(in_place[2].replace(",", "")) > 0
    assert updated.summary().endswith("; facts updated in place") and first.in_place == {}
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
    """Raw tables are loaded a bounded amount of Parquet per statement (one statement over every
    transcript of 5M events held them all in memory); cut down to one file per statement, the
    published file has the same rows, and each table keeps the order of its files."""
    from tkg.store import warehouse

    store = ParquetStore(sample_home)
    whole = publish(store, tmp_path / "whole.duckdb", raw_tables())
    monkeypatch.setattr(warehouse, "LOAD_PIECE_BYTES", 1)
    monkeypatch.setattr(warehouse, "NARROW_PIECE_BYTES", 1)
    pieces = publish(store, tmp_path / "pieces.duckdb", raw_tables())
    assert pieces.raw_rows == whole.raw_rows and whole.raw_rows["statements"] > 0
    assert published_rows(pieces.path) == published_rows(whole.path)
    in_order = "SELECT statement_id FROM raw.statements"
    with duckdb.connect(str(whole.path), read_only=True) as a, duckdb.connect(str(pieces.path), read_only=True) as b:
        assert a.execute(in_order).fetchall() == b.execute(in_order).fetchall()
        assert a.execute("SELECT triplet_id FROM facts").fetchall() == b.execute("SELECT triplet_id FROM facts").fetchall()


def test_wide_rows_are_loaded_in_small_pieces_and_narrow_rows_in_big_ones(sample_home, monkeypatch):
    """A table whose row group (ROW_GROUP_ROWS) of rows would take more Parquet than
    WIDE_ROW_GROUP_BYTES is loaded LOAD_PIECE_BYTES at a time, so its unfinished row group stays
    small; the others NARROW_PIECE_BYTES at a time, so few statements append to a part-full row
    group. The sample's transcripts are whole calls and its statements a sentence each."""
    from tkg.store import warehouse

    monkeypatch.setattr(warehouse, "LOAD_PIECE_BYTES", 1)  # small as the sample is, past one piece
    store = ParquetStore(sample_home)

    def files(asset: str) -> dict:
        return {path: path.stat().st_size for path in sorted((sample_home / "parquet" / asset).glob(f"company=*/quarter=*/{asset}.parquet"))}

    transcripts, statements = files("transcripts"), files("statements")
    assert len(transcripts) > 1 and len(statements) > 1
    assert warehouse.piece_bytes(store, transcripts) == 1
    assert warehouse.piece_bytes(store, statements) == warehouse.NARROW_PIECE_BYTES
    # the same rows made wide enough: a row group of them past the bound
    monkeypatch.setattr(warehouse, "ROW_GROUP_ROWS", warehouse.WIDE_ROW_GROUP_BYTES)
    assert warehouse.piece_bytes(store, statements) == 1


def test_a_table_with_changes_applies_them_to_the_version_loaded_and_reloads_otherwise(sample_home, tmp_path):
    """The judgments are published by applying their changes since the version loaded last (a
    gone row deleted by all of its columns, a new one inserted); changes since another version,
    or ones that would delete a row twice over, reload the table instead. Every way, the rows
    equal a fresh publish's."""
    store_root = tmp_path / "store"
    shutil.copytree(sample_home / "parquet", store_root / "parquet")
    store, target = ParquetStore(store_root), tmp_path / "tkg.duckdb"
    folder = store_root / "parquet" / "invalidated_events"
    judgments = pq.read_table(folder / "invalidation_judgments.parquet")
    loaded = stamp_of_schema(judgments.schema)
    assert publish(store, target, raw_tables()).tables["invalidation_judgments"] == "loaded"
    rows = judgments.replace_schema_metadata(None)
    assert rows.num_rows >= 4

    def rewrite(new_rows: pa.Table, gone: pa.Table, added: pa.Table, since: str, number: int) -> None:
        stamp = Stamp("invalidated_events", loaded.code_version, {**loaded.inputs, "test": str(number)})
        pq.write_table(stamped(new_rows, stamp), folder / "invalidation_judgments.parquet")
        changes = pa.concat_tables([
            pa.table({"since_version": [since], "gone": pa.nulls(1, pa.bool_()),
                      **{name: pa.nulls(1, field.type) for name, field in zip(rows.schema.names, rows.schema)}}),
            *(part.add_column(0, "since_version", pa.array([since] * part.num_rows, pa.string()))
              .add_column(1, "gone", pa.array([flag] * part.num_rows, pa.bool_())) for part, flag in ((gone, True), (added, False)))])
        pq.write_table(stamped(changes.cast(tables.JUDGMENT_CHANGES), stamp), folder / "judgment_changes.parquet")

    def published_judgments() -> list[tuple]:
        with duckdb.connect(str(target), read_only=True) as connection:
            return sorted(connection.execute("SELECT * FROM raw.invalidation_judgments").fetchall(), key=repr)

    def version() -> str:
        return stamp_of_schema(pq.read_schema(folder / "invalidation_judgments.parquet")).version

    def as_rows(table: pa.Table) -> list[tuple]:
        return sorted((tuple(row.values()) for row in table.to_pylist()), key=repr)

    # two rows judged again (a new reason), one gone, one new
    again = rows.slice(0, 2).set_column(3, "reason", pa.array(["judged again"] * 2))
    added = rows.slice(0, 1).set_column(1, "secondary_event_id", pa.array(["e-new"]))
    new = pa.concat_tables([rows.slice(3), again, added])
    rewrite(new, rows.slice(0, 3), pa.concat_tables([again, added]), loaded.version, 1)
    updated = publish(store, target, raw_tables())
    assert updated.tables["invalidation_judgments"] == "3 row(s) deleted, 3 inserted"
    assert published_judgments() == as_rows(new)
    assert published_rows(target) == published_rows(publish(store, tmp_path / "fresh.duckdb", raw_tables()).path)

    # changes since a version the table was not loaded from: reloaded
    rewrite(rows, new.slice(0, 1), rows.slice(0, 0), "another version", 2)
    assert publish(store, target, raw_tables()).tables["invalidation_judgments"] == "reloaded"
    assert published_judgments() == as_rows(rows)

    # a row stated twice, then once: deleting the gone copy by its columns would delete both,
    # so the table is reloaded
    twice = pa.concat_tables([rows, rows.slice(0, 1)])
    rewrite(twice, rows.slice(0, 0), rows.slice(0, 1), version(), 3)
    assert publish(store, target, raw_tables()).tables["invalidation_judgments"] == "0 row(s) deleted, 1 inserted"
    assert published_judgments() == as_rows(twice)
    rewrite(rows, rows.slice(0, 1), rows.slice(0, 0), version(), 4)
    assert publish(store, target, raw_tables()).tables["invalidation_judgments"] == "reloaded"
    assert published_judgments() == as_rows(rows)
    assert published_rows(target) == published_rows(publish(store, tmp_path / "fresh2.duckdb", raw_tables()).path)


def test_the_views_over_facts_do_not_depend_on_the_order_its_rows_are_stored_in(sample_home, tmp_path):
    """A publish that updates `facts` in place appends the rows it replaces, so its rows are
    stored in an order that depends on the build's history: every view over it gives the same
    rows in any order. Here every role fact is restated by a second event at the same moment of
    the same call, retired by another statement at the same time: which restatement comes first
    or last, and which ending, is told by time and then by id, never by where a row is stored."""
    target = tmp_path / "tkg.duckdb"
    publish(ParquetStore(sample_home), target, raw_tables())
    tied = ("SELECT * REPLACE (event_id || '-again' AS event_id, triplet_id || '-again' AS triplet_id, "
            "'a restatement at the same moment' AS statement, invalidated_by || '-again' AS invalidated_by) "
            "FROM facts WHERE predicate = 'HOLDS_ROLE'")
    # and one stating another title at the same moment: which value a pair of entities last
    # stated is told by time, then by triplet
    retitled = ("SELECT * REPLACE (event_id || '-retitled' AS event_id, triplet_id || '-retitled' AS triplet_id, "
                "value || ' (acting)' AS value) FROM facts WHERE predicate = 'HOLDS_ROLE' AND value IS NOT NULL")
    with duckdb.connect(str(target)) as connection:
        assert connection.execute(f"SELECT count(*), count(invalidated_by) FROM ({tied})").fetchall()[0] > (10, 0)
        people = [row[0] for row in connection.execute(f"SELECT DISTINCT subject_id FROM ({retitled}) ORDER BY 1").fetchall()]
        assert people
        connection.execute(f"INSERT INTO facts {tied} UNION ALL {retitled}")
    orders = []
    for order in ("triplet_id", "triplet_id DESC"):
        with duckdb.connect(str(target)) as connection:
            connection.execute(f"CREATE OR REPLACE TABLE facts AS SELECT * FROM facts ORDER BY {order}")
        with Graph.open(target) as graph:
            orders.append({**{name: graph.connection.execute(f"SELECT * FROM {name} ORDER BY ALL").fetchall()
                              for name in ("fact_history", "officer_tenures", "officers")},
                           **{person: subgraph_rows(graph, EntityMatch(person, person, "PERSON", person, "id", 100.0, 1))
                              for person in people}})
    assert orders[0] == orders[1] and orders[0]["officer_tenures"]
