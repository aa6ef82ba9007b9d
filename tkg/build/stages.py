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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

import duckdb
import pyarrow as pa

from tkg.build import catalog
from tkg.build.catalog import Stage
from tkg.build.state import (
    HalfBuilt,
    global_inputs,
    outside_versions,
    partitions_listed_once,
    stage_path,
    stage_version,
    stale_inputs,
    stale_stage,
    state_for,
)
from tkg.core import tables
from tkg.core.ids import short_hash
from tkg.core.machine import MemoryExceeded, duckdb_room_given, memory_released, memory_watch, room_for_duckdb
from tkg.core.partitions import Partition, key_of
from tkg.core.results import StageIncomplete, StageJob, StageResult, missing_text
from tkg.core.versions import Stamp, stamp_of_schema, stamped
from tkg.ingest.parsing import SourceRow
from tkg.llm.wire import RequestFailed
from tkg.providers import Providers, fingerprints, open_providers
from tkg.settings import Settings, size_in_bytes
from tkg.store.parquet import ParquetStore, relation_batches
from tkg.store.splits import SplitRows, rewrites_stacked, shard_files, write_splits


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
                 quarter: date | None = None, shard: str | None = None) -> None:
    """Write the LLM accounting of the steps that made requests, one file per step (and
    partition, or shard); offline steps have none."""
    now = datetime.now(timezone.utc)
    by_step: dict[str, list[dict]] = {}
    for row in usage:
        by_step.setdefault(row["step"], []).append({**row, "company": company, "quarter": quarter, "recorded_at": now})
    for step, rows in by_step.items():
        store.write(store.usage_path(step, company, quarter, shard), tables.to_table(rows, tables.LLM_CALLS))


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
                    downstream: bool = True, without_call: bool = False) -> dict[str, StageResult]:
    """Rebuild the stages `names` of one partition (with everything downstream of them unless
    `downstream` is False): compute them all in memory, reading the others from the store, and
    write them only when all succeeded. Stages of one wave (validity ranges, triplets and
    figures all need only the statements) run side by side, so the LLM path keeps all their
    requests in flight.

    A partition `without_call` (LoadedSource.without_call) stores nothing: every stage is
    computed in memory from no rows (no provider request), whatever `names` asks for, and the
    partition's files, if an earlier call left any, are removed. Its results (no rows, with
    their stamps) are what a Dagster run records for it; the global half reads only the
    partitions that hold a call, as after `tkg build`, which never builds such a partition."""
    store, company = runtime.store, partition[0]
    names = catalog.downstream_of(names) if downstream else set(names)
    wanted = names
    if without_call:
        names = set(catalog.PARTITIONED_NAMES)  # none is read from the store
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
        if without_call:
            store.delete(stage_path(store, stage, partition))
        elif stage.name in results:
            result = results[stage.name]
            result.path = store.write(stage_path(store, stage, partition), stamped(result.table, result.stamp))
    return {name: result for name, result in results.items() if name in wanted}


def run_global(runtime: Runtime, stage: Stage, shard: str | None = None) -> StageResult:
    """A global stage over every partition of a whole store, once the global and shard stages
    it reads cover the partitions; or one shard of a shard stage, once they are current with
    each other (`stale_inputs`). Its tables are written
    with one stamp, the stamp table last; a global stage's tables split by shard go first, to a
    folder of their version, which the stamp then commits (older versions are removed). It
    writes no partition, so it lists the partitions once (`partitions_listed_once`)."""
    with partitions_listed_once(runtime.store):
        return _run_global(runtime, stage, shard)


def _run_global(runtime: Runtime, stage: Stage, shard: str | None) -> StageResult:
    store, settings = runtime.store, runtime.settings
    shard_keys = shard_keys_of(settings)
    state, versions = state_for(store, stage, shard_keys, shard is not None)
    problems = stale_inputs(stage, state, versions)
    if problems:
        raise HalfBuilt(f"{stage.name}{' shard ' + shard if shard else ''} cannot run yet: {'; '.join(problems)}")
    upstream = {name: stage_version(catalog.stage(name), state, versions) for name in stage.inputs}
    stamp = Stamp(stage.name, runtime.code_versions[stage.name], global_inputs(stage, state, versions, shard))
    kept = _kept(store, stage, shard, stamp) if shard is not None else None
    if kept is not None:  # kept as it is, whatever the limit: nothing is read, so nothing is too big
        kept.input_versions = upstream
        return kept
    if shard is not None:
        check_memory_limit(store, stage, shard, upstream, settings)
    usage: list[dict[str, Any]] = []
    what = f"{stage.name}{' shard ' + shard if shard else ''}"
    limit = size_in_bytes(settings.memory_limit, "TKG_MEMORY_LIMIT")
    advice = "more shards (TKG_SHARDS) make each smaller" if shard else "TKG_STEP_MEMORY bounds its DuckDB part"
    # The watch covers the writes too: an output that is a DuckDB relation is computed as it is written.
    # What the step freed goes back to the system once its connection is closed, before the next
    # step or shard this process runs.
    with (memory_released(), settings.spilling_connection() as connection,
          memory_watch(limit, f"{what} (TKG_MEMORY_LIMIT={settings.memory_limit}; {advice})", connection.interrupt),
          _duckdb_memory_named(what, settings, shard)):
        job = StageJob(None, {}, runtime.providers, allow_partial=settings.allow_partial, store=store, connection=connection,
                       shard=shard, shard_keys=shard_keys, versions=upstream, previous=_trusted_previous(store, stage, shard, stamp))
        try:
            result = compute(stage, job, usage)
        finally:
            record_usage(store, usage, shard=shard)
        result.stamp = Stamp(stage.name, stamp.code_version, stamp.inputs, dict(result.missing))
        with room_for_duckdb(connection):  # outputs that are relations run as they are written, beside the step's objects
            keep = _write_outputs(store, connection, stage, shard, shard_keys, job, result)
        result.input_versions = upstream
    if stage.shard_tables:  # the stamp now names the new version: the ones it does not stack are read by nobody
        for version in store.versions_of(stage.name):
            if version not in keep:
                store.delete_folder(store.parquet_root / stage.name / f"v={version}")
    return result


