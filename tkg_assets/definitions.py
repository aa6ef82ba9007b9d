"""The one Definitions object of tkg: `dagster dev -w workspace.yaml` loads this module.

`build_definitions` makes it from resolved settings (tkg.settings), so the partition space and
the code versions follow them: the code location passes the ones the environment gives
(below), `tkg build` passes its own (never by writing them into os.environ).
"""

import os

import dagster as dg

from resources.tkg import (
    ExtractionBackend,
    TkgStorage,
    TranscriptSource,
    resources_for,
    settings_of,
)
from tkg.build import catalog
from tkg.build.plan import plan_build
from tkg.ingest.sources import describe, load_source
from tkg.providers import fingerprints
from tkg.settings import Settings
from tkg_assets.assets.stages import stage_assets
from tkg_assets.assets.warehouse import sql_models, warehouse
from tkg_assets.automation import refresh_sensor, stale_partition_requests
from tkg_assets.batch import Progress, build_partitions, no_progress, refresh_and_publish, refresh_graph
from tkg_assets.partitions import partition_space, shard_space
from tkg_assets.warm_runs import start_forkserver_now


def pipeline_assets(settings: Settings) -> tuple[list, list]:
    """The partitioned stages (one multi-asset over the source's partition space, with the
    backend's code versions, batched as TKG_PARTITIONS_PER_RUN and TKG_RUN_WORKERS say) and the
    global assets, from the stage catalog."""
    partition_stages, *global_stages = stage_assets(
        partition_space(settings.source), shard_space(settings.shards), catalog.code_versions(fingerprints(settings)),
        settings.partitions_per_run, settings.run_workers)
    return [partition_stages], [*global_stages, warehouse, sql_models]


def executor_from_env() -> dg.ExecutorDefinition:
    """The executor of the code location's runs, chosen by TKG_EXECUTOR.

    Unset or 'in_process': each step in its run's own process, one after the other. tkg's runs
    are one step each (a backfill batch of `partition_stages`, the sensor's
    `refresh_and_publish`, a shard), and those steps start their own worker processes where
    work runs side by side, so a subprocess per step would only add a process and a load of the
    code location to every run. 'multiprocess': Dagster's default, each step in a subprocess of
    its run (steps of a run of several assets side by side). 'celery': each step is a task for a
    Celery worker on any machine (dagster-celery, in the `distributed` extra), through the
    broker and result backend named by TKG_CELERY_BROKER and TKG_CELERY_BACKEND, read where
    each run starts (see deploy/README.md).
    """
    choice = os.environ.get("TKG_EXECUTOR") or "in_process"
    if choice == "multiprocess":
        return dg.multiprocess_executor
    if choice == "in_process":
        return dg.in_process_executor
    if choice == "celery":
        try:
            from dagster_celery import celery_executor
        except ImportError as missing:
            raise ImportError("TKG_EXECUTOR=celery needs dagster-celery; pip install 'tkg[distributed]'") from missing
        return celery_executor.configured({"broker": {"env": "TKG_CELERY_BROKER"}, "backend": {"env": "TKG_CELERY_BACKEND"}})
    raise ValueError(f"TKG_EXECUTOR={choice!r} is not an executor tkg knows; use 'in_process' (the default), 'multiprocess' or 'celery'")


def build_definitions(settings: Settings, executor: dg.ExecutorDefinition | None = None,
                      progress: Progress = no_progress) -> dg.Definitions:
    """The definitions for `settings`; `progress` follows the partitions `build_partitions`
    builds (tkg build's progress bar, in its own process)."""
    partitioned, global_assets = pipeline_assets(settings)
    partitions_def = partitioned[0].partitions_def

    ingest_partition = dg.define_asset_job(
        "ingest_partition", selection=dg.AssetSelection.assets(*partitioned), partitions_def=partitions_def,
        description="Parse, chunk and extract one company x quarter partition.")
    publish_graph = dg.define_asset_job(
        "publish_graph", selection=dg.AssetSelection.assets(warehouse, sql_models),
        description="Publish tkg.duckdb (with its checks) and refresh the SQL models.")

    @dg.schedule(job=build_partitions, cron_schedule="0 6 * * 1", default_status=dg.DefaultScheduleStatus.STOPPED)
    def weekly_new_transcripts(context: dg.ScheduleEvaluationContext, storage: TkgStorage, source: TranscriptSource,
                               extraction: ExtractionBackend):
        """Every Monday, build what changed, as `tkg build` would: new calls in the source, changed
        source rows, and partitions whose code version (prompt, model, rules) changed, each from
        its first stale stage, in runs of `build_partitions` grouped as a UI backfill groups them
        (a company's partitions, TKG_PARTITIONS_PER_RUN at most, TKG_RUN_WORKERS processes). Calls
        arrive weeks after quarter end, so a weekly look beats a quarterly cron. The
        `tkg_automation` sensor then refreshes the global half and publishes, in one run."""
        current = settings_of(storage, source, extraction)
        loaded = load_source(current.source)
        plan = plan_build(current.store(), loaded, loaded.partitions(), catalog.code_versions(fingerprints(current)),
                          shards=current.shards)
        for problem in loaded.problems:
            context.log.warning(f"source row skipped: {problem}")
        requests = stale_partition_requests(plan, settings.partitions_per_run, settings.run_workers)
        return requests or dg.SkipReason(f"every partition of {describe(current.source)} is up to date")

    return dg.Definitions(
        assets=[*partitioned, *global_assets],
        jobs=[ingest_partition, build_partitions, refresh_graph, publish_graph, refresh_and_publish],
        schedules=[weekly_new_transcripts],
        sensors=[refresh_sensor(refresh_and_publish)],
        resources={**resources_for(settings), "progress": progress},
        executor=executor,
    )


# `tkg build` runs its jobs in its own process (build_definitions without an executor); the
# daemon, the UI and the workers of a distributed deploy load this, with TKG_EXECUTOR's executor.
defs = build_definitions(Settings.resolve(), executor=executor_from_env())
# In a code server, the process runs are forked from starts loading now (tkg_assets/warm_runs.py).
start_forkserver_now()
