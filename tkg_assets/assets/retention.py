"""Retention: the relevance of every fact, and the archive of those below it (tkg.invalidate.retention)."""

import dagster as dg

from resources.tkg import TkgStorage
from tkg.build.graph import run_fact_relevance
from tkg.build.state import RETENTION_VERSION
from tkg.invalidate.retention import retention_settings
from tkg_assets.assets.common import OWNERS, table_metadata
from tkg_assets.automation import CANONICAL_AUTOMATION


def retention_asset() -> dg.AssetsDefinition:
    settings = retention_settings()

    @dg.asset(
        group_name="retention",
        kinds={"python", "duckdb", "parquet"},
        owners=OWNERS,
        deps=["temporal_events"],
        code_version=f"{RETENTION_VERSION}:{settings.fingerprint()}",
        automation_condition=CANONICAL_AUTOMATION,
        metadata={"settings": dg.MetadataValue.json(settings.__dict__)},
    )
    def fact_relevance(context: dg.AssetExecutionContext, storage: TkgStorage) -> dg.MaterializeResult:
        """A relevance score per fact: recency (halving every half_life_days from its last
        statement) x trust in its kind (FACT, PREDICTION, OPINION) x (1 + ln restatements). With
        archiving turned on (TKG_RETENTION, tkg/config/retention.yaml; off by default), facts below
        the threshold or past their kind's time-to-live move from the `facts` view to
        `facts_archive`; nothing is deleted."""
        result = run_fact_relevance(storage.store, settings)
        return dg.MaterializeResult(metadata=table_metadata(result.table, result.path, result.counts),
                                    data_version=dg.DataVersion(result.stamp.version))

    return fact_relevance
