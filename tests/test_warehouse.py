"""The published DuckDB file: atomic swap under readers, the SQL surface, bi-temporal queries."""

from __future__ import annotations

import duckdb
import pytest

from tkg.build import build_graph, partitions_of
from tkg.embeddings import WordLlamaEmbedder
from tkg.extraction.offline import OfflineExtractor
from tkg.invalidation import RuleJudge
from tkg.sources import load_source
from tkg.stages import Components
from tkg.store import ParquetStore
from tkg.warehouse import applied_sha256, describe_model, load_models, model, publish, reapply_model

SURFACE = {"transcripts", "chunks", "statements", "events", "triplets", "entities", "facts", "canonical_entities",
           "entity_aliases", "invalidation_judgments", "officers"}


@pytest.fixture(scope="module")
def sample_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("sample")
    source = load_source("sample")
    build_graph(ParquetStore(home), source, partitions_of(source), Components(OfflineExtractor(), WordLlamaEmbedder()),
                RuleJudge(), home / "tkg.duckdb")
    return home


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


def test_publish_swaps_atomically_under_a_reader(sample_home, tmp_path):
    target = tmp_path / "tkg.duckdb"
    store = ParquetStore(sample_home)
    publish(store, target)
    reader = duckdb.connect(str(target), read_only=True)
    try:
        before = reader.execute("SELECT count(*) FROM facts").fetchone()[0]
        publish(store, target)  # a reader holds the old file open: the publish must neither block nor fail
        assert reader.execute("SELECT count(*) FROM facts").fetchone()[0] == before  # still its snapshot
    finally:
        reader.close()
    with duckdb.connect(str(target), read_only=True) as fresh:
        assert fresh.execute("SELECT count(*) FROM facts").fetchone()[0] == before
    assert not list(tmp_path.glob(".tkg.duckdb.*")), "no temporary files are left behind"


def test_changed_model_is_reapplied(sample_home, tmp_path):
    target = tmp_path / "tkg.duckdb"
    publish(ParquetStore(sample_home), target)
    officers = model("officers")
    assert applied_sha256(target, officers) == officers.sha256
    edited = officers.__class__(**{**officers.__dict__, "sql": officers.sql.replace("WHERE predicate", "WHERE true AND predicate")})
    assert applied_sha256(target, edited) != edited.sha256
    reapply_model(target, edited)
    assert applied_sha256(target, edited) == edited.sha256
    assert describe_model(target, edited).row_count == describe_model(target, officers).row_count > 0


def test_models_are_ordered_by_their_dependencies():
    names = [m.name for m in load_models()]
    assert names.index("events") < names.index("facts") < names.index("facts_as_of")
    assert names.index("canonical_entities") < names.index("entity_aliases")
