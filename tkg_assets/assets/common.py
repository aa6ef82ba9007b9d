"""Helpers the asset modules share: reading an upstream partition, and metadata."""


from collections import Counter
from datetime import date
from pathlib import Path

import dagster as dg
import pyarrow as pa

from tkg.store import ParquetStore

OWNERS = ["team:tkg"]
PARTITIONED_BACKFILL = dg.BackfillPolicy.multi_run(max_partitions_per_run=1)


def read_partition(store: ParquetStore, asset: str, company: str, quarter: date) -> pa.Table:
    path = store.partition_path(asset, company, quarter)
    if not path.exists():
        raise FileNotFoundError(
            f"{asset} for partition {company}|{quarter.isoformat()} has not been materialised ({path}); "
            f"materialise `{asset}` for this partition first"
        )
    return store.read(path)


def table_metadata(table: pa.Table, path: Path, counts: Counter | None = None, **extra: object) -> dict[str, object]:
    """Row count, path, column schema and the stage's counters, for MaterializeResult metadata."""
    metadata: dict[str, object] = {
        "dagster/row_count": table.num_rows,
        "path": dg.MetadataValue.path(str(path)),
        "dagster/column_schema": dg.TableSchema(columns=[dg.TableColumn(f.name, str(f.type)) for f in table.schema]),
    }
    for key, value in sorted((counts or {}).items()):
        metadata[key] = int(value)
    metadata.update(extra)
    return metadata
