"""The one Definitions object of tkg: `dagster dev -w workspace.yaml` loads this module.

`build_definitions` makes it from three resources, so the partition space and the code
versions follow the settings: `dagster dev` passes the ones the environment gives (below),
`tkg build` passes its own (never by writing them into os.environ).
"""

import os

import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage, TranscriptSource, extraction_backend_from_env
from tkg_assets.assets.extraction import extraction_assets
from tkg_assets.assets.ingestion import ingestion_assets
from tkg_assets.assets.resolution import canonical_entities, invalidation_asset
from tkg_assets.assets.retention import retention_asset
from tkg_assets.assets.warehouse import sql_models, warehouse
from tkg_assets.automation import stale_partition_requests
from tkg_assets.batch import build_partitions
from tkg_assets.partitions import partition_space


def pipeline_assets(source: TranscriptSource, extraction: ExtractionBackend) -> tuple[list, list]:
    """The partitioned assets (over the source's partition space, with the backend's code
    versions) and the global ones."""
    partitions_def = partition_space(source.source)
    code_versions = extraction.code_versions()
    partitioned = [*ingestion_assets(partitions_def, code_versions), *extraction_assets(partitions_def, code_versions)]
    return partitioned, [canonical_entities, invalidation_asset(extraction.judge_code_version()), retention_asset(), warehouse,
                         sql_models]


def executor_from_env() -> dg.ExecutorDefinition | None:
    """The executor of the code location's runs, chosen by TKG_EXECUTOR.

    Unset or 'multiprocess': Dagster's default, each step in a subprocess of its run. 'celery':
    each step is a task for a Celery worker on any machine (dagster-celery, in the `distributed`
    extra), through the broker and result backend named by TKG_CELERY_BROKER and
    TKG_CELERY_BACKEND, read where each run starts (see deploy/README.md).
    """
    choice = os.environ.get("TKG_EXECUTOR") or "multiprocess"
    if choice == "multiprocess":
        return None
    if choice == "celery":
        try:
            from dagster_celery import celery_executor
        except ImportError as missing:
            raise ImportError("TKG_EXECUTOR=celery needs dagster-celery; pip install 'tkg[distributed]'") from missing
        return celery_executor.configured({"broker": {"env": "TKG_CELERY_BROKER"}, "backend": {"env": "TKG_CELERY_BACKEND"}})
    raise ValueError(f"TKG_EXECUTOR={choice!r} is not an executor tkg knows; use 'multiprocess' (the default) or 'celery'")


def build_definitions(storage: TkgStorage, source: TranscriptSource, extraction: ExtractionBackend,
                      executor: dg.ExecutorDefinition | None = None) -> dg.Definitions:
    partitioned, global_assets = pipeline_assets(source, extraction)
    partitions_def = partitioned[0].partitions_def

    ingest_partition = dg.define_asset_job(
        "ingest_partition", selection=dg.AssetSelection.assets(*partitioned), partitions_def=partitions_def,
        description="Parse, chunk and extract one company x quarter partition.")
    refresh_graph = dg.define_asset_job(
        "refresh_graph", selection=dg.AssetSelection.assets(*global_assets),
        description="Resolve entities, run invalidation over all partitions and publish tkg.duckdb.")

    @dg.schedule(job=ingest_partition, cron_schedule="0 6 * * 1", default_status=dg.DefaultScheduleStatus.STOPPED)
    def weekly_new_transcripts(context: dg.ScheduleEvaluationContext, storage: TkgStorage, source: TranscriptSource,
                               extraction: ExtractionBackend):
        """Every Monday, build what changed, as `tkg build` would: new calls in the source, changed
        source rows, and partitions whose code version (prompt, model, rules) changed, each from
        its first stale stage. Calls arrive weeks after quarter end, so a weekly look beats a
        quarterly cron. The automation sensor then refreshes the global assets."""
        from tkg.build.plan import plan_build
        from tkg.build.state import global_code_versions

        loaded = source.load()
        plan = plan_build(storage.store, loaded, loaded.partitions(), extraction.code_versions(),
                          global_code_versions(extraction.judge_code_version()))
        for problem in loaded.problems:
            context.log.warning(f"source row skipped: {problem}")
        return stale_partition_requests(plan) or dg.SkipReason(f"every partition of {source.describe()} is up to date")

    automation = dg.AutomationConditionSensorDefinition(
        "tkg_automation",
        target=dg.AssetSelection.groups("resolution", "retention", "warehouse", "sql_models"),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Refreshes entity resolution, invalidation and the warehouse after partitions land.",
    )
    return dg.Definitions(
        assets=[*partitioned, *global_assets],
        jobs=[ingest_partition, refresh_graph, build_partitions],
        schedules=[weekly_new_transcripts],
        sensors=[automation],
        resources={"storage": storage, "source": source, "extraction": extraction},
        executor=executor,
    )


# `tkg build` runs its jobs in its own process (build_definitions without an executor); the
# daemon, the UI and the workers of a distributed deploy load this, with TKG_EXECUTOR's executor.
defs = build_definitions(TkgStorage(), TranscriptSource(), extraction_backend_from_env(), executor=executor_from_env())
