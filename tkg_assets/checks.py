"""Asset checks: invariants every partition and every publish must satisfy."""


import dagster as dg
import duckdb
import pyarrow.compute as pc

from resources.tkg import TkgStorage
from tkg.stages import read_partition
from tkg_assets.assets.extraction import statements, temporal_events
from tkg_assets.assets.warehouse import warehouse
from tkg_assets.partitions import company_quarter, partition_of


@dg.asset_check(asset=temporal_events, blocking=True, partitions_def=company_quarter,
                description="No event ends before it starts, and every non-ATEMPORAL event has a valid_at.")
def validity_ranges_are_ordered(context: dg.AssetCheckExecutionContext, storage: TkgStorage) -> dg.AssetCheckResult:
    company, quarter = partition_of(context)
    events = read_partition(storage.store, "temporal_events", company, quarter)
    backwards = pc.sum(pc.fill_null(pc.less(events["invalid_at"], events["valid_at"]), False)).as_py() or 0
    dated = pc.not_equal(events["temporal_type"], "ATEMPORAL")
    undated = pc.sum(pc.and_(dated, pc.is_null(events["valid_at"]))).as_py() or 0
    return dg.AssetCheckResult(passed=backwards == 0 and undated == 0,
                               metadata={"ends_before_start": backwards, "dated_without_valid_at": undated})


@dg.asset_check(asset=statements, blocking=True, partitions_def=company_quarter,
                description="Every statement points at a chunk of this partition (provenance is never lost).")
def statements_have_provenance(context: dg.AssetCheckExecutionContext, storage: TkgStorage) -> dg.AssetCheckResult:
    company, quarter = partition_of(context)
    chunk_ids = set(read_partition(storage.store, "chunks", company, quarter).column("chunk_id").to_pylist())
    orphans = sum(1 for c in read_partition(storage.store, "statements", company, quarter).column("chunk_id").to_pylist()
                  if c not in chunk_ids)
    return dg.AssetCheckResult(passed=orphans == 0, metadata={"orphan_statements": orphans})


@dg.asset_check(asset=warehouse, description=(
    "At no time do two different people hold the same one-at-a-time office (CEO, CFO, ...) at the "
    "same organisation. A failure points at a missed invalidation or a wrong entity merge."))
def one_holder_per_office(storage: TkgStorage) -> dg.AssetCheckResult:
    from tkg.roles import FUNCTIONAL_OFFICES

    with duckdb.connect(str(storage.warehouse_path), read_only=True) as connection:
        overlaps = connection.execute(
            """
            SELECT a.company, a.office, a.person, b.person AS other_person, greatest(a.valid_at, b.valid_at) AS at
            FROM officers a JOIN officers b
              ON a.office_id = b.office_id AND a.person_id < b.person_id
             AND a.valid_at < coalesce(b.invalid_at, 'infinity'::TIMESTAMPTZ)
             AND b.valid_at < coalesce(a.invalid_at, 'infinity'::TIMESTAMPTZ)
            WHERE a.role IN (SELECT unnest(?::VARCHAR[]))
            ORDER BY ALL LIMIT 20
            """,
            [sorted(FUNCTIONAL_OFFICES)],
        ).fetchall()
    return dg.AssetCheckResult(
        passed=not overlaps, severity=dg.AssetCheckSeverity.WARN,
        metadata={"overlaps": dg.MetadataValue.md("\n".join(f"- {row}" for row in overlaps) or "none")},
    )