def _write_outputs(store: ParquetStore, connection: duckdb.DuckDBPyConnection, stage: Stage, shard: str | None,
                   shard_keys: list[str], job: StageJob, result: StageResult) -> set[str]:
    """Write a global stage's or shard's tables, its split tables first (their stamp then names
    their version); the split versions to keep."""
    keep: set[str] = set()
    if stage.shard_tables:
        previous = _previous_version(store, stage, job.previous)
        if previous is not None and rewrites_stacked(store, stage.name, previous, result.stamp.version):
            # the last output stops being trusted before files it stacks are replaced: a run stopped
            # between them leaves no output over half of them, and the next run starts from nothing
            store.delete(store.global_path(stage.name, stage.table.name))
        written = write_splits(store, connection, stage.name, result.stamp.version,
                               [_split_rows(result.shard_tables[table.name]).split(table.name, table.schema, table.key)
                                for table in stage.shard_tables],
                               previous, shard_keys)
        result.stamp = Stamp(stage.name, result.stamp.code_version, result.stamp.inputs, dict(result.missing), written.parts)
        result.counts["split_rows_written"] = written.rows
        result.counts["split_written_as_delta"] = int(written.delta)
        keep = written.keep
    outputs = result.tables or {stage.table.name: result.table}
    for table in stage.tables:
        path = (store.shard_path(stage.name, shard, table.name) if stage.sharded
                else store.global_path(stage.name, table.name))
        result.path = store.write(path, _conformed(outputs[table.name], table.schema, result.stamp))
    if stage.sharded:  # a table an older tkg wrote in the shard's folder and this one does not
        written = {f"{table.name}.parquet" for table in stage.tables}
        for path in store.files(f"{stage.name}/shard={shard}/*.parquet"):
            if path.name not in written:
                store.delete(path)
    return keep


# What a shard step holds per byte of its input's decoded Parquet (Arrow tables, the numpy
# copies of its vectors and keys, the products' chunks), and what the process holds anyway;
# measured on the 1M-event benchmark store (benchmarks/README.md).
SHARD_MEMORY_FACTOR = 3.0
PROCESS_BASE = 500 * 10**6


class ShardTooBig(RuntimeError):
    """A shard's input is more than a shard step may hold (TKG_MEMORY_LIMIT)."""


def shard_input(store: ParquetStore, stage: Stage, shard: str, upstream: dict[str, str]) -> tuple[int, int]:
    """The rows and decoded bytes a shard step reads (its shard of the split tables it reads),
    from the files' footers."""
    rows = size = 0
    for name in stage.inputs:
        for table in catalog.stage(name).shard_tables:
            for path in shard_files(store, name, upstream[name], table.name, shard):
                metadata = store.metadata(path)
                rows += metadata.num_rows
                size += sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    return rows, size


def check_memory_limit(store: ParquetStore, stage: Stage, shard: str, upstream: dict[str, str], settings: Settings) -> None:
    """Fail before starting, naming the shard and its size, when a shard step would need more
    memory than TKG_MEMORY_LIMIT: a clear error, never a machine that swaps until it dies."""
    rows, size = shard_input(store, stage, shard, upstream)
    need = int(size * SHARD_MEMORY_FACTOR) + PROCESS_BASE
    limit = size_in_bytes(settings.memory_limit, "TKG_MEMORY_LIMIT")
    if need > limit:
        raise ShardTooBig(
            f"{stage.name} shard {shard} is too big for one process: {rows:,} input rows, {size / 1e9:.2f} GB decoded, "
            f"about {need / 1e9:.1f} GB to run, over TKG_MEMORY_LIMIT={settings.memory_limit}. Split the work into more "
            f"shards (TKG_SHARDS, now {settings.shards}) or allow more memory per shard (TKG_MEMORY_LIMIT) on a machine "
            "that has it; the other shards and the published graph are kept")


