"""The Definitions object loads, and every asset carries what the UI shows."""

from __future__ import annotations

import dagster as dg

from tkg.warehouse import load_models
from tkg_assets.definitions import defs

PIPELINE = ["transcripts", "chunks", "statements", "temporal_events", "triplets", "entities",
            "canonical_entities", "invalidated_events", "warehouse"]


def test_definitions_load():
    dg.Definitions.validate_loadable(defs)


def test_every_stage_and_sql_model_is_an_asset_with_metadata():
    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    models = {f"sql/{model.name}" for model in load_models()}
    assert set(PIPELINE) | models <= keys
    assert {"sql/facts", "sql/facts_as_of", "sql/events", "sql/entity_aliases"} <= models
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert node.group_name and node.kinds and node.owners and node.code_version, key
        assert node.description, key


def test_partitioned_chain_and_lineage():
    graph = defs.resolve_asset_graph()
    parents = lambda name: {k.to_user_string() for k in graph.get(dg.AssetKey.from_user_string(name)).parent_keys}
    assert parents("chunks") == {"transcripts"}
    assert parents("temporal_events") == {"transcripts", "statements"}
    assert parents("invalidated_events") >= {"temporal_events", "triplets", "canonical_entities"}
    # dbt-style: a model depends on the models it selects from, and on the warehouse.
    assert parents("sql/facts") >= {"sql/events", "sql/triplets", "sql/transcripts", "warehouse"}
    assert parents("sql/events") == {"warehouse"}
    assert parents("warehouse") >= {"temporal_events", "invalidated_events", "canonical_entities"}
    partitioned = graph.get(dg.AssetKey("statements")).partitions_def
    assert isinstance(partitioned, dg.MultiPartitionsDefinition)
    assert "HLIO|2024-07-01" in partitioned.get_partition_keys()


def test_the_partition_space_follows_the_source():
    from datetime import date

    from tests.conftest import CORPUS
    from tkg.partitions import last_quarter, quarter_start
    from tkg_assets.partitions import partition_space

    quarters_since = lambda first: (last_quarter().year - first.year) * 4 + (last_quarter().month - first.month) // 3 + 1
    sample = partition_space("sample")
    # the sample's two companies from their first call (Q1 2024), not every company since 2016
    assert sample.get_num_partitions() == 2 * quarters_since(date(2024, 1, 1))
    assert {key.split("|")[0] for key in sample.get_partition_keys()} == {"HLIO", "QNTX"}
    if CORPUS.exists():
        corpus = partition_space(str(CORPUS))
        assert {key.split("|")[0] for key in corpus.get_partition_keys()} == {
            "AAPL", "AMD", "AMZN", "ASML", "CSCO", "GOOGL", "INTC", "MSFT", "MU", "NVDA"}
        assert min(key.split("|")[1] for key in corpus.get_partition_keys()) == quarter_start(date(2016, 1, 1)).isoformat()


def test_sql_model_code_version_is_the_hash_of_its_sql():
    graph = defs.resolve_asset_graph()
    for model in load_models():
        assert graph.get(dg.AssetKey(["sql", model.name])).code_version == model.sha256[:16]
