"""Partitioned stages: compute one from its input tables, stamp it with its version, write it.

Each stage is a pure function of in-memory tables (`compute_stage`). Two callers:
- a Dagster asset runs one stage of one partition: `run_stage` reads the inputs from the store
  and writes the output;
- `tkg build` rebuilds the stale stages of a partition in one go: `build_partition` computes
  them all in memory and writes them only when every one succeeded, so a failure or a kill
  never leaves a partition half rebuilt.

A stage that could not finish its work (the provider never answered some items, a source row
no longer parses) raises `StageIncomplete` and writes nothing, so the partition keeps its last
good output, unless a partial result was asked for (`allow_partial`); the stamp then records
what is missing and the partition stays stale until a rerun completes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path

import pyarrow as pa

from tkg.build.state import PARTITIONED_STAGES, STAGE_INPUTS, downstream_of, source_inputs, stage_code_versions
from tkg.core import tables
from tkg.core.companies import get_company
from tkg.core.embeddings import Embedder, WordLlamaEmbedder
from tkg.core.partitions import Partition, key_of
from tkg.core.versions import Stamp, stamped
from tkg.extract import stages as pipeline
from tkg.extract.base import Extractor, StageStats
from tkg.extract.stages import StageResult
from tkg.ingest.chunking import ChunkingSettings
from tkg.ingest.parsing import SourceRow
from tkg.ingest.sources import LoadedSource
from tkg.store.parquet import ParquetStore

# The counters (StageStats names) each stage's LLM work is accounted under.
STAGE_STATS = {"statements": ("statements",), "temporal_events": ("validity", "embeddings"),
               "triplets": ("triplets",), "figures": ("figures",), "entities": ("embeddings",)}
STEP_OF_STATS = {"statements": "statements", "validity": "temporal_events", "triplets": "triplets", "figures": "figures"}

@dataclass
class Components:
    """What the stages run with: extractor, embedders, chunking settings, and whether a partial
    result may be written when the extractor could not finish."""

    extractor: Extractor
    embedder: Embedder
    chunk_embedder: Embedder = field(default_factory=WordLlamaEmbedder)
    chunking: ChunkingSettings = field(default_factory=ChunkingSettings)
    allow_partial: bool = False

    @property
    def code_versions(self) -> dict[str, str]:
        return stage_code_versions(self.extractor.settings_fingerprint, self.embedder.name, self.chunk_embedder.name,
                                   self.chunking)

    def parts(self) -> tuple[object, ...]:
        return (self.extractor, self.embedder)


class StageIncomplete(RuntimeError):
    """A stage could not finish its work; nothing was written, the last good output is kept."""

    def __init__(self, stage: str, partition: Partition | None, reason: str, missing: dict[str, int] | None = None) -> None:
        self.stage, self.partition, self.reason, self.missing = stage, partition, reason, dict(missing or {})
        where = f"{stage} of {key_of(*partition)}" if partition else stage
        super().__init__(f"{where} is incomplete: {reason}; its last good output is kept")


def _missing_text(missing: dict[str, int]) -> str:
    return ", ".join(f"{count} {reason.replace('_', ' ')}" for reason, count in sorted(missing.items()))


def _checked(stage: str, partition: Partition | None, components: Components, stats_names: tuple[str, ...],
             call: Callable[[], StageResult]) -> StageResult:
    """Run `call`, and turn items the extractor never answered into StageIncomplete (or, when
    a partial result is allowed, into the result's `missing` counts)."""
    from tkg.llm.client import RequestFailed

    counters = [_stats(part, name) for part in components.parts() for name in stats_names]
    before = [counter.snapshot() if counter else None for counter in counters]
    try:
        result = call()
    except RequestFailed as error:
        raise StageIncomplete(stage, partition, f"the provider did not answer ({error}); rerun to retry") from error
    missing: Counter = Counter()
    last_error = ""
    for counter, earlier in zip(counters, before):
        if counter is not None:
            delta = counter.since(earlier)
            missing.update(delta.unanswered_items)
            last_error = delta.last_error or last_error
            for key, value in (("llm_requests", delta.requests), ("llm_cache_hits", delta.cache_hits),
                               ("dropped_items", delta.dropped_total)):
                result.extra[key] = result.extra.get(key, 0) + value
    if missing:
        if not components.allow_partial:
            raise StageIncomplete(stage, partition, f"{_missing_text(missing)} (last error: {last_error or 'none'}); "
                                  "rerun to retry only those, or allow a partial result", dict(missing))
        result.missing.update(missing)
        result.notes.append(f"partial: {_missing_text(missing)}")
    return result


def _stats(part: object, name: str) -> StageStats | None:
    # Only components that count their work (the extractors and the LLM embedder) have counters.
    stats = getattr(part, "stats", None)
    return stats(name) if callable(stats) else None


# --- computing one stage ---------------------------------------------------------------------


def compute_stage(stage: str, partition: Partition, inputs: dict[str, pa.Table], components: Components,
                  rows: list[SourceRow] | None = None) -> StageResult:
    """One partitioned stage from its input tables (pure: reads and writes nothing)."""
    company, quarter = partition
    if stage == "transcripts":
        result = pipeline.parse_rows(rows or [], get_company(company))
        if result.counts["skipped_unparseable"]:
            if not components.allow_partial:
                raise StageIncomplete("transcripts", partition, "; ".join(result.notes))
            result.missing["unparseable_rows"] = result.counts["skipped_unparseable"]
        if not rows:
            result.notes.append(f"no call for {company} in the quarter starting {quarter.isoformat()}")
        return result
    if stage == "chunks":
        return pipeline.chunk_transcripts(inputs["transcripts"], components.chunk_embedder, components.chunking)
    if stage == "statements":
        return _checked(stage, partition, components, STAGE_STATS[stage], lambda: pipeline.extract_statements(
            inputs["transcripts"], inputs["chunks"], components.extractor))
    if stage == "temporal_events":
        result = _checked(stage, partition, components, STAGE_STATS[stage], lambda: pipeline.build_events(
            inputs["transcripts"], inputs["statements"], components.extractor, components.embedder))
        result.extra["labels"] = pipeline.statement_types(result.table)
        return result
    if stage == "triplets":
        result = _checked(stage, partition, components, STAGE_STATS[stage], lambda: pipeline.extract_triplets(
            inputs["transcripts"], inputs["statements"], components.extractor))
        result.extra["predicates"] = dict(sorted(Counter(result.table.column("predicate").to_pylist()).items()))
        return result
    if stage == "figures":
        result = _checked(stage, partition, components, STAGE_STATS[stage], lambda: pipeline.extract_figures(
            inputs["transcripts"], inputs["chunks"], inputs["statements"], components.extractor))
        result.extra["metrics"] = dict(sorted(Counter(
            f"{kind} {metric}" for kind, metric in zip(result.table.column("kind").to_pylist(),
                                                        result.table.column("metric").to_pylist())).items()))
        return result
    if stage == "entities":
        return _checked(stage, partition, components, STAGE_STATS[stage], lambda: pipeline.build_entity_mentions(
            inputs["triplets"], components.embedder))
    raise KeyError(f"no partitioned stage {stage!r}; the stages are {', '.join(PARTITIONED_STAGES)}")


# --- the store -------------------------------------------------------------------------------


def read_partition(store: ParquetStore, asset: str, company: str, quarter: date) -> pa.Table:
    path = store.partition_path(asset, company, quarter)
    if not store.is_file(path):
        raise FileNotFoundError(
            f"{asset} for partition {key_of(company, quarter)} has not been materialised ({store.display(path)}); "
            f"materialise `{asset}` for this partition first"
        )
    return store.read(path)


def _upstream_versions(stage: str, stamps: dict[str, Stamp | None], partition: Partition) -> dict[str, str]:
    versions = {}
    for upstream in STAGE_INPUTS[stage]:
        stamp = stamps.get(upstream)
        if stamp is None:
            raise FileNotFoundError(f"{upstream} of {key_of(*partition)} carries no version (it was written by an older "
                                    f"tkg); rebuild the partition with `tkg build --force`")
        versions[upstream] = stamp.version
    return versions


def write_stage(store: ParquetStore, stage: str, partition: Partition, result: StageResult) -> Path:
    result.path = store.write(store.partition_path(stage, *partition), stamped(result.table, result.stamp))
    return result.path


def record_usage(store: ParquetStore, step: str, *components: object, company: str | None = None,
                 quarter: date | None = None) -> list[dict]:
    """Write the LLM accounting of the components a step used (offline ones have none). Rows
    of counters that belong to another step (validity ranges to temporal_events, ...) go there."""
    rows = []
    for component in components:
        usage_rows = getattr(component, "usage_rows", None)
        if usage_rows is not None:
            rows.extend(usage_rows(step))
    if not rows:
        return rows
    now = datetime.now(timezone.utc)
    by_step: dict[str, list[dict]] = {}
    for row in rows:
        row.update(step=STEP_OF_STATS.get(row["stage"], row["step"]), company=company, quarter=quarter, recorded_at=now)
        by_step.setdefault(row["step"], []).append(row)
    for step_name, step_rows in by_step.items():
        store.write(store.usage_path(step_name, company, quarter), tables.to_table(step_rows, tables.LLM_CALLS))
    return rows


def run_stage(store: ParquetStore, stage: str, company: str, quarter: date, components: Components,
              source: LoadedSource | None = None) -> StageResult:
    """One stage of one partition: read its inputs from the store, compute, stamp, write.
    What a Dagster asset does."""
    partition = (company, quarter)
    inputs = {upstream: read_partition(store, upstream, company, quarter) for upstream in STAGE_INPUTS[stage]}
    stamps = {upstream: store.stamp(store.partition_path(upstream, company, quarter)) for upstream in STAGE_INPUTS[stage]}
    rows = None
    if stage == "transcripts":
        if source is None:
            raise ValueError("the transcripts stage needs the transcript source")
        held = source.problem_partitions().get(partition)
        if held and store.is_file(store.partition_path("transcripts", company, quarter)):
            raise StageIncomplete("transcripts", partition, "a source row of this partition cannot be read ("
                                  + "; ".join(map(str, held)) + "); fix the row to rebuild it")
        rows = source.rows_for(company, quarter)
        versions = source_inputs(rows, company)
    else:
        versions = _upstream_versions(stage, stamps, partition)
    try:
        result = compute_stage(stage, partition, inputs, components, rows)
    finally:
        record_usage(store, stage, *components.parts(), company=company, quarter=quarter)
    result.stamp = Stamp(stage, components.code_versions[stage], versions, dict(result.missing))
    write_stage(store, stage, partition, result)
    return result


def build_partition(store: ParquetStore, partition: Partition, stages: set[str], components: Components,
                    rows: list[SourceRow] | None = None) -> dict[str, StageResult]:
    """Rebuild `stages` of one partition (with everything downstream of them): compute them all
    in memory, reading the others from the store, and write them only when all succeeded.

    Validity ranges, triplets and figures all need only the statements, so they run side by
    side (the LLM path keeps all three stages' requests in flight)."""
    company, quarter = partition
    stages = downstream_of(stages)
    results: dict[str, StageResult] = {}
    tables_: dict[str, pa.Table] = {}
    stamps: dict[str, Stamp | None] = {}
    code_versions = components.code_versions

    def table(stage: str) -> pa.Table:
        if stage not in tables_:
            tables_[stage] = read_partition(store, stage, company, quarter)
            stamps[stage] = store.stamp(store.partition_path(stage, company, quarter))
        return tables_[stage]

    def one(stage: str) -> StageResult:
        inputs = {upstream: table(upstream) for upstream in STAGE_INPUTS[stage]}
        if stage == "transcripts":
            versions = source_inputs(rows or [], company)
        else:
            versions = _upstream_versions(stage, stamps, partition)
        result = compute_stage(stage, partition, inputs, components, rows)
        result.stamp = Stamp(stage, code_versions[stage], versions, dict(result.missing))
        return result

    def finish(stage: str, result: StageResult) -> None:
        results[stage], tables_[stage], stamps[stage] = result, result.table, result.stamp

    try:
        for stage in ("transcripts", "chunks", "statements"):
            if stage in stages:
                finish(stage, one(stage))
        parallel = [stage for stage in ("temporal_events", "triplets", "figures") if stage in stages]
        for upstream in {upstream for stage in parallel for upstream in STAGE_INPUTS[stage]}:
            table(upstream)  # read once, before the threads share it
        if len(parallel) > 1:
            with ThreadPoolExecutor(max_workers=len(parallel), thread_name_prefix=f"tkg-{company}") as pool:
                futures = {stage: pool.submit(one, stage) for stage in parallel}
                for stage in parallel:
                    finish(stage, futures[stage].result())
        else:
            for stage in parallel:
                finish(stage, one(stage))
        if "entities" in stages:
            finish("entities", one("entities"))
    finally:  # drops are accounted even when the partition fails
        record_usage(store, "temporal_events", *components.parts(), company=company, quarter=quarter)
    for stage in PARTITIONED_STAGES:
        if stage in results:
            write_stage(store, stage, partition, results[stage])
    return results
