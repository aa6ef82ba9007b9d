"""Invalidation over all partitions: newer facts retire the older facts they contradict."""


import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage
from tkg import tables
from tkg.invalidation import canonical_triplets, invalidate
from tkg_assets.assets.common import OWNERS, table_metadata
from tkg_assets.assets.extraction import temporal_events, triplets
from tkg_assets.assets.resolution import canonical_entities
from tkg_assets.automation import GLOBAL_AUTOMATION


@dg.asset(
    group_name="resolution",
    kinds={"python", "duckdb", "parquet"},
    owners=OWNERS,
    deps=[temporal_events, triplets, canonical_entities],
    code_version=ExtractionBackend.code_version_for("judge"),
    automation_condition=GLOBAL_AUTOMATION,
)
def invalidated_events(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
    """The bi-temporal history: which DYNAMIC facts a later fact retired, when (invalid_at),
    when that became known (expired_at) and by which event (invalidated_by). Recomputed from
    all events, so the result never depends on the order partitions arrived in. Every judgment
    and its reason is kept for audit."""
    store = storage.store
    mapping_path = store.global_path("canonical_entities", "entity_resolution")
    if not mapping_path.exists():
        raise FileNotFoundError("canonical_entities has not been materialised yet; materialise it before invalidated_events")
    resolved = canonical_triplets(
        store.read_all("triplets", tables.TRIPLETS), store.read(mapping_path), store.read(store.global_path("canonical_entities"))
    )
    judge = extraction.judge()
    result = invalidate(store.read_all("temporal_events", tables.EVENTS), resolved, judge)
    path = store.write(store.global_path("invalidated_events", "event_invalidations"), result.event_invalidations)
    store.write(store.global_path("invalidated_events", "invalidation_judgments"), result.judgments)
    return dg.MaterializeResult(metadata=table_metadata(result.event_invalidations, path, result.counts, judge=judge.name))
