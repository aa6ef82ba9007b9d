"""Entity resolution over all partitions: canonical entities with stable ids."""

import dagster as dg

from resources.tkg import TkgStorage
from tkg.build import run_canonical_entities
from tkg.state import RESOLUTION_VERSION
from tkg_assets.assets.common import OWNERS, table_metadata
from tkg_assets.assets.extraction import entities
from tkg_assets.automation import GLOBAL_AUTOMATION


@dg.asset(
    group_name="resolution",
    kinds={"python", "duckdb", "parquet"},
    owners=OWNERS,
    deps=[entities],
    code_version=RESOLUTION_VERSION,
    automation_condition=GLOBAL_AUTOMATION,
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
