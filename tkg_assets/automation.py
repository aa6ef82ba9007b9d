"""Schedules, sensors and automation conditions."""


import dagster as dg

# Global assets sit behind an all-partitions dependency: plain eager() would never fire while
# any company x quarter partition is missing, which is normal (quarters not yet reported).
CANONICAL_AUTOMATION = dg.AutomationCondition.eager().without(~dg.AutomationCondition.any_deps_missing())
# Invalidation also reads canonical_entities, a global input: it waits until that exists and is
# not being materialised (a first backfill would otherwise request it alone, and fail).
INVALIDATION_AUTOMATION = (
    CANONICAL_AUTOMATION & ~dg.AutomationCondition.any_deps_missing().allow(dg.AssetSelection.assets("canonical_entities"))
).with_label("eager, once canonical_entities exists")


def stale_partition_requests(plan) -> list[dg.RunRequest]:
    """One run per stale partition (a `tkg.build.plan.BuildPlan`), oldest first, materialising only the
    stages that are out of date. The run key carries the partition's reason and stages, so a
    tick repeats no request while the same work is pending, and a new change asks again."""
    from tkg_assets.partitions import partition_key

    requests = []
    for work in plan.work:
        key = partition_key(*work.partition)
        stages = sorted(work.stages)
        requests.append(dg.RunRequest(partition_key=key, asset_selection=[dg.AssetKey(stage) for stage in stages],
                                      run_key=f"build:{key}:{'+'.join(stages)}:{work.reason}",
                                      tags={"tkg/reason": work.reason[:200]}))
    return requests


def refresh_after(selection: dg.AssetSelection, label: str) -> dg.AutomationCondition:
    """Eager, but only on updates of `selection`: an asset whose lineage names many upstream
    assets waits for the ones it actually reads, and never runs while any dependency is running."""
    return (
        dg.AutomationCondition.any_deps_updated().allow(selection)
        & ~dg.AutomationCondition.any_deps_missing().allow(selection)
        & ~dg.AutomationCondition.any_deps_in_progress()
        & ~dg.AutomationCondition.in_progress()
    ).with_label(label)


# The warehouse publishes once resolution and invalidation have caught up, not after every
# partition step; SQL models refresh when the warehouse (or a model they select from) does.
WAREHOUSE_AUTOMATION = refresh_after(dg.AssetSelection.groups("resolution", "retention"),
                                     "after resolution, invalidation and retention")
SQL_MODEL_AUTOMATION = refresh_after(dg.AssetSelection.groups("warehouse", "sql_models"), "after the warehouse publishes")
