"""Invalidation over all partitions: newer facts retire the older facts they contradict."""

import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage, extraction_backend_from_env
from tkg.build import run_invalidation
from tkg_assets.assets.common import OWNERS, table_metadata
from tkg_assets.assets.extraction import temporal_events, triplets
from tkg_assets.assets.resolution import canonical_entities
from tkg_assets.automation import GLOBAL_AUTOMATION


@dg.asset(
    group_name="resolution",
    kinds={"python", "duckdb", "parquet"},
    owners=OWNERS,
    deps=[temporal_events, triplets, canonical_entities],
    code_version=extraction_backend_from_env().judge_code_version(),
    automation_condition=GLOBAL_AUTOMATION,
)
def invalidated_events(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
    """The bi-temporal history: which DYNAMIC facts a later fact retired, when (invalid_at),
    when that became known (expired_at) and by which event (invalidated_by). Recomputed from
    all events, so the result never depends on the order partitions arrived in. Every judgment
    and its reason is kept for audit."""
    judge = extraction.judge()
    result = run_invalidation(storage.store, judge, extraction.allow_partial)
    return dg.MaterializeResult(metadata=table_metadata(result.event_invalidations, result.path, result.counts, judge=judge.name),
                                data_version=dg.DataVersion(result.stamp.version))
