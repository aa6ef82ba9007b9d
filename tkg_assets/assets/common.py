"""What the asset modules share: ownership, backfill policy and metadata."""

from collections import Counter
from pathlib import Path

import dagster as dg
import pyarrow as pa

OWNERS = ["team:tkg"]
# One partition per run: each is independent, retryable and cost-attributable (notes: dagster #28861).
PARTITIONED_BACKFILL = dg.BackfillPolicy.multi_run(max_partitions_per_run=1)


def table_metadata(table: pa.Table, path: Path | None, counts: Counter | None = None, **extra: object) -> dict[str, object]:
    """Row count, path, column schema and the stage's counters, for MaterializeResult metadata."""
    metadata: dict[str, object] = {
        "dagster/row_count": table.num_rows,
        "dagster/column_schema": dg.TableSchema(columns=[dg.TableColumn(f.name, str(f.type)) for f in table.schema]),
    }
    if path is not None:
        metadata["path"] = dg.MetadataValue.path(str(path))
    for key, value in sorted((counts or {}).items()):
        metadata[key] = int(value)
    metadata.update(extra)
    return metadata
