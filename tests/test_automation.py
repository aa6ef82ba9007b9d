"""Declarative automation: the global assets refresh once a partition has fully landed, in one
request, and the weekly schedule asks only for partitions not yet ingested."""

from __future__ import annotations

from datetime import date

import dagster as dg

from tkg.sources import load_source
from tkg_assets.automation import new_transcripts_requests
from tkg_assets.definitions import defs
from tkg_assets.partitions import partition_key

PARTITION_STEPS = ["transcripts", "chunks", "statements", "temporal_events", "triplets", "entities"]


def _requested(result) -> set[str]:
    return {r.key.to_user_string() for r in result.results if r.true_subset.size}


def test_global_assets_wait_for_the_whole_partition_then_refresh_together():
    key = str(partition_key("HLIO", date(2024, 7, 1)))
    with dg.instance_for_test() as instance:
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert _requested(result) == set()
        for asset in PARTITION_STEPS[:2]:
            instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=asset, partition=key))
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
        assert _requested(result) == set(), "nothing global may run on a half-ingested partition"
        for asset in PARTITION_STEPS[2:]:
            instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=asset, partition=key))
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
        requested = _requested(result)
        assert {"canonical_entities", "invalidated_events", "warehouse", "sql/facts", "sql/facts_as_of"} <= requested
        # nothing new happened: no second refresh
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
        assert _requested(result) == set()


def test_schedule_requests_only_missing_partitions():
    rows = load_source("sample").rows
    done = {str(partition_key("HLIO", date(2024, 1, 1))), str(partition_key("QNTX", date(2024, 1, 1)))}
    requests = new_transcripts_requests(rows, done)
    keys = [str(r.partition_key) for r in requests]
    assert len(keys) == 6 and not set(keys) & done
    assert keys[0].endswith("2024-04-01")  # oldest first
