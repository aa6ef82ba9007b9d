"""Declarative automation: the global assets refresh once a partition has fully landed, in one
request, and the weekly schedule asks only for partitions not yet ingested."""

from __future__ import annotations

from datetime import date

import dagster as dg

from tests.conftest import offline_runtime
from tkg.build.catalog import GLOBAL, PARTITIONED_NAMES, stage
from tkg.ingest.sources import load_source
from tkg_assets.automation import stale_partition_requests
from tkg_assets.definitions import defs
from tkg_assets.partitions import partition_key

PARTITION_STEPS = list(PARTITIONED_NAMES)


def _requested(result) -> set[str]:
    return {r.key.to_user_string() for r in result.results if r.true_subset.size}


def _materialise(instance, result) -> None:
    """Record what a tick requested as materialised (each shard of a shard step on its own)."""
    for requested in result.results:
        if not requested.true_subset.size:
            continue
        if requested.true_subset.is_partitioned:
            for key in requested.true_subset.expensively_compute_partition_keys():
                instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=requested.key, partition=key))
        else:
            instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=requested.key))


def test_global_assets_wait_for_the_whole_partition_then_refresh_as_one_chain_and_publish_once():
    key = str(partition_key("HLIO", date(2024, 7, 1)))
    global_steps = [stage.name for stage in GLOBAL]
    with dg.instance_for_test() as instance:
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert _requested(result) == set()
        for asset in PARTITION_STEPS[:2]:
            instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=asset, partition=key))
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
        assert _requested(result) == set(), "nothing global may run on a half-ingested partition"
        for asset in PARTITION_STEPS[2:]:
            instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=asset, partition=key))
        # the global steps refresh tick by tick in lineage order (a shard step cannot share a run
        # with the unpartitioned step it reads), every shard of a shard step at once
        ticks = []
        while "warehouse" not in (requested := _requested(result := dg.evaluate_automation_conditions(
                defs=defs, instance=instance, cursor=result.cursor))):
            assert requested, f"the chain stopped after {ticks}"
            ticks.append(requested)
            _materialise(instance, result)
        assert sorted(step for tick in ticks for step in tick) == sorted(global_steps)  # each once
        done = set()
        for tick in ticks:  # every step after the global steps it reads, or in the same run
            assert all(set(stage(step).inputs) & set(global_steps) <= done | tick for step in tick), (tick, done)
            done |= tick
        assert {"sql/facts", "sql/facts_as_of"} <= requested  # the models refresh in the warehouse's run
        assert not set(global_steps) & requested
        # published once, at the end of the chain: nothing global or the warehouse asks again
        _materialise(instance, result)
        for _ in range(3):
            result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
            assert not ({"warehouse", *global_steps} & _requested(result)), _requested(result)
            _materialise(instance, result)


def test_schedule_requests_only_what_is_stale(tmp_path):
    from tkg.build.plan import plan_build
    from tkg.build.stages import build_partition

    source = load_source("sample")
    runtime = offline_runtime(tmp_path)
    store = runtime.store
    built = [("HLIO", date(2024, 1, 1)), ("QNTX", date(2024, 1, 1))]
    for partition in built:
        build_partition(runtime, partition, {"transcripts"}, source.rows_for(*partition))

    def requests(code_versions):
        plan = plan_build(store, source, source.partitions(), code_versions)
        return {str(r.partition_key): sorted(k.to_user_string() for k in r.asset_selection) for r in stale_partition_requests(plan)}

    fresh = requests(runtime.code_versions)
    assert len(fresh) == 6 and not {str(partition_key(*p)) for p in built} & set(fresh)
    assert list(fresh)[0].endswith("2024-04-01")  # oldest first
    assert all(stages == sorted(PARTITION_STEPS) for stages in fresh.values())
    # a new triplet prompt: every partition again, but only triplets and what reads them
    changed = requests({**runtime.code_versions, "triplets": "another-prompt"})
    assert changed[str(partition_key(*built[0]))] == ["entities", "triplets"]


def test_invalidation_is_never_requested_before_canonical_entities_exists():
    """Issue 17: after a first backfill, automation requested invalidated_events on its own while
    canonical_entities (held back) had never been materialised, and that run failed."""
    key = str(partition_key("HLIO", date(2024, 7, 1)))
    without_resolution = dg.AssetSelection.groups("resolution", "invalidation", "retention", "warehouse", "sql_models") - \
        dg.AssetSelection.assets("canonical_entities")
    with dg.instance_for_test() as instance:
        for asset in PARTITION_STEPS:
            instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=asset, partition=key))
        # canonical_entities cannot be requested (as when its inputs are still in progress)
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, asset_selection=without_resolution)
        requested = _requested(result)
        assert not {"fact_blocks", "invalidated_events", "warehouse"} & requested, requested
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key="canonical_entities"))
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, asset_selection=without_resolution,
                                                   cursor=result.cursor)
        assert "fact_blocks" in _requested(result)  # the invalidation chain starts
