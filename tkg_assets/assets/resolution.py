"""Entity resolution and invalidation over all partitions: canonical entities with stable ids,
and the bi-temporal history of which facts retired which."""

import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage
from tkg.build.graph import run_canonical_entities, run_invalidation
from tkg.build.state import RESOLUTION_VERSION
from tkg_assets.assets.common import OWNERS, table_metadata
from tkg_assets.automation import CANONICAL_AUTOMATION, INVALIDATION_AUTOMATION


@dg.asset(
    group_name="resolution",
    kinds={"python", "duckdb", "parquet"},
    owners=OWNERS,
    deps=["entities"],
    code_version=RESOLUTION_VERSION,
    automation_condition=CANONICAL_AUTOMATION,
)
def canonical_entities(context: dg.AssetExecutionContext, storage: TkgStorage) -> dg.MaterializeResult:
    """Every entity mention of every partition mapped to a canonical entity. People match on
    parsed names (nicknames, initials), companies on suffix-free names and the company
    registry, offices on (role, organisation). Entities are a function of the mentions, not of
    build history; ids an earlier build issued stay, with `merged_into`. Refuses to run while
    any partition is half-built."""
    resolution = run_canonical_entities(storage.store)
    return dg.MaterializeResult(metadata=table_metadata(resolution.canonical_entities, resolution.path, resolution.counts),
                                data_version=dg.DataVersion(resolution.stamp.version))


def invalidation_asset(judge_code_version: str) -> dg.AssetsDefinition:
    @dg.asset(
        group_name="resolution",
        kinds={"python", "duckdb", "parquet"},
        owners=OWNERS,
        deps=["temporal_events", "triplets", "figures", "canonical_entities"],
        code_version=judge_code_version,
        automation_condition=INVALIDATION_AUTOMATION,
    )
    def invalidated_events(context: dg.AssetExecutionContext, storage: TkgStorage,
                           extraction: ExtractionBackend) -> dg.MaterializeResult:
        """The bi-temporal history: which DYNAMIC facts a later fact retired, when (invalid_at),
        when that became known (expired_at) and by which event (invalidated_by). Recomputed from
        all events, so the result never depends on the order partitions arrived in. Every
        judgment and its reason is kept for audit."""
        judge = extraction.judge()
        result = run_invalidation(storage.store, judge, extraction.allow_partial)
        return dg.MaterializeResult(
            metadata=table_metadata(result.event_invalidations, result.path, result.counts, judge=judge.name),
            data_version=dg.DataVersion(result.stamp.version))

    return invalidated_events
