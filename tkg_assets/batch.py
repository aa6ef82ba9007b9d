"""The jobs `tkg build` runs: `build_partitions` rebuilds many partitions in one Dagster run,
and `refresh_graph` runs the global half (global and shard steps) in another; and the one the
`tkg_automation` sensor runs after a backfill: `refresh_and_publish`, the global half and the
publish in one run. The weekly schedule asks for `build_partitions` runs too.

`tkg build` runs this one-op job: the op builds the stale partitions in worker processes
(`tkg.build.runner`) and records, as each partition lands, a materialisation of every stage it
rebuilt, with the same metadata, code version and data version the asset itself would record.
The UI shows every partition materialised by this run, and staleness agrees between the two
paths. A UI backfill's runs (the `partition_stages` multi-asset) record their partitions with
the same `record_partitions`, so a partition looks the same whichever path built it.

`refresh_graph` does the same for the global half: each global step that does not cover its
inputs runs in the op's process (its set work spills to disk), and each stale shard of a shard
step runs in a worker process of its own, so a shard's memory is its own (on a small store,
below IN_PROCESS_BYTES of input, the shards run in the op's process instead); every step and
shard it ran is recorded as a materialisation. Steps and shards already current are skipped:
a change reruns only what it reaches. `refresh_and_publish` then publishes the warehouse and
describes the SQL models in the same step, recording them as their assets would; a step that
failed leaves nothing published.
"""

from collections.abc import Callable, Iterator

import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage, TranscriptSource, settings_of
from tkg.build import catalog
from tkg.build.runner import (
    GlobalTask,
    PartitionOutcome,
    PartitionTask,
    ShardTask,
    build_one,
    run_partitions,
)
from tkg.build.stages import Runtime, stale_work
from tkg.build.state import partitions_listed_once
from tkg.core.machine import usable_cores
from tkg.core.partitions import parse_key
from tkg.core.versions import Stamp
from tkg.settings import Settings
from tkg_assets.assets.common import stage_metadata, version_tags
from tkg_assets.assets.warehouse import publish_events
from tkg_assets.instance import DUCKDB_POOL
from tkg_assets.partitions import partition_key

# Who follows a build as its partitions land, and its notices (a Batch API job submitted, its
# progress: tkg.build.runner): `tkg build`'s progress bar, in its own process (the `progress`
# resource); nobody when the job runs elsewhere, where the run log has the notices.
Progress = Callable[[PartitionOutcome | str], None]


def no_progress(outcome: PartitionOutcome | str) -> None:
    return None


def notices_for(log, progress: Progress):
    """What passes a notice on: to the run log (Dagster's, at INFO) and to `progress`."""
    def notice(line: str) -> None:
        log.info(line)
        progress(line)
    return notice


class PartitionsToBuild(dg.Config):
    """Which stages of which partitions to rebuild, and why (from `tkg.build.plan`)."""

    stages: dict[str, list[str]]  # partition key -> stages
    reasons: dict[str, str] = {}
    workers: int = 1
    log_level: str = "WARNING"  # of tkg's loggers in the worker processes


def materialisations(outcome: PartitionOutcome) -> list[dg.AssetMaterialization]:
    """What the assets themselves would record for a partition's stages, a shard or a global
    step that landed: metadata, code version and data version."""
    task = outcome.task
    partition = partition_key(task.company, task.quarter) if isinstance(task, PartitionTask) else getattr(task, "shard", None)
    return [dg.AssetMaterialization(asset_key=report.stage, partition=partition, metadata=stage_metadata(report),
                                    tags=version_tags(catalog.stage(report.stage), Stamp.from_json(report.stamp),
                                                      report.input_versions))
            for report in outcome.reports]


