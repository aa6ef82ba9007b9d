"""The global steps (resolution, invalidation, retention, the warehouse) and building a graph
without Dagster, as a library call.

The global steps read every partition of the store, and only a whole store (tkg.build.state): a
partition that a failure or a kill left half-built stops them with a clear error, so
tkg.duckdb is never published from a mix of new and old stages.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import duckdb

from tkg.build import catalog
from tkg.build.stages import Runtime, build_partition, run_global, stale_work
from tkg.build.state import (
    HalfBuilt,
    consistent_versions,
    partial_partitions,
    read_state,
    stale_globals,
    warehouse_inputs,
)
from tkg.core.partitions import Partition
from tkg.core.results import StageResult
from tkg.core.versions import Stamp
from tkg.ingest.sources import LoadedSource
from tkg.settings import Settings
from tkg.store.warehouse import PublishResult, publish, warehouse_code_version


def run_warehouse(settings: Settings, target: Path | None = None,
                  check: Callable[[duckdb.DuckDBPyConnection], None] | None = None) -> PublishResult:
    """Publish tkg.duckdb from the Parquet tree, once every partition is whole and the global
    steps cover them; `check` guards the new file before it replaces the old one. The file
    records the model the statement vectors come from (raw.build_info)."""
    store = settings.store()
    state = read_state(store, catalog.shard_keys(settings.shards))
    versions = consistent_versions(state)
    reasons = stale_globals(versions, state)
    if reasons:
        raise HalfBuilt(f"the global steps do not cover the current partitions ({'; '.join(reasons)}); "
                        "materialise them before the warehouse")
    missing = Counter()
    for stamp in [*state.globals.values(), *(s for by_shard in state.shards.values() for s in by_shard.values())]:
        missing.update(stamp.missing)
    for lacking in partial_partitions(state).values():
        missing.update(lacking)
    stamp = Stamp("warehouse", warehouse_code_version(), warehouse_inputs(versions, state), dict(missing))
    return publish(store, target or settings.warehouse, catalog.raw_tables(), stamp=stamp, check=check,
                   info={"embedder": settings.embedder_name()}, memory_limit=settings.duckdb_memory,
                   disk_limit=settings.duckdb_disk((target or settings.warehouse).parent))


@dataclass
class BuildReport:
    partitions: list[Partition]
    counts: Counter = field(default_factory=Counter)
    publish: PublishResult | None = None


def partitions_of(source: LoadedSource, companies: set[str] | None = None, since: date | None = None,
                  until: date | None = None) -> list[Partition]:
    """(company, quarter) keys with at least one call matching the filters, oldest first."""
    return [
        (company, quarter) for company, quarter in source.partitions()
        if (not companies or company in companies)
        and any((since is None or row.call_date >= since) and (until is None or row.call_date <= until)
                for row in source.rows_for(company, quarter))
    ]


def run_partition(runtime: Runtime, partition: Partition, source: LoadedSource) -> dict[str, StageResult]:
    """Every partitioned stage of one company x quarter."""
    return build_partition(runtime, partition, set(catalog.PARTITIONED_NAMES), source.rows_for(*partition))


def build_graph(runtime: Runtime, source: LoadedSource, partitions: list[Partition], publish_to: Path | None = None,
                concurrent_partitions: int = 1, make_runtime: Callable[[], Runtime] | None = None) -> BuildReport:
    """Every stage without Dagster, then the global stages (and the warehouse, when
    `publish_to` is given).

    With `concurrent_partitions` > 1, partitions run in threads, each with its own runtime from
    `make_runtime()` (LLM providers share one client per process, so one limiter bounds the
    requests of all of them); that is what parallel partition runs do under Dagster."""
    report = BuildReport(partitions=list(partitions))

    def one(partition: Partition) -> dict[str, StageResult]:
        return run_partition(make_runtime() if make_runtime else runtime, partition, source)

    if concurrent_partitions > 1:
        with ThreadPoolExecutor(max_workers=concurrent_partitions, thread_name_prefix="tkg-partition") as pool:
            outcomes = list(pool.map(one, partitions))
    else:
        outcomes = [one(partition) for partition in partitions]
    for results in outcomes:
        for name, result in results.items():
            report.counts[f"{name}_rows"] += result.table.num_rows
    return finish_graph(runtime, report, publish_to)


def finish_graph(runtime: Runtime, report: BuildReport | None = None, publish_to: Path | None = None) -> BuildReport:
    """The global stages that do not cover their inputs, in catalog order (a shard stage's stale
    shards one by one, in this process), then (optionally) the warehouse."""
    report = report or BuildReport(partitions=[])
    for stage in catalog.GLOBAL:
        for shard in stale_work(runtime, stage):
            report.counts.update(run_global(runtime, stage, None if shard == "*" else shard).counts)
    if publish_to is not None:
        report.publish = run_warehouse(runtime.settings, publish_to)
    return report
