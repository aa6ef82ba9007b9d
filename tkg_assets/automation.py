"""Schedules, sensors and automation conditions."""


import dagster as dg

from tkg.build.catalog import GLOBAL, Stage
from tkg_assets.partitions import partition_key

# Global assets sit behind an all-partitions dependency: plain eager() would never fire while
# any company x quarter partition is missing, which is normal (quarters not yet reported).
GLOBAL_AUTOMATION = dg.AutomationCondition.eager().without(~dg.AutomationCondition.any_deps_missing())


def global_automation(stage: Stage) -> dg.AutomationCondition:
    """Eager over all partitions; a global stage that also reads other global stages waits
    until they exist and are not being materialised (a first backfill would otherwise request
    it alone, and fail)."""
    upstream = [name for name in stage.inputs if name in {other.name for other in GLOBAL}]
    if not upstream:
        return GLOBAL_AUTOMATION
    return (GLOBAL_AUTOMATION & ~dg.AutomationCondition.any_deps_missing().allow(dg.AssetSelection.assets(*upstream))
            ).with_label(f"eager, once {' and '.join(upstream)} exist{'s' if len(upstream) == 1 else ''}")


def stale_partition_requests(plan) -> list[dg.RunRequest]:
    """One run per stale partition (a `tkg.build.plan.BuildPlan`), oldest first, materialising only the
    stages that are out of date. The run key carries the partition's reason and stages, so a
    tick repeats no request while the same work is pending, and a new change asks again."""
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
# partition step. The global stages refresh as a chain over several ticks (a shard step cannot
# share a run with the unpartitioned step before it), so the warehouse also waits while the
# same tick requests any of them: one publish per chain, at its end, never a half-refreshed graph.
# SQL models refresh when the warehouse (or a model they select from) does.
WAREHOUSE_AUTOMATION = (
    refresh_after(dg.AssetSelection.assets(*(stage.name for stage in GLOBAL)), "")
    & ~dg.AutomationCondition.any_deps_match(dg.AutomationCondition.will_be_requested())
).with_label("after the global stages (resolution, invalidation, retention) have all caught up")
SQL_MODEL_AUTOMATION = refresh_after(dg.AssetSelection.groups("warehouse", "sql_models"), "after the warehouse publishes")