def record_partitions(log, settings: Settings, tasks: list[PartitionTask] | list[ShardTask], workers: int,
                      log_level: str = "WARNING", progress: Progress = no_progress) -> Iterator[dg.AssetMaterialization]:
    """Build `tasks` (partitions, or shards of a shard stage) with tkg build's worker pool
    (`workers` processes; one: this process) and yield, as each lands, its materialisations.
    One that fails is logged with its error and leaves its last good output; once the others
    have landed, a Failure lists them all, so Dagster marks exactly those partitions failed (a
    ranged run's failed partitions are the ones it planned and did not materialise)."""
    failed: list[PartitionOutcome] = []
    for outcome in run_partitions(settings.for_workers(workers), tasks, workers, log_level,
                                  on_notice=notices_for(log, progress)):
        progress(outcome)
        if not outcome.ok:
            failed.append(outcome)
            log.error(f"{outcome.key}: {outcome.error}" + (f"\n{outcome.detail}" if outcome.detail else ""))
            continue
        yield from materialisations(outcome)
    if failed:
        raise dg.Failure(
            description=f"{len(failed)} of {len(tasks)} partition(s) failed and kept their last good output: "
                        + "; ".join(f"{outcome.key}: {outcome.error}" for outcome in failed[:5])
                        + (" ..." if len(failed) > 5 else ""),
            metadata={"failed_partitions": dg.MetadataValue.json({outcome.key: outcome.error for outcome in failed})},
        )


@dg.op(out={}, description="Rebuild the stale stages of many partitions in worker processes, and record each stage's "
                   "materialisation as its partition lands.")
def build_stale_partitions(context: dg.OpExecutionContext, config: PartitionsToBuild, storage: TkgStorage,
                           source: TranscriptSource, extraction: ExtractionBackend, progress: dg.ResourceParam[Progress]):
    tasks = []
    for key, stages in config.stages.items():
        company, quarter = parse_key(key)
        tasks.append(PartitionTask(company, quarter, tuple(stages), config.reasons.get(key, "")))
    settings = settings_of(storage, source, extraction)
    context.log.info(f"building {len(tasks)} partition(s) with {config.workers} worker(s); {settings.describe()}")
    yield from record_partitions(context.log, settings, tasks, config.workers, config.log_level, progress)


@dg.job(description="What `tkg build` runs: the stale partitions of the source, many per run, in worker processes. "
                    "Each stage's materialisation is recorded as if the asset had run.")
def build_partitions():
    build_stale_partitions()


class GlobalSteps(dg.Config):
    """How `refresh_graph` runs the global half."""

    workers: int = 1  # processes running shards side by side; 0: one per core where the run runs
    log_level: str = "WARNING"  # of tkg's loggers in the worker processes


# Shard steps over less input than this run their shards in the op's process: starting worker
# processes (each imports tkg) costs more than a small store's shards take, e.g. 22 s against
# 4 s for the bundled sample's global half on a loaded two-core machine.
IN_PROCESS_BYTES = 64 * 2**20


def shard_input_bytes(settings: Settings, stage: catalog.Stage) -> int:
    """The bytes of Parquet a shard step reads, over all its shards."""
    store = settings.store()
    return sum(size for name in stage.inputs for size, _ in store.listing(f"{name}/**/*.parquet").values())


class RefreshAndPublish(GlobalSteps):
    """How `refresh_and_publish` runs the global half: by default, as the shard assets do, one
    shard process per core of the machine the run runs on."""

    workers: int = 0


def refresh_global(log, settings: Settings, config: GlobalSteps, api_key: str | None,
                   on_notice: Callable[[str], None] | None = None) -> Iterator[dg.AssetMaterialization]:
    """Run the global and shard steps that do not cover their inputs, in catalog order, and
    yield each one's materialisations; `on_notice` gets the steps' notices (Batch API progress).
    A step that fails raises a Failure once its other shards have landed: nothing after it
    runs, and the graph keeps its last good contents."""
    runtime = Runtime.open(settings, api_key=api_key)
    # The global steps write no partition: the partitions' stamps are listed once for all of them.
    with partitions_listed_once(runtime.store):
        yield from _run_global_steps(log, runtime, config, on_notice)


