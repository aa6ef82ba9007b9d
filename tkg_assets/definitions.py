"""The one Definitions object of tkg: `dagster dev -w workspace.yaml` loads this module."""


import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage, TranscriptSource, extraction_backend_from_env
from tkg_assets.assets.extraction import entities, statements, temporal_events, triplets
from tkg_assets.assets.ingestion import chunks, transcripts
from tkg_assets.assets.invalidation import invalidated_events
from tkg_assets.assets.resolution import canonical_entities
from tkg_assets.assets.warehouse import sql_models, warehouse
from tkg_assets.automation import stale_partition_requests
from tkg_assets.batch import build_partitions
from tkg_assets.checks import one_holder_per_office, statements_have_provenance, validity_ranges_are_ordered
from tkg_assets.partitions import company_quarter

PARTITIONED_ASSETS = [transcripts, chunks, statements, temporal_events, triplets, entities]
GLOBAL_ASSETS = [canonical_entities, invalidated_events, warehouse, sql_models]

ingest_partition = dg.define_asset_job(
    "ingest_partition",
    selection=dg.AssetSelection.assets(*PARTITIONED_ASSETS),
    partitions_def=company_quarter,
    description="Parse, chunk and extract one company x quarter partition.",
)
refresh_graph = dg.define_asset_job(
    "refresh_graph",
    selection=dg.AssetSelection.assets(*GLOBAL_ASSETS),
    description="Resolve entities, run invalidation over all partitions and publish tkg.duckdb.",
)


@dg.schedule(job=ingest_partition, cron_schedule="0 6 * * 1", default_status=dg.DefaultScheduleStatus.STOPPED)
def weekly_new_transcripts(context: dg.ScheduleEvaluationContext, storage: TkgStorage, source: TranscriptSource,
                           extraction: ExtractionBackend):
    """Every Monday, build what changed, as `tkg build` would: new calls in the source, changed
    source rows, and partitions whose code version (prompt, model, rules) changed, each from
    its first stale stage. Calls arrive weeks after quarter end, so a weekly look beats a
    quarterly cron. The automation sensor then refreshes the global assets."""
    from tkg.plan import plan_build
    from tkg.state import global_code_versions

    loaded = source.load()
    plan = plan_build(storage.store, loaded, loaded.partitions(), extraction.code_versions(),
                      global_code_versions(extraction.judge_code_version()))
    for problem in loaded.problems:
        context.log.warning(f"source row skipped: {problem}")
    return stale_partition_requests(plan) or dg.SkipReason(f"every partition of {source.describe()} is up to date")


automation = dg.AutomationConditionSensorDefinition(
    "tkg_automation",
    target=dg.AssetSelection.groups("resolution", "warehouse", "sql_models"),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Refreshes entity resolution, invalidation and the warehouse after partitions land.",
)

def build_definitions(storage: TkgStorage, source: TranscriptSource, extraction: ExtractionBackend) -> dg.Definitions:
    """The definitions with these resources: `dagster dev` gets them from the environment
    (below); `tkg build` passes its own settings."""
    return dg.Definitions(
        assets=[*PARTITIONED_ASSETS, *GLOBAL_ASSETS],
        asset_checks=[validity_ranges_are_ordered, statements_have_provenance, one_holder_per_office],
        jobs=[ingest_partition, refresh_graph, build_partitions],
        schedules=[weekly_new_transcripts],
        sensors=[automation],
        resources={"storage": storage, "source": source, "extraction": extraction},
    )


defs = build_definitions(TkgStorage(), TranscriptSource(), extraction_backend_from_env())
