"""`build_partitions`: the job `tkg build` runs to rebuild many partitions in one Dagster run.

The UI materialises one partition per run (each asset a step). For a whole corpus that costs
Dagster's per-run and per-step overhead 187 times over, so `tkg build` instead runs this one-op
job: the op builds the stale partitions in worker processes (`tkg.build.runner`) and records, as
each partition lands, a materialisation of every stage it rebuilt, with the same metadata,
code version and data version the asset itself would record. The UI shows every partition
materialised by this run, and staleness agrees between the two paths.
"""

from collections.abc import Callable

import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage, TranscriptSource, settings_of
from tkg.build import catalog
from tkg.build.runner import PartitionOutcome, PartitionTask, run_partitions
from tkg.core.partitions import parse_key
from tkg.core.versions import Stamp
from tkg_assets.assets.common import stage_metadata, version_tags
from tkg_assets.partitions import partition_key

# Who follows a build as its partitions land: `tkg build`'s progress bar, in its own process
# (the `progress` resource); nobody when the job runs elsewhere.
Progress = Callable[[PartitionOutcome], None]


def no_progress(outcome: PartitionOutcome) -> None:
    return None


class PartitionsToBuild(dg.Config):
    """Which stages of which partitions to rebuild, and why (from `tkg.build.plan`)."""

    stages: dict[str, list[str]]  # partition key -> stages
    reasons: dict[str, str] = {}
    workers: int = 1
    log_level: str = "WARNING"  # of tkg's loggers in the worker processes


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
    failed: list[PartitionOutcome] = []
    for outcome in run_partitions(settings.for_workers(config.workers), tasks, config.workers, config.log_level):
        progress(outcome)
        if not outcome.ok:
            failed.append(outcome)
            context.log.error(f"{outcome.key}: {outcome.error}" + (f"\n{outcome.detail}" if outcome.detail else ""))
            continue
        key = partition_key(outcome.task.company, outcome.task.quarter)
        for report in outcome.reports:
            yield dg.AssetMaterialization(asset_key=report.stage, partition=key, metadata=stage_metadata(report),
                                          tags=version_tags(catalog.stage(report.stage), Stamp.from_json(report.stamp)))
    if failed:
        raise dg.Failure(
            description=f"{len(failed)} of {len(tasks)} partition(s) failed and kept their last good output: "
                        + "; ".join(f"{outcome.key}: {outcome.error}" for outcome in failed[:5])
                        + (" ..." if len(failed) > 5 else ""),
            metadata={"failed_partitions": dg.MetadataValue.json({outcome.key: outcome.error for outcome in failed})},
        )


@dg.job(description="What `tkg build` runs: the stale partitions of the source, many per run, in worker processes. "
                    "Each stage's materialisation is recorded as if the asset had run.")
def build_partitions():
    build_stale_partitions()
