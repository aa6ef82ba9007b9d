"""What the asset modules share: ownership, backfill policy, and the materialisation of a stage.

A partitioned stage's materialisation carries the same metadata and versions whether a
Dagster run of that asset made it (`materialize_stage`) or `tkg build` did, in worker
processes, and recorded it afterwards (`tkg_assets.batch`): both go through `stage_metadata`.
"""

from collections import Counter
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pyarrow as pa

from resources.tkg import ExtractionBackend, TkgStorage, TranscriptSource
from tkg.build.runner import StageReport, report_of
from tkg.build.stages import run_stage
from tkg.build.state import STAGE_INPUTS
from tkg.core import tables
from tkg.core.tables import column_description
from tkg.core.versions import Stamp
from tkg_assets.partitions import partition_of

OWNERS = ["team:tkg"]
# One partition per run: each is independent, retryable and cost-attributable (notes: dagster #28861).
PARTITIONED_BACKFILL = dg.BackfillPolicy.multi_run(max_partitions_per_run=1)
RUN_PID_TAG, RUN_HOST_TAG = "tkg/pid", "tkg/host"
# Calls come every quarter: a company's partitions are overdue 100 days after the last one.
PARTITION_FRESHNESS = dg.FreshnessPolicy.time_window(fail_window=timedelta(days=100), warn_window=timedelta(days=95))


def partitioned_asset(stage: str, group: str, partitions_def: dg.PartitionsDefinition, code_versions: dict[str, str],
                      **kwargs):
    """The decorator of a partitioned stage's asset: its lineage (`tkg.build.state.STAGE_INPUTS`),
    code version, column schema, freshness and one-partition-per-run backfills."""
    return dg.asset(
        name=stage, partitions_def=partitions_def, group_name=group, kinds={"python", "parquet"}, owners=OWNERS,
        deps=list(STAGE_INPUTS[stage]), code_version=code_versions[stage], metadata=definition_metadata(stage),
        backfill_policy=PARTITIONED_BACKFILL, freshness_policy=PARTITION_FRESHNESS, **kwargs,
    )


def column_schema(columns: list[tuple[str, str]]) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(name, kind, description=column_description(name)) for name, kind in columns])


def table_metadata(table: pa.Table, path: Path | None, counts: Counter | None = None, **extra: object) -> dict[str, object]:
    """Row count, path, column schema and the stage's counters, for MaterializeResult metadata."""
    metadata: dict[str, object] = {
        "dagster/row_count": table.num_rows,
        "dagster/column_schema": column_schema([(f.name, str(f.type)) for f in table.schema]),
    }
    if path is not None:
        metadata["path"] = dg.MetadataValue.path(str(path))
    for key, value in sorted((counts or {}).items()):
        metadata[key] = int(value)
    metadata.update(extra)
    return metadata


SCHEMAS = {"transcripts": tables.TRANSCRIPTS, "chunks": tables.CHUNKS, "statements": tables.STATEMENTS,
           "temporal_events": tables.EVENTS, "triplets": tables.TRIPLETS, "figures": tables.FIGURES,
           "entities": tables.ENTITIES}


def definition_metadata(stage: str) -> dict[str, object]:
    """Metadata of a partitioned asset's definition: its column schema, the same for every
    partition (so it is not repeated in each of the thousand materialisations)."""
    return {"dagster/column_schema": column_schema([(f.name, str(f.type)) for f in SCHEMAS[stage]])}


def stage_metadata(report: StageReport) -> dict[str, object]:
    """The metadata of one stage of one partition."""
    metadata: dict[str, object] = {
        "dagster/row_count": report.rows,
        "path": dg.MetadataValue.path(report.path),
    }
    for key, value in sorted(report.counts.items()):
        metadata[key] = int(value)
    for key, value in sorted(report.extra.items()):
        metadata[key] = dg.MetadataValue.json(value) if isinstance(value, (dict, list)) else value
    if report.notes:
        metadata["notes"] = dg.MetadataValue.md("\n".join(f"- {note}" for note in report.notes))
    if report.missing:
        metadata["missing"] = dg.MetadataValue.json(report.missing)
    return metadata


def version_tags(stage: str, stamp: Stamp) -> dict[str, str]:
    """The data-version tags Dagster writes when an asset runs, for a materialisation that tkg
    build recorded: code version, data version and the versions of the inputs."""
    tags = {"dagster/code_version": stamp.code_version, "dagster/data_version": stamp.version}
    for upstream in STAGE_INPUTS.get(stage, ()):
        if upstream in stamp.inputs:
            tags[f"dagster/input_data_version/{upstream}"] = stamp.inputs[upstream]
    return tags


def materialize_stage(context: dg.AssetExecutionContext, stage: str, storage: TkgStorage, extraction: ExtractionBackend,
                      source: TranscriptSource | None = None) -> dg.MaterializeResult:
    """Run one stage of the partition being materialised and describe what it wrote."""
    company, quarter = partition_of(context)
    result = run_stage(storage.store, stage, company, quarter, extraction.components(),
                       source.load() if source is not None else None)
    for note in result.notes:
        context.log.info(note)
    return dg.MaterializeResult(metadata=stage_metadata(report_of(stage, result)),
                                data_version=dg.DataVersion(result.stamp.version))
