"""Running stages: read a stage's inputs, compute it, stamp it, write it.

- `build_partition` rebuilds stages of one partition (and, by default, everything downstream of
  them): it computes them all in memory, reading the others from the store, and writes them
  only when every one succeeded, so a failure or a kill never leaves a partition half rebuilt.
  `tkg build`'s workers run it for whole partitions, a Dagster asset for its one stage.
- `run_global` runs a global stage over every partition of a whole store.

Around a stage's function, `compute` measures the usage counters its catalog row declares: the
LLM usage is written beside the output (`llm_calls`) even when the stage fails, and items the
provider never answered make the stage incomplete (`StageIncomplete`: nothing is written, the
last good output is kept) unless a partial result was asked for; the stamp then records what is
missing and the partition stays stale until a rerun completes it.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

import pyarrow as pa

from tkg.build import catalog
from tkg.build.catalog import Stage
from tkg.build.state import (
    HalfBuilt,
    consistent_versions,
    global_inputs,
    global_stamps,
    outside_versions,
    stage_path,
    stale_inputs,
)
from tkg.core import tables
from tkg.core.partitions import Partition, key_of
from tkg.core.results import StageIncomplete, StageJob, StageResult, missing_text
from tkg.core.versions import Stamp, stamp_of_schema, stamped
from tkg.ingest.parsing import SourceRow
from tkg.llm.client import RequestFailed
from tkg.providers import Providers, fingerprints, open_providers
from tkg.settings import Settings
from tkg.store.parquet import ParquetStore


@dataclass
class Runtime:
    """What a process builds with: its settings, their providers and code versions, the store."""

    settings: Settings
    providers: Providers
    code_versions: dict[str, str]
    store: ParquetStore

    @classmethod
    def open(cls, settings: Settings, api_key: str | None = None, providers: Providers | None = None) -> Runtime:
        return cls(settings, providers or open_providers(settings, api_key), catalog.code_versions(fingerprints(settings)),
                   settings.store())


def compute(stage: Stage, job: StageJob, usage: list[dict[str, Any]]) -> StageResult:
    """Run `stage`'s function on `job`. The usage its counters measured is appended to `usage`
    (also when it fails) and kept on the result."""
    providers: Providers = job.providers
    where = key_of(*job.partition) if job.partition else None
    counters = {name: providers.stats(name) for name in stage.counters}
    before = {name: stats.snapshot() for name, stats in counters.items() if stats is not None}
    deltas = {}
    try:
        result = stage.compute(job)
    except RequestFailed as error:
        raise StageIncomplete(stage.name, where, f"the provider did not answer ({error}); rerun to retry") from error
    finally:
        for name, earlier in before.items():
            deltas[name] = counters[name].since(earlier)
            row = providers.usage_row(name, deltas[name])
            if row is not None:
                usage.append({**row, "step": stage.name})
    result.usage = [row for row in usage if row["step"] == stage.name]
    missing: Counter = Counter()
    last_error = ""
    for delta in deltas.values():
        missing.update(delta.unanswered_items)
        last_error = delta.last_error or last_error
        for key, value in (("llm_requests", delta.requests), ("llm_cache_hits", delta.cache_hits),
                           ("dropped_items", delta.dropped_total)):
            result.metadata[key] = result.metadata.get(key, 0) + value
    if missing:
        if not job.allow_partial:
            raise StageIncomplete(stage.name, where, f"{missing_text(missing)} (last error: {last_error or 'none'}); "
                                  "rerun to retry only those, or allow a partial result", dict(missing))
        result.missing.update(missing)
        result.notes.append(f"partial: {missing_text(missing)}")
    return result


def record_usage(store: ParquetStore, usage: list[dict[str, Any]], company: str | None = None,
                 quarter: date | None = None) -> None:
    """Write the LLM accounting of the steps that made requests, one file per step (and
    partition); offline steps have none."""
    now = datetime.now(timezone.utc)
    by_step: dict[str, list[dict]] = {}
    for row in usage:
        by_step.setdefault(row["step"], []).append({**row, "company": company, "quarter": quarter, "recorded_at": now})
    for step, rows in by_step.items():
        store.write(store.usage_path(step, company, quarter), tables.to_table(rows, tables.LLM_CALLS))


def read_partition(store: ParquetStore, stage: Stage, partition: Partition) -> pa.Table:
    path = stage_path(store, stage, partition)
    if not store.is_file(path):
        raise FileNotFoundError(
            f"{stage.name} for partition {key_of(*partition)} has not been materialised ({store.display(path)}); "
            f"materialise `{stage.name}` for this partition first"
        )
    return store.read(path)


def _waves(names: set[str]) -> list[list[Stage]]:
    """The stages of `names` in waves: each wave's stages read only stages of earlier waves (or
    stored ones), so they can run side by side."""
    pending = [stage for stage in catalog.PARTITIONED if stage.name in names]
    done: set[str] = set()
    waves = []
    while pending:
        wave = [stage for stage in pending if all(upstream in done or upstream not in names for upstream in stage.inputs)]
        waves.append(wave)
        done.update(stage.name for stage in wave)
        pending = [stage for stage in pending if stage.name not in done]
    return waves


def build_partition(runtime: Runtime, partition: Partition, names: set[str], rows: list[SourceRow] | None = None,
                    downstream: bool = True) -> dict[str, StageResult]:
    """Rebuild the stages `names` of one partition (with everything downstream of them unless
    `downstream` is False): compute them all in memory, reading the others from the store, and
    write them only when all succeeded. Stages of one wave (validity ranges, triplets and
    figures all need only the statements) run side by side, so the LLM path keeps all their
    requests in flight."""
    store, company = runtime.store, partition[0]
    names = catalog.downstream_of(names) if downstream else set(names)
    results: dict[str, StageResult] = {}
    inputs: dict[str, pa.Table] = {}
    stamps: dict[str, Stamp | None] = {}
    usage: list[dict[str, Any]] = []

    def table(name: str) -> pa.Table:
        if name not in inputs:
            inputs[name] = read_partition(store, catalog.stage(name), partition)
            stamps[name] = stamp_of_schema(inputs[name].schema)  # the file carries its stamp
        return inputs[name]

    def one(stage: Stage) -> StageResult:
        versions = outside_versions(stage, rows, company)
        for upstream in stage.inputs:
            if stamps.get(upstream) is None:
                raise FileNotFoundError(f"{upstream} of {key_of(*partition)} carries no version (it was written by an "
                                        "older tkg); rebuild the partition with `tkg build --force`")
            versions[upstream] = stamps[upstream].version
        job = StageJob(partition, {upstream: inputs[upstream] for upstream in stage.inputs}, runtime.providers, rows or [],
                       runtime.settings.allow_partial)
        result = compute(stage, job, usage)
        result.stamp = Stamp(stage.name, runtime.code_versions[stage.name], versions, dict(result.missing))
        return result

    try:
        for wave in _waves(names):
            for upstream in {upstream for stage in wave for upstream in stage.inputs}:
                table(upstream)  # read once, before the threads share it
            if len(wave) > 1:
                with ThreadPoolExecutor(max_workers=len(wave), thread_name_prefix=f"tkg-{company}") as pool:
                    done = [pool.submit(one, stage) for stage in wave]
                    finished = [future.result() for future in done]
            else:
                finished = [one(wave[0])]
            for stage, result in zip(wave, finished):
                results[stage.name], inputs[stage.name], stamps[stage.name] = result, result.table, result.stamp
    finally:  # what was asked of the provider is accounted even when the partition fails
        record_usage(store, usage, *partition)
    for stage in catalog.PARTITIONED:
        if stage.name in results:
            result = results[stage.name]
            result.path = store.write(stage_path(store, stage, partition), stamped(result.table, result.stamp))
    return results


def run_global(runtime: Runtime, stage: Stage) -> StageResult:
    """A global stage over every partition of a whole store, once the global stages it reads
    cover the partitions; its tables are written with one stamp, the stamp table last."""
    store = runtime.store
    versions = consistent_versions(store)
    problems = stale_inputs(stage, store, versions)
    if problems:
        raise HalfBuilt(f"{stage.name} cannot run yet: {'; '.join(problems)}; materialise them first")
    usage: list[dict[str, Any]] = []
    job = StageJob(None, {}, runtime.providers, allow_partial=runtime.settings.allow_partial, store=store)
    try:
        result = compute(stage, job, usage)
    finally:
        record_usage(store, usage)
    result.stamp = Stamp(stage.name, runtime.code_versions[stage.name], global_inputs(stage, versions, global_stamps(store)),
                         dict(result.missing))
    outputs = result.tables or {stage.table.name: result.table}
    for table in stage.tables:
        result.path = store.write(store.global_path(stage.name, table.name), stamped(outputs[table.name], result.stamp))
    return result
