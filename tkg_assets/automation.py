"""Schedules, sensors and automation conditions."""


import dagster as dg

# Global assets sit behind an all-partitions dependency: plain eager() would never fire while
# any company x quarter partition is missing, which is normal (quarters not yet reported).
GLOBAL_AUTOMATION = dg.AutomationCondition.eager().without(~dg.AutomationCondition.any_deps_missing())


def new_transcripts_requests(loaded_rows, materialized: set[str]) -> list[dg.RunRequest]:
    """One run per company x quarter that has a transcript in the source but no `transcripts`
    materialisation yet, oldest first."""
    from tkg.sources import quarter_start
    from tkg_assets.partitions import partition_key

    wanted = sorted({(row.company, quarter_start(row.call_date)) for row in loaded_rows}, key=lambda k: (k[1], k[0]))
    requests = []
    for company, quarter in wanted:
        key = partition_key(company, quarter)
        if str(key) not in materialized:
            requests.append(dg.RunRequest(partition_key=key, run_key=f"ingest:{key}"))
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
WAREHOUSE_AUTOMATION = refresh_after(dg.AssetSelection.groups("resolution"), "after resolution and invalidation")
SQL_MODEL_AUTOMATION = refresh_after(dg.AssetSelection.groups("warehouse", "sql_models"), "after the warehouse publishes")
