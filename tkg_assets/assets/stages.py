"""One asset per stage of the catalog (tkg.build.catalog), before the warehouse.

A partitioned stage's asset runs its stage for the partition being materialised, reading the
upstream Parquet and writing its own; a global stage's asset runs over every partition. The
name, group, description, lineage, code version, pool and column schema of each come from its
catalog row. A stage the provider could not finish fails the run and keeps its last good
output, unless the `extraction` resource allows a partial result.
"""

import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage, TranscriptSource
from tkg.build import catalog
from tkg.build.catalog import Stage
from tkg.build.runner import report_of
from tkg.build.stages import build_partition, run_global
from tkg.core.results import StageIncomplete
from tkg.ingest.sources import load_source
from tkg_assets.assets.common import (
    OWNERS,
    PARTITION_FRESHNESS,
    PARTITION_NOTE,
    PARTITIONED_BACKFILL,
    definition_metadata,
    runtime_of,
    stage_metadata,
)
from tkg_assets.automation import global_automation
from tkg_assets.instance import LLM_POOL
from tkg_assets.partitions import partition_of


def _partitioned_asset(stage: Stage, partitions_def: dg.PartitionsDefinition, code_versions: dict[str, str]):
    @dg.asset(name=stage.name, partitions_def=partitions_def, group_name=stage.group, kinds={"python", "parquet"},
              owners=OWNERS, deps=list(stage.inputs), code_version=code_versions[stage.name],
              description=stage.description + PARTITION_NOTE,
              metadata=definition_metadata(stage), backfill_policy=PARTITIONED_BACKFILL,
              freshness_policy=PARTITION_FRESHNESS, pool=LLM_POOL if stage.calls_provider else None)
    def stage_asset(context: dg.AssetExecutionContext, storage: TkgStorage, source: TranscriptSource,
                    extraction: ExtractionBackend) -> dg.MaterializeResult:
        runtime = runtime_of(storage, source, extraction)
        if stage.calls_provider:
            context.log.info(f"extraction backend: {runtime.settings.describe()}")
        partition = partition_of(context)
        rows = None
        if stage.outside_inputs:  # the source rows: a row that turned bad keeps the partition as built
            loaded = load_source(runtime.settings.source)
            held = loaded.problem_partitions().get(partition)
            if held and runtime.store.is_file(runtime.store.partition_path(stage.name, *partition)):
                raise StageIncomplete(stage.name, f"{partition[0]}|{partition[1].isoformat()}",
                                      "a source row of this partition cannot be read (" + "; ".join(map(str, held))
                                      + "); fix the row to rebuild it")
            rows = loaded.rows_for(*partition)
        result = build_partition(runtime, partition, {stage.name}, rows, downstream=False)[stage.name]
        for note in result.notes:
            context.log.info(note)
        return dg.MaterializeResult(metadata=stage_metadata(report_of(stage.name, result)),
                                    data_version=dg.DataVersion(result.stamp.version))

    return stage_asset


# One shard per run: a shard's memory is its own process's, and a failed shard is retried alone.
SHARD_BACKFILL = dg.BackfillPolicy.multi_run(max_partitions_per_run=1)


def _shard_asset(stage: Stage, shards_def: dg.PartitionsDefinition, code_versions: dict[str, str]):
    @dg.asset(name=stage.name, partitions_def=shards_def, group_name=stage.group, kinds={"python", "parquet"},
              owners=OWNERS, deps=list(stage.inputs), code_version=code_versions[stage.name], description=stage.description,
              metadata=definition_metadata(stage), automation_condition=global_automation(stage),
              backfill_policy=SHARD_BACKFILL, pool=LLM_POOL if stage.counters else None)
    def stage_asset(context: dg.AssetExecutionContext, storage: TkgStorage, source: TranscriptSource,
                    extraction: ExtractionBackend) -> dg.MaterializeResult:
        result = run_global(runtime_of(storage, source, extraction), stage, str(context.partition_key))
        return dg.MaterializeResult(metadata=stage_metadata(report_of(stage.name, result)),
                                    data_version=dg.DataVersion(result.stamp.version))

    return stage_asset


def _global_asset(stage: Stage, code_versions: dict[str, str]):
    @dg.asset(name=stage.name, group_name=stage.group, kinds={"python", "duckdb", "parquet"}, owners=OWNERS,
              deps=list(stage.inputs), code_version=code_versions[stage.name], description=stage.description,
              metadata=definition_metadata(stage), automation_condition=global_automation(stage))
    def stage_asset(context: dg.AssetExecutionContext, storage: TkgStorage, source: TranscriptSource,
                    extraction: ExtractionBackend) -> dg.MaterializeResult:
        result = run_global(runtime_of(storage, source, extraction), stage)
        return dg.MaterializeResult(metadata=stage_metadata(report_of(stage.name, result)),
                                    data_version=dg.DataVersion(result.stamp.version))

    return stage_asset


def stage_assets(partitions_def: dg.PartitionsDefinition, shards_def: dg.PartitionsDefinition,
                 code_versions: dict[str, str]) -> list[dg.AssetsDefinition]:
    """Every stage's asset: the partitioned ones over `partitions_def`, the shard ones over
    `shards_def`, with the code versions of the configured backend."""
    return [_partitioned_asset(stage, partitions_def, code_versions) if stage.partitioned
            else _shard_asset(stage, shards_def, code_versions) if stage.sharded
            else _global_asset(stage, code_versions) for stage in catalog.STAGES]