def _kept(store: ParquetStore, stage: Stage, shard: str, expected: Stamp) -> StageResult | None:
    """A shard's output as it stands, when it was built from exactly what it would be built
    from now and is complete: nothing to redo (a backfill or automation run over every shard
    costs a look at the stamps for the shards whose rows did not change). None when it must run."""
    path = store.shard_path(stage.name, shard, stage.table.name)
    current = store.stamp(path) if store.is_file(path) else None
    if (current is None or current.code_version != expected.code_version or current.inputs != expected.inputs
            or not current.complete):
        return None
    return StageResult(stage.table.schema.empty_table(), stamp=current, path=path, rows=store.metadata(path).num_rows,
                       notes=["its inputs did not change since it was built: kept as it is"])


def _split_rows(rows: Any) -> SplitRows:
    """What a stage gave for a split table: a relation, or its rows with how to hash them."""
    return rows if isinstance(rows, SplitRows) else SplitRows(rows)


def _previous_version(store: ParquetStore, stage: Stage, previous: dict[str, Any]) -> str | None:
    """The version of a global step's split tables the store holds, when its last output is
    one the new version may stand on (`_trusted_previous`)."""
    stamp = store.stamp(previous[stage.table.name]) if previous else None
    return stamp.version if stamp else None


def _trusted_previous(store: ParquetStore, stage: Stage, shard: str | None, stamp: Stamp) -> dict[str, Any]:
    """The stage's last output files (by table name) if one complete run of the same code and
    the same settings wrote them all (their stamps agree; a memo table an older tkg did not write
    is left out), else nothing: a partial output (items the provider never answered) is never reused."""
    paths = {table.name: path for table in stage.tables
             for path in [store.shard_path(stage.name, shard, table.name) if stage.sharded
                          else store.global_path(stage.name, table.name)]
             if not table.memo or store.is_file(path)}
    stamps = [store.stamp(path) if store.is_file(path) else None for path in paths.values()]
    first = stamps[0]
    if (first is None or any(other != first for other in stamps) or first.code_version != stamp.code_version
            or not first.complete):
        return {}
    settings_of = {key: value for key, value in stamp.inputs.items() if key not in stage.inputs}
    if {key: value for key, value in first.inputs.items() if key not in stage.inputs} != settings_of:
        return {}
    return paths


def stale_work(runtime: Runtime, stage: catalog.Stage) -> list[str]:
    """What of a global or shard stage must run: ['*'] for a global stage that does not cover
    its inputs, the shards of a shard stage that do not; [] when it is current."""
    state, versions = state_for(runtime.store, stage, shard_keys_of(runtime.settings), stage.sharded)
    if not stage.sharded:
        return ["*"] if stale_stage(stage, state, versions, runtime.code_versions) else []
    return [key for key, stamp in state.shards[stage.name].items()
            if stamp is None or stamp.code_version != runtime.code_versions[stage.name] or not stamp.complete
            or stamp.inputs != global_inputs(stage, state, versions, key)]


@contextmanager
def _duckdb_memory_named(what: str, settings: Settings, shard: str | None) -> Iterator[None]:
    """DuckDB's out-of-memory error as a message that names the step or shard, its limit and
    the way past it (DuckDB spills sorts, joins and aggregates; what it could not spill was
    bigger than TKG_STEP_MEMORY, or the spill passed TKG_STEP_DISK)."""
    try:
        yield
    except duckdb.OutOfMemoryException as error:
        smaller = "more shards (TKG_SHARDS, now " + str(settings.shards) + ") make each smaller, or " if shard else ""
        if "max_temp_directory_size" in str(error):
            raise MemoryExceeded(f"{what}: DuckDB spilled more than TKG_STEP_DISK={settings.step_disk or 'half the free disk'} "
                                 f"to disk ({str(error).splitlines()[0]}); {smaller}free disk space or raise "
                                 "TKG_STEP_DISK") from error
        room = duckdb_room_given(error)
        if room is not None:  # lowered beside the step's other memory
            raise MemoryExceeded(f"{what}: DuckDB needed more than the {room / 1e9:.2f} GB its other memory left it under "
                                 f"TKG_MEMORY_LIMIT={settings.memory_limit} ({str(error).splitlines()[0]}); "
                                 f"{smaller}raise TKG_MEMORY_LIMIT") from error
        raise MemoryExceeded(f"{what}: DuckDB needed more than TKG_STEP_MEMORY={settings.step_memory} "
                             f"({str(error).splitlines()[0]}); {smaller}raise TKG_STEP_MEMORY") from error


def shard_keys_of(settings: Settings) -> list[str]:
    return catalog.shard_keys(settings.shards)


def _conformed(output: Any, schema: pa.Schema, stamp: Stamp | None) -> pa.Table | pa.RecordBatchReader:
    """An output as `schema` (with `stamp` in its metadata): a table, or a stream of batches for
    a DuckDB relation."""
    if isinstance(output, pa.Table):
        return stamped(output.cast(schema), stamp) if stamp else output.cast(schema)
    return relation_batches(output, stamped(schema.empty_table(), stamp).schema if stamp else schema)
