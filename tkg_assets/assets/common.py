"""What the asset modules share: ownership, freshness, resources to settings, and the
metadata of a stage's materialisation.

A partitioned stage's materialisation carries the same metadata and versions whether a
Dagster run of that asset made it or `tkg build` did, in worker processes, and recorded it
afterwards (`tkg_assets.batch`): both go through `stage_metadata`.
"""

from datetime import timedelta

import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage, TranscriptSource, settings_of
from tkg.build.catalog import Stage
from tkg.build.runner import StageReport
from tkg.build.stages import Runtime
from tkg.core.tables import column_description
from tkg.core.versions import Stamp

OWNERS = ["team:tkg"]
RUN_PID_TAG, RUN_HOST_TAG = "tkg/pid", "tkg/host"
# Calls come every quarter: a company's partitions are overdue 100 days after the last one.
# Said on every partitioned asset, for the newcomer who reads "16 missing of 24" as a failed build.
PARTITION_NOTE = (
    "\n\n**Why later quarters are empty.** Partitions run from the quarter of the source's first call "
    "to the quarter under way (today's), so a call that arrives next has a partition to land in. "
    "Quarters after the source's last call stand empty until the source has calls for them: they are "
    "not failed builds. `tkg status` counts only the quarters the source covers."
)
PARTITION_FRESHNESS = dg.FreshnessPolicy.time_window(fail_window=timedelta(days=100), warn_window=timedelta(days=95))


def runtime_of(storage: TkgStorage, source: TranscriptSource, extraction: ExtractionBackend) -> Runtime:
    """What a step builds with, from its resources."""
    return Runtime.open(settings_of(storage, source, extraction), api_key=extraction.api_key)


def column_schema(columns: list[tuple[str, str]]) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(name, kind, description=column_description(name)) for name, kind in columns])


def definition_metadata(stage: Stage) -> dict[str, object]:
    """Metadata of an asset's definition: the column schema of its table, the same for every
    partition (so it is not repeated in each of the thousand materialisations), and its prompt."""
    metadata: dict[str, object] = {
        "dagster/column_schema": column_schema([(f.name, str(f.type)) for f in stage.table.schema])}
    if stage.prompt:
        metadata["prompt"] = dg.MetadataValue.path(f"prompts/{stage.prompt}")
    return metadata


def stage_metadata(report: StageReport) -> dict[str, object]:
    """The metadata of one stage's materialisation (of one partition, or of a global stage)."""
    metadata: dict[str, object] = {"dagster/row_count": report.rows}
    if report.path:  # a partition without a call stores nothing
        metadata["path"] = dg.MetadataValue.path(report.path)
    for key, value in sorted(report.counts.items()):
        metadata[key] = int(value)
    for key, value in sorted(report.metadata.items()):
        metadata[key] = dg.MetadataValue.json(value) if isinstance(value, (dict, list)) else value
    if report.notes:
        metadata["notes"] = dg.MetadataValue.md("\n".join(f"- {note}" for note in report.notes))
    if report.missing:
        metadata["missing"] = dg.MetadataValue.json(report.missing)
    return metadata


def version_tags(stage: Stage, stamp: Stamp, input_versions: dict[str, str] | None = None) -> dict[str, str]:
    """The data-version tags Dagster writes when an asset runs, for a materialisation that tkg
    build recorded: code version, data version and the versions of the inputs (`input_versions`
    where the stamp holds something else for an input, as a shard's does)."""
    tags = {"dagster/code_version": stamp.code_version, "dagster/data_version": stamp.version}
    inputs = {**stamp.inputs, **(input_versions or {})}
    for upstream in stage.inputs:
        if upstream in inputs:
            tags[f"dagster/input_data_version/{upstream}"] = inputs[upstream]
    return tags
