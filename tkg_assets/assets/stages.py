"""The stages of the catalog (tkg.build.catalog) before the warehouse, as assets.

The partitioned stages are one multi-asset with an asset per stage: a run builds whole
company x quarter partitions with `tkg build`'s worker pool and records each stage of each
partition as it lands (`tkg_assets.batch.record_partitions`). A global stage's asset runs over
every partition, a shard stage's over one shard. The name, group, description, lineage, code
version and column schema of each come from its catalog row. A stage the provider could not
finish fails its partition (or run) and keeps its last good output, unless the `extraction`
resource allows a partial result.
"""

import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage, TranscriptSource, settings_of
from tkg.build import catalog
from tkg.build.catalog import Stage
from tkg.build.runner import PartitionTask, ShardTask, report_of
from tkg.build.stages import run_global
from tkg.core.machine import usable_cores
from tkg.core.partitions import Partition, key_of, parse_key, sort_key
from tkg.ingest.sources import load_source
from tkg_assets.assets.common import (
    OWNERS,
    PARTITION_FRESHNESS,
    PARTITION_NOTE,
    definition_metadata,
    runtime_of,
    stage_metadata,
)
from tkg_assets.batch import record_partitions
from tkg_assets.instance import LLM_POOL


def _partition_stages(partitions_def: dg.PartitionsDefinition, code_versions: dict[str, str], partitions_per_run: int,
                      run_workers: int) -> dg.AssetsDefinition:
    """The partitioned stages as one multi-asset: one step builds whole partitions, every stage
    of each in memory before its files are written, as `tkg build` does.

    A UI backfill gives each run up to `partitions_per_run` partitions (a range: one company's
    quarters, or one quarter's companies). One step per stage would let a single bad partition
    fail its stage's step and with it every later stage of the whole range; here each
    partition's stages are recorded as it lands, and only the partitions that failed are
    marked failed, each with its error, so a retry of the failed partitions rebuilds only
    those. A quarter without a call is settled in the run that holds it: materialised with no
    rows, no provider request, and no file stored (tkg.build.stages.build_partition), so the
    global half and the publish read only the partitions that hold a call."""
    specs = [dg.AssetSpec(stage.name, deps=list(stage.inputs), group_name=stage.group, kinds={"python", "parquet"},
                          owners=OWNERS, code_version=code_versions[stage.name], description=stage.description + PARTITION_NOTE,
                          metadata=definition_metadata(stage), freshness_policy=PARTITION_FRESHNESS,
                          # not every partition of a run lands: its materialisations are recorded one by one
                          skippable=True)
             for stage in catalog.PARTITIONED]

    @dg.multi_asset(name="partition_stages", specs=specs, partitions_def=partitions_def, can_subset=True,
                    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=partitions_per_run),
                    pool=LLM_POOL)
    def partition_stages(context: dg.AssetExecutionContext, storage: TkgStorage, source: TranscriptSource,
                         extraction: ExtractionBackend):
        settings = settings_of(storage, source, extraction)
        stages = tuple(name for name in catalog.PARTITIONED_NAMES if dg.AssetKey(name) in context.selected_asset_keys)
        partitions = sorted((parse_key(str(key)) for key in context.partition_keys), key=sort_key)
        loaded = load_source(settings.source)
        without_call = [p for p in partitions if loaded.without_call(*p)]
        workers = min(run_workers, max(1, len(partitions) - len(without_call)))
        context.log.info(
            f"this run holds {len(partitions)} partition(s): {_span(partitions)}; {len(partitions) - len(without_call)} "
            f"with a call, {len(without_call)} without (settled with no rows, nothing stored); stages {', '.join(stages)}; "
            f"{workers} worker(s); {settings.describe()}")
        tasks = [PartitionTask(company, quarter, stages, "asked for by this run") for company, quarter in partitions]
        yield from record_partitions(context.log, settings, tasks, workers)

    return partition_stages


def _span(partitions: list[Partition]) -> str:
    """'AMD|2016-01-01 .. AMD|2020-10-01' for a run's partitions (a Dagster range is contiguous)."""
    first, last = key_of(*partitions[0]), key_of(*partitions[-1])
    return first if first == last else f"{first} .. {last}"


def _shard_asset(stage: Stage, shards_def: dg.PartitionsDefinition, code_versions: dict[str, str]):
    """A shard stage's asset: a run takes every shard asked for (a materialisation from the UI,
    or one backfill; after partitions land, `refresh_and_publish` refreshes them), each shard
    in a worker process of its own, so its memory is its
    own, as `tkg build` runs them. Each shard is recorded as it lands; a failed one is failed
    alone, and retried alone."""

    @dg.asset(name=stage.name, partitions_def=shards_def, group_name=stage.group, kinds={"python", "parquet"},
              owners=OWNERS, deps=list(stage.inputs), code_version=code_versions[stage.name], description=stage.description,
              metadata=definition_metadata(stage),
              backfill_policy=dg.BackfillPolicy.single_run(), pool=LLM_POOL if stage.counters else None,
              output_required=False)  # the shards are recorded one by one
    def stage_asset(context: dg.AssetExecutionContext, storage: TkgStorage, source: TranscriptSource,
                    extraction: ExtractionBackend):
        settings = settings_of(storage, source, extraction)
        tasks = [ShardTask(stage.name, str(key)) for key in context.partition_keys]
        workers = max(1, min(usable_cores(), len(tasks)))
        context.log.info(f"this run holds {len(tasks)} shard(s) of {stage.name}: {', '.join(t.shard for t in tasks)}; "
                         f"{workers} worker process(es)")
        yield from record_partitions(context.log, settings, tasks, workers)

    return stage_asset


def _global_asset(stage: Stage, code_versions: dict[str, str]):
    @dg.asset(name=stage.name, group_name=stage.group, kinds={"python", "duckdb", "parquet"}, owners=OWNERS,
              deps=list(stage.inputs), code_version=code_versions[stage.name], description=stage.description,
              metadata=definition_metadata(stage))
    def stage_asset(context: dg.AssetExecutionContext, storage: TkgStorage, source: TranscriptSource,
                    extraction: ExtractionBackend) -> dg.MaterializeResult:
        result = run_global(runtime_of(storage, source, extraction), stage)
        return dg.MaterializeResult(metadata=stage_metadata(report_of(stage.name, result)),
                                    data_version=dg.DataVersion(result.stamp.version))

    return stage_asset


def stage_assets(partitions_def: dg.PartitionsDefinition, shards_def: dg.PartitionsDefinition,
                 code_versions: dict[str, str], partitions_per_run: int = 50,
                 run_workers: int = 1) -> list[dg.AssetsDefinition]:
    """The stages' assets, in catalog order: the partitioned stages as one multi-asset over
    `partitions_def` (batched as above), then one asset per global stage, the shard ones over
    `shards_def`, with the code versions of the configured backend."""
    return [_partition_stages(partitions_def, code_versions, partitions_per_run, run_workers),
            *(_shard_asset(stage, shards_def, code_versions) if stage.sharded else _global_asset(stage, code_versions)
              for stage in catalog.GLOBAL)]
