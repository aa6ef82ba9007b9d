"""The Definitions object loads, and every asset carries what the UI shows."""

from __future__ import annotations

import importlib
import os
import shutil

import dagster as dg
import pytest
import yaml

from tests.conftest import ROOT
from tkg.build import catalog
from tkg.core.paths import sql_dir
from tkg.store.checks import CHECKS
from tkg.store.warehouse import load_models
from tkg_assets.assets.warehouse import _model_spec
from tkg_assets.definitions import defs

PIPELINE = ["transcripts", "chunks", "statements", "temporal_events", "triplets", "entities",
            "canonical_entities", "fact_blocks", "candidate_ranks", "candidate_selection", "judged_pairs",
            "invalidated_events", "fact_relevance", "warehouse"]


def test_the_workspace_module_loads_with_its_jobs_schedule_and_sensor():
    """What `dagster dev -w workspace.yaml` loads: one Definitions that validates, whose jobs
    split the graph into the partitioned stages and the global refresh, with the weekly
    schedule and the automation sensor wired to them and every resource they use."""
    location = yaml.safe_load((ROOT / "workspace.yaml").read_text())["load_from"][0]["python_module"]
    loaded = importlib.import_module(location["module_name"]).defs
    assert loaded is defs
    dg.Definitions.validate_loadable(loaded)
    graph = loaded.resolve_asset_graph()
    everything = {key.to_user_string() for key in graph.get_all_asset_keys()}
    by_company = {key for key in everything
                  if isinstance(graph.get(dg.AssetKey.from_user_string(key)).partitions_def, dg.MultiPartitionsDefinition)}
    sharded = {stage.name for stage in catalog.GLOBAL if stage.sharded}
    after_partitions = everything - by_company

    def selected(job: str) -> set[str]:
        return {key.to_user_string() for key in loaded.resolve_job_def(job).asset_layer.executable_asset_keys}

    assert {"transcripts", "statements", "triplets"} <= by_company and {"warehouse", "sql/facts"} <= after_partitions
    assert sharded == {"candidate_ranks", "judged_pairs"} and all(graph.get(dg.AssetKey(name)).is_partitioned for name in sharded)
    assert selected("ingest_partition") == by_company
    assert selected("publish_graph") == {"warehouse"} | {key for key in everything if key.startswith("sql/")}
    assert {"build_partitions", "refresh_graph", "refresh_and_publish"} <= {job.name for job in loaded.resolve_all_job_defs()}
    assert loaded.resolve_schedule_def("weekly_new_transcripts").job_name == "build_partitions"
    assert loaded.resolve_sensor_def("tkg_automation").job_name == "refresh_and_publish"
    assert not [key for key in after_partitions if graph.get(dg.AssetKey.from_user_string(key)).automation_condition], \
        "the global half refreshes in one run of the sensor's, not asset by asset"
    assert set(loaded.resources) == {"storage", "source", "extraction", "progress"}
    checks = loaded.resolve_assets_def("warehouse").check_specs
    assert {spec.name: spec.blocking for spec in checks} == {check.name: check.blocking for check in CHECKS}


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
    assert parents("fact_blocks") == {"temporal_events", "triplets", "canonical_entities"}
    # the participants lists (chunks) with their canonical people and offices end positions (issue 26)
    assert parents("invalidated_events") == {"judged_pairs", "figures", "temporal_events", "chunks", "triplets",
                                             "canonical_entities"}
    assert parents("judged_pairs") == {"fact_blocks", "candidate_selection"}
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
    from tkg.core.partitions import last_quarter, quarter_start
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


def test_a_sql_model_code_version_changes_with_its_own_sql_only(tmp_path):
    """Editing sql/facts.sql marks sql/facts changed in the UI (a new code version); the models
    that read it keep theirs (Dagster reaches them through lineage), and a file touched without
    a change, moved to another folder or joined by a non-SQL file changes nothing."""
    graph = defs.resolve_asset_graph()
    published = {model.name: graph.get(dg.AssetKey(["sql", model.name])).code_version for model in load_models()}
    copy = tmp_path / "sql"
    shutil.copytree(sql_dir(), copy)
    (copy / "NOTES.md").write_text("not a model\n")
    os.utime(copy / "facts.sql", (0, 0))

    def versions() -> dict[str, str]:
        return {model.name: _model_spec(model).code_version for model in load_models(copy)}

    assert versions() == published
    facts = copy / "facts.sql"
    facts.write_text(facts.read_text().replace("WHERE r.archive_reason IS NULL", "WHERE r.archive_reason IS NULL AND t.value IS NOT NULL"))
    edited = versions()
    assert edited["facts"] != published["facts"]
    assert {name: version for name, version in edited.items() if name != "facts"} == {
        name: version for name, version in published.items() if name != "facts"}
    readers_of_facts = {model.name for model in load_models(copy) if "facts" in model.depends_on}
    assert {"officers", "facts_as_of"} <= readers_of_facts  # kept their versions above


def test_the_executor_follows_tkg_executor(monkeypatch):
    from tkg_assets.definitions import executor_from_env

    monkeypatch.delenv("TKG_EXECUTOR", raising=False)
    assert executor_from_env() is dg.in_process_executor  # one step per run: no subprocess per step
    monkeypatch.setenv("TKG_EXECUTOR", "multiprocess")
    assert executor_from_env() is dg.multiprocess_executor
    monkeypatch.setenv("TKG_EXECUTOR", "threads")
    with pytest.raises(ValueError, match="'in_process'"):
        executor_from_env()