def _run_global_steps(log, runtime: Runtime, config: GlobalSteps,
                      on_notice: Callable[[str], None] | None) -> Iterator[dg.AssetMaterialization]:
    settings = runtime.settings
    cores = config.workers or usable_cores()
    upstream_ran = False
    for stage in catalog.GLOBAL:
        stale = stale_work(runtime, stage)
        # After a step before it ran, a shard whose rows did not change is recorded as kept (its
        # run only looks at its stamp), so the UI sees it current against its inputs' new versions.
        kept = [shard for shard in catalog.shard_keys(settings.shards) if shard not in stale] \
            if stage.sharded and upstream_ran else []
        if not stale and not kept:
            log.info(f"{stage.name}: current, skipped")
            continue
        running = f"running {', '.join(stale) if stage.sharded else 'over every partition'}" if stale else "nothing to run"
        log.info(f"{stage.name}: {running}" + (f"; shards {', '.join(kept)} kept" if kept else ""))
        if stage.sharded:
            tasks = [ShardTask(stage.name, shard) for shard in stale]
            workers = cores if shard_input_bytes(settings, stage) > IN_PROCESS_BYTES else 1
            outcomes = list(run_partitions(settings.for_workers(workers), tasks, workers, config.log_level,
                                           on_notice=on_notice))
            outcomes += [build_one(settings, ShardTask(stage.name, shard)) for shard in kept]
        else:
            outcomes = [build_one(settings, GlobalTask(stage.name))]
        upstream_ran = upstream_ran or bool(stale)
        failed = [outcome for outcome in outcomes if not outcome.ok]
        for outcome in outcomes:
            if outcome.ok:
                yield from materialisations(outcome)
        if failed:
            raise dg.Failure(
                description=f"{stage.name}: {len(failed)} of {len(outcomes)} run(s) failed; the graph keeps its last good "
                            "contents: " + "; ".join(f"{outcome.key}: {outcome.error}" for outcome in failed[:5]),
                metadata={"failed": dg.MetadataValue.json({outcome.key: outcome.error for outcome in failed})})


@dg.op(out={}, description="Run the global and shard steps that do not cover their inputs (shards in worker processes), "
                   "and record each one's materialisation.")
def refresh_global_steps(context: dg.OpExecutionContext, config: GlobalSteps, storage: TkgStorage, source: TranscriptSource,
                         extraction: ExtractionBackend, progress: dg.ResourceParam[Progress]):
    yield from refresh_global(context.log, settings_of(storage, source, extraction), config, extraction.api_key,
                              notices_for(context.log, progress))


@dg.job(description="What `tkg build` runs after the partitions: the global steps and every stale shard of the shard "
                    "steps (resolution, invalidation, retention). Each is recorded as if its asset had run.")
def refresh_graph():
    refresh_global_steps()


@dg.op(out={}, pool=DUCKDB_POOL,
       description="The global half, then one publish: run the global and shard steps that do not cover their inputs, "
                   "publish tkg.duckdb with its checks and describe the SQL models, recording each as its asset would.")
def refresh_and_publish_graph(context: dg.OpExecutionContext, config: RefreshAndPublish, storage: TkgStorage,
                              source: TranscriptSource, extraction: ExtractionBackend):
    settings = settings_of(storage, source, extraction)
    context.log.info(f"refreshing the global half, then publishing; {settings.describe()}")
    yield from refresh_global(context.log, settings, config, extraction.api_key, notices_for(context.log, no_progress))
    yield from publish_events(context, settings)


@dg.job(description="What the `tkg_automation` sensor runs once partitions have landed and nothing is running: the "
                    "global half and the publish in ONE run (one start-up, one publish at the end; a failing step or "
                    "blocking check publishes nothing).")
def refresh_and_publish():
    refresh_and_publish_graph()
