"""Each asset materialises through Dagster for a sample partition, and the warehouse answers."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from resources.tkg import ExtractionBackend, TkgStorage, TranscriptSource
from tkg.build.catalog import PARTITIONED_NAMES
from tkg.core.paths import SAMPLE_DIR
from tkg.settings import Settings
from tkg.store.checks import CHECKS
from tkg_assets.definitions import pipeline_assets
from tkg_assets.partitions import partition_key

SHARDS = 2  # the global half's shard steps run once per shard
PARTITIONED_ASSETS, GLOBAL_ASSETS = pipeline_assets(Settings.resolve(source="sample", backend="offline", shards=SHARDS))
GLOBAL_ASSETS = GLOBAL_ASSETS[:-1]  # without the SQL models

SAMPLE_KEYS = [partition_key(company, date(2024, month, 1)) for company in ("HLIO", "QNTX") for month in (1, 4, 7, 10)]


@pytest.fixture
def resources(tmp_path):
    return {
        "storage": TkgStorage(home=str(tmp_path / "home"), shards=SHARDS),
        "source": TranscriptSource(source="sample"),
        "extraction": ExtractionBackend(backend="offline"),
    }


@pytest.fixture
def instance(tmp_path):
    (tmp_path / "instance").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "instance")) as test_instance:
        yield test_instance


def test_partitioned_assets_materialise_one_by_one(resources, instance):
    """Each stage's asset alone (the multi-asset subset to it), reading what the ones before wrote."""
    key = partition_key("HLIO", date(2024, 7, 1))
    for stage in PARTITIONED_NAMES:
        result = dg.materialize(PARTITIONED_ASSETS, selection=[stage], partition_key=key, resources=resources,
                                instance=instance)
        assert result.success, stage
        (materialization,) = result.asset_materializations_for_node("partition_stages")
        assert materialization.asset_key == dg.AssetKey(stage) and str(materialization.partition) == str(key)
        assert materialization.metadata["dagster/row_count"].value > 0, stage
        assert materialization.tags["dagster/data_version"], stage


def materialise_global_half(resources, instance) -> dg.ExecuteInProcessResult:
    """The global half as the UI runs it: each global asset in one run, each shard asset in one
    run over all its shards (as the automation sensor asks for them), in catalog order; the
    last result is the warehouse's."""
    for asset in GLOBAL_ASSETS[:-1]:
        if asset.partitions_def is None:
            result = dg.materialize(GLOBAL_ASSETS, selection=[asset], resources=resources, instance=instance)
            assert result.success, asset.key
            continue
        shards = asset.partitions_def.get_partition_keys()
        result = dg.materialize(GLOBAL_ASSETS, selection=[asset], resources=resources, instance=instance,
                                tags={"dagster/asset_partition_range_start": shards[0],
                                      "dagster/asset_partition_range_end": shards[-1]})
        assert result.success, asset.key
        # every shard recorded on its own, with its data version
        landed = result.asset_materializations_for_node(asset.op.name)
        assert sorted(str(m.partition) for m in landed) == shards, asset.key
        assert all(m.tags["dagster/data_version"] for m in landed), asset.key
    result = dg.materialize(GLOBAL_ASSETS, selection=[GLOBAL_ASSETS[-1]], resources=resources, instance=instance)
    assert result.success
    return result


def test_full_sample_graph_with_checks(resources, instance):
    for key in SAMPLE_KEYS:
        assert dg.materialize(PARTITIONED_ASSETS, partition_key=key, resources=resources, instance=instance).success, key
    result = materialise_global_half(resources, instance)
    evaluations = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert evaluations == {check.name: True for check in CHECKS}
    # what the publish did, in the UI: a first file is fresh, no table of it kept in place
    (published,) = result.asset_materializations_for_node(GLOBAL_ASSETS[-1].op.name)
    assert published.metadata["publish"].value == "fresh" and published.metadata["in_place"].value == {}

    with duckdb.connect(str(Path(resources["storage"].home) / "tkg.duckdb"), read_only=True) as connection:
        cfo = connection.execute(
            "SELECT DISTINCT person FROM officers JOIN facts_as_of(TIMESTAMP '2024-09-01') USING (event_id) "
            "WHERE officers.company = 'HLIO' AND role = 'CFO'").fetchall()
        assert cfo == [("Marcus J. Ortega",)]
        whitfield = connection.execute(
            "SELECT DISTINCT invalid_at::DATE::VARCHAR, invalidated_by IS NOT NULL FROM officers "
            "WHERE person = 'Dana Whitfield' AND role = 'CFO'").fetchall()
        assert whitfield == [("2024-07-01", True)]
        current_guidance = connection.execute(
            "SELECT DISTINCT value FROM facts WHERE object = 'Helio FY2024 revenue guidance' "
            "AND statement_type = 'FACT' AND invalid_at IS NULL").fetchall()
        assert current_guidance == [("$1.35 billion",)]


def test_missing_upstream_partition_is_a_clear_error(resources, instance):
    with pytest.raises(dg.Failure, match="materialise `transcripts` for this partition first"):
        dg.materialize(PARTITIONED_ASSETS, selection=["chunks"], partition_key=partition_key("HLIO", date(2024, 7, 1)),
                       resources=resources, instance=instance)


def test_a_partition_without_a_call_is_materialised_with_no_rows_and_stores_nothing(resources, instance, tmp_path):
    """A quarter without a call is settled: each stage asked for is materialised with no rows,
    and no file is stored for it, so the global half reads only the calls (as after tkg build).
    A later stage alone works too (nothing is read from the store), and a call taken out of the
    source takes its partition's files with it."""
    store = Settings.resolve(home=tmp_path / "home").store()

    def files(key) -> list:
        return [path for stage in PARTITIONED_NAMES for path in store.files(f"{stage}/**/*.parquet")
                if f"company={key.keys_by_dimension['company']}/quarter={key.keys_by_dimension['quarter']}/" in str(path)]

    future = partition_key("HLIO", date(2025, 1, 1))
    for selection in (["transcripts"], ["triplets"], list(PARTITIONED_NAMES)):
        result = dg.materialize(PARTITIONED_ASSETS, selection=selection, partition_key=future, resources=resources,
                                instance=instance)
        materialisations = result.asset_materializations_for_node("partition_stages")
        assert sorted(m.asset_key.to_user_string() for m in materialisations) == sorted(selection)
        assert all(m.metadata["dagster/row_count"].value == 0 and m.tags["dagster/data_version"] and "path" not in m.metadata
                   for m in materialisations)
        assert files(future) == []

    built = partition_key("HLIO", date(2024, 7, 1))
    assert dg.materialize(PARTITIONED_ASSETS, partition_key=built, resources=resources, instance=instance).success
    assert len(files(built)) == len(PARTITIONED_NAMES)
    rows = [row for row in map(json.loads, (SAMPLE_DIR / "transcripts.jsonl").read_text().splitlines())
            if not (row["company"] == "HLIO" and str(row["date"]).startswith("2024-08"))]
    (tmp_path / "source.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = dg.materialize(PARTITIONED_ASSETS, partition_key=built, instance=instance,
                            resources={**resources, "source": TranscriptSource(source=str(tmp_path / "source.jsonl"))})
    assert {m.metadata["dagster/row_count"].value for m in result.asset_materializations_for_node("partition_stages")} == {0}
    assert files(built) == []
