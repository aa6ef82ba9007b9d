"""Schedules, sensors and automation conditions."""


import dagster as dg

# Global assets sit behind an all-partitions dependency: plain eager() would never fire while
# any company x quarter partition is missing, which is normal (quarters not yet reported).
GLOBAL_AUTOMATION = dg.AutomationCondition.eager().without(~dg.AutomationCondition.any_deps_missing())


def new_transcripts_requests(loaded_rows, materialized: set[str]) -> list[dg.RunRequest]:
    """One run per company x quarter that has a transcript in the source but no `transcripts`
    materialisation yet, oldest first."""
    from tkg_assets.partitions import partition_key
    from tkg.sources import quarter_start

    wanted = sorted({(row.company, quarter_start(row.call_date)) for row in loaded_rows}, key=lambda k: (k[1], k[0]))
    requests = []
    for company, quarter in wanted:
        key = partition_key(company, quarter)
        if str(key) not in materialized:
            requests.append(dg.RunRequest(partition_key=key, run_key=f"ingest:{key}"))
    return requests
