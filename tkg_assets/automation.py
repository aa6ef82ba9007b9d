"""Schedules and sensors: the weekly build of what changed, in batched runs, and the refresh of
the global half, in one run, once partitions have landed.

Why a sensor and not declarative automation for the global half: a shard step and the
unpartitioned step before it cannot share an asset run, so eager conditions refreshed the
chain as five runs in series, each waiting for a sensor tick and paying a run's start-up
(570 of 1,537 s of a corpus backfill). `refresh_and_publish` runs the whole chain and one
publish in one run, as `tkg build` does.
"""

import hashlib
import json
from collections.abc import Iterable
from itertools import groupby

import dagster as dg
from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus

from tkg.build.catalog import GLOBAL, PARTITIONED_NAMES, WAREHOUSE

# The jobs whose runs refresh the global half: their global materialisations are a refresh's
# output, not a reason for another one.
REFRESH_JOBS = ("refresh_graph", "refresh_and_publish")
NOT_FINISHED = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


def stale_partition_requests(plan, partitions_per_run: int, workers: int, log_level: str = "WARNING"
                             ) -> list[dg.RunRequest]:
    """Runs of `build_partitions` for the stale partitions of a `tkg.build.plan.BuildPlan`, grouped
    as a UI backfill groups them: one company's partitions per run, at most `partitions_per_run`
    of them, oldest first, each partition for the stages that are out of date. Each partition
    is recorded as it lands, and a failed one fails alone (`tkg_assets.batch.record_partitions`).
    The run key carries every partition's stages and reason, so a tick repeats no request while
    the same work is pending, and a new change asks again."""
    batches = []
    for _, works in groupby(sorted(plan.work, key=lambda work: work.partition), key=lambda work: work.partition[0]):
        works = list(works)
        batches += [works[start:start + partitions_per_run] for start in range(0, len(works), partitions_per_run)]
    requests = []
    for batch in sorted(batches, key=lambda batch: (batch[0].partition[1], batch[0].partition[0])):  # oldest first
        stages = {work.key: sorted(work.stages) for work in batch}
        reasons = {work.key: work.reason for work in batch}
        config = {"stages": stages, "reasons": reasons, "workers": max(1, min(workers, len(batch))), "log_level": log_level}
        requests.append(dg.RunRequest(
            run_key="build:" + hashlib.sha256(json.dumps([stages, reasons], sort_keys=True).encode()).hexdigest()[:24],
            run_config={"ops": {"build_stale_partitions": {"config": config}}},
            tags={"tkg/partitions": f"{batch[0].key} .. {batch[-1].key} ({len(batch)})",
                  "tkg/reason": "; ".join(sorted(set(reasons.values())))[:200]}))
    return requests


def _last_materialisations(instance: dg.DagsterInstance, names: Iterable[str]) -> dict[str, tuple[int, str]]:
    """Storage id and run id of each asset's last materialisation (of any partition)."""
    last = {}
    for record in instance.get_asset_records([dg.AssetKey(name) for name in names]):
        entry = record.asset_entry
        if entry.last_materialization_record is not None:
            last[entry.asset_key.to_user_string()] = (entry.last_materialization_record.storage_id,
                                                      entry.last_materialization_record.run_id)
    return last


def _still_requesting(backfill) -> bool:
    """Whether a backfill has runs left to ask for. An asset backfill has none once every
    partition it targets was requested (or given up, failed upstream): its runs are then
    queued or done, and the refresh need not wait for the backfill daemon's next tick (up to
    30 s) to mark it finished. A job backfill is waited for until it is done."""
    data = backfill.asset_backfill_data
    if data is None:
        return True
    return not (data.target_subset - data.requested_subset - data.failed_and_downstream_subset).is_empty


def refresh_request(instance: dg.DagsterInstance) -> dg.RunRequest | dg.SkipReason:
    """The one `refresh_and_publish` run to start, if partitions (or global steps run by hand)
    have landed since the last publish and nothing is running or waiting to: no run in
    progress or queued, no backfill with runs left to request. The run key is the newest of those
    materialisations, so each landing is refreshed once, and a refresh that failed is not
    retried until something new lands (re-execute it from the UI to retry sooner)."""
    if instance.get_runs(dg.RunsFilter(statuses=NOT_FINISHED), limit=1):
        return dg.SkipReason("runs are in progress or queued; the global half waits until they are done")
    if any(_still_requesting(backfill) for backfill in
           instance.get_backfills(filters=BulkActionsFilter(statuses=[BulkActionStatus.REQUESTED]))):
        return dg.SkipReason("a backfill is still requesting runs; the global half waits until it is done")
    last = _last_materialisations(instance, [*PARTITIONED_NAMES, *(stage.name for stage in GLOBAL), WAREHOUSE.name])
    if not any(stage in last for stage in PARTITIONED_NAMES):
        return dg.SkipReason("no partition has been materialised yet")
    published = last.pop(WAREHOUSE.name, (0, ""))[0]
    run_ids = sorted({run_id for _, run_id in last.values() if run_id})
    refreshing_runs = {run.run_id for run in instance.get_runs(dg.RunsFilter(run_ids=run_ids))
                       if run.job_name in REFRESH_JOBS} if run_ids else set()
    landed = [storage_id for name, (storage_id, run_id) in last.items()
              if name in PARTITIONED_NAMES or run_id not in refreshing_runs]
    newest = max(landed, default=0)
    if newest <= published:
        return dg.SkipReason("the published graph covers every partition that has landed")
    return dg.RunRequest(run_key=f"refresh:{newest}", tags={"tkg/reason": "partitions landed since the last publish"})


def refresh_sensor(job: dg.JobDefinition, minimum_interval_seconds: int = 1) -> dg.SensorDefinition:
    @dg.sensor(name="tkg_automation", job=job, minimum_interval_seconds=minimum_interval_seconds,
               default_status=dg.DefaultSensorStatus.RUNNING)
    def tkg_automation(context: dg.SensorEvaluationContext):
        """Once partitions have landed (a backfill, the weekly schedule, a run from the UI) and
        nothing is running or queued, refreshes resolution, invalidation and retention and
        publishes the warehouse with its SQL models, in one `refresh_and_publish` run."""
        return refresh_request(context.instance)

    return tkg_automation
