"""Stage runners: compute a stage from its inputs, stamp it with its version, write its Parquet.

Each partitioned stage is a pure function of in-memory tables (`compute_stage`). Two callers:
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

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path

import pyarrow as pa

from tkg import pipeline, tables
from tkg.chunking import ChunkingSettings
from tkg.companies import Company, get_company, load_companies
from tkg.embeddings import Embedder, WordLlamaEmbedder
from tkg.extraction.base import Extractor, StageStats
from tkg.invalidation import InvalidationResult, Judge, canonical_triplets, invalidate
from tkg.parsing import SourceRow
from tkg.partitions import Partition, key_of, parse_key
from tkg.pipeline import StageResult
from tkg.resolution import Resolution, resolve_entities
from tkg.sources import LoadedSource, rows_fingerprint
from tkg.store import ParquetStore
from tkg.versions import Stamp, combine, read_stamp, stamped
from tkg.warehouse import PublishResult, publish

log = logging.getLogger(__name__)

PARTITIONED_STAGES = ("transcripts", "chunks", "statements", "temporal_events", "triplets", "entities")
GLOBAL_STAGES = ("canonical_entities", "invalidated_events", "warehouse")
STAGE_INPUTS: dict[str, tuple[str, ...]] = {
    "transcripts": (),  # the partition's source rows and its company's registry entry
    "chunks": ("transcripts",),
    "statements": ("transcripts", "chunks"),
    "temporal_events": ("transcripts", "statements"),
    "triplets": ("transcripts", "statements"),
    "entities": ("triplets",),
}
# The counters (StageStats names) each stage's LLM work is accounted under.
STAGE_STATS = {"statements": ("statements",), "temporal_events": ("validity", "embeddings"),
               "triplets": ("triplets",), "entities": ("embeddings",)}
STEP_OF_STATS = {"statements": "statements", "validity": "temporal_events", "triplets": "triplets"}

# Code versions of the stages that no prompt or model shapes; bump one when its output changes.
TRANSCRIPTS_VERSION = "streetevents-parser-1"
CHUNKS_VERSION = "semantic-chunks-1"
ENTITIES_VERSION = "entity-mentions-1"
RESOLUTION_VERSION = "entity-resolution-2"
WAREHOUSE_VERSION = "warehouse-2"


def _short(*parts: object) -> str:
    return hashlib.sha256(":".join(str(part) for part in parts).encode()).hexdigest()[:16]


def downstream_of(stages: set[str]) -> set[str]:
    """`stages` and every partitioned stage that reads one of them, directly or not."""
    closed = set(stages)
    for stage in PARTITIONED_STAGES:
        if any(upstream in closed for upstream in STAGE_INPUTS[stage]):
            closed.add(stage)
    return closed


def stage_code_versions(extractor_fingerprint: Callable[[str], str], embedder_name: str, chunk_embedder_name: str,
                        chunking: ChunkingSettings = ChunkingSettings()) -> dict[str, str]:
    """The code version of every partitioned stage: what, besides its inputs, shapes its output
    (prompt template, model and settings, or rule set). The Dagster assets carry the same."""
    return {
        "transcripts": TRANSCRIPTS_VERSION,
        "chunks": _short(CHUNKS_VERSION, repr(chunking), chunk_embedder_name),
        "statements": extractor_fingerprint("statements"),
        "temporal_events": _short(extractor_fingerprint("validity"), embedder_name),
        "triplets": extractor_fingerprint("triplets"),
        "entities": _short(ENTITIES_VERSION, embedder_name),
    }


def company_fingerprint(company: Company) -> str:
    """The registry entry a partition's transcripts are parsed with (an input, like the rows)."""
    return _short(company.ticker, company.name, "|".join(company.aliases), company.fiscal_year_end_month)


def registry_fingerprint() -> str:
    return _short(*(company_fingerprint(company) for _, company in sorted(load_companies().items())))


def source_inputs(rows: list[SourceRow], company: str) -> dict[str, str]:
    """The inputs of a partition's `transcripts` stage."""
    return {"source": rows_fingerprint(rows), "company": company_fingerprint(get_company(company))}


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


class HalfBuilt(RuntimeError):
    """Partitions whose stage files do not agree (a build stopped between two stages)."""


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
    if stage == "entities":
        return _checked(stage, partition, components, STAGE_STATS[stage], lambda: pipeline.build_entity_mentions(
            inputs["triplets"], components.embedder))
    raise KeyError(f"no partitioned stage {stage!r}; the stages are {', '.join(PARTITIONED_STAGES)}")


# --- the store -------------------------------------------------------------------------------


def read_partition(store: ParquetStore, asset: str, company: str, quarter: date) -> pa.Table:
    path = store.partition_path(asset, company, quarter)
    if not path.exists():
        raise FileNotFoundError(
            f"{asset} for partition {key_of(company, quarter)} has not been materialised ({path}); "
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
    stamps = {upstream: read_stamp(store.partition_path(upstream, company, quarter)) for upstream in STAGE_INPUTS[stage]}
    rows = None
    if stage == "transcripts":
        if source is None:
            raise ValueError("the transcripts stage needs the transcript source")
        held = source.problem_partitions().get(partition)
        if held and store.partition_path("transcripts", company, quarter).exists():
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

    Validity ranges and triplets both need only the statements, so they run side by side (the
    LLM path keeps both stages' requests in flight)."""
    company, quarter = partition
    stages = downstream_of(stages)
    results: dict[str, StageResult] = {}
    tables_: dict[str, pa.Table] = {}
    stamps: dict[str, Stamp | None] = {}
    code_versions = components.code_versions

    def table(stage: str) -> pa.Table:
        if stage not in tables_:
            tables_[stage] = read_partition(store, stage, company, quarter)
            stamps[stage] = read_stamp(store.partition_path(stage, company, quarter))
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
        parallel = [stage for stage in ("temporal_events", "triplets") if stage in stages]
        for upstream in ("transcripts", "statements"):
            if parallel:
                table(upstream)  # read once, before the threads share it
        if len(parallel) == 2:
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"tkg-{company}") as pool:
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


# --- the state of the store ------------------------------------------------------------------


def stored_partitions(store: ParquetStore) -> list[Partition]:
    """Every partition with at least one stage file in the store."""
    found = set()
    for stage in PARTITIONED_STAGES:
        for path in (store.parquet_root / stage).glob("company=*/quarter=*"):
            try:
                found.add(parse_key(f"{path.parent.name.removeprefix('company=')}|{path.name.removeprefix('quarter=')}"))
            except ValueError:
                continue
    return sorted(found, key=lambda p: (p[1], p[0]))


def partition_stamps(store: ParquetStore, partition: Partition) -> dict[str, Stamp | None]:
    return {stage: read_stamp(store.partition_path(stage, *partition)) for stage in PARTITIONED_STAGES}


def half_built(stamps: dict[str, Stamp | None]) -> str | None:
    """Why a partition's stage files do not agree, or None when they do."""
    for stage in PARTITIONED_STAGES:
        stamp = stamps[stage]
        if stamp is None:
            return f"{stage} is missing or carries no version"
        for upstream in STAGE_INPUTS[stage]:
            if stamps[upstream] is not None and stamp.inputs.get(upstream) != stamps[upstream].version:
                return f"{stage} was built from another {upstream}"
    return None


def consistent_versions(store: ParquetStore) -> dict[str, dict[str, str]]:
    """Per partitioned stage, the version of every partition, after checking that every
    partition in the store is whole. Raises HalfBuilt naming the partitions that are not, so
    no global step ever reads a mix of new and old stages."""
    versions: dict[str, dict[str, str]] = {stage: {} for stage in PARTITIONED_STAGES}
    problems = []
    for partition in stored_partitions(store):
        stamps = partition_stamps(store, partition)
        reason = half_built(stamps)
        if reason:
            problems.append(f"{key_of(*partition)} ({reason})")
            continue
        for stage, stamp in stamps.items():
            versions[stage][key_of(*partition)] = stamp.version
    if problems:
        raise HalfBuilt(f"{len(problems)} partition(s) are half-built, so the graph is not refreshed: "
                        f"{'; '.join(problems[:10])}{' ...' if len(problems) > 10 else ''}. Rerun `tkg build` "
                        "(or materialise those partitions in the UI) to complete them")
    return versions


def judge_code_version(name: str, fingerprint: str = "") -> str:
    return f"{name}:{fingerprint}" if fingerprint else name


def warehouse_code_version() -> str:
    """The published file's code version: it covers every SQL model."""
    from tkg.warehouse import load_models

    return _short(WAREHOUSE_VERSION, *(model.sha256 for model in load_models()))


def global_code_versions(judge_version: str) -> dict[str, str]:
    return {"canonical_entities": RESOLUTION_VERSION, "invalidated_events": judge_version,
            "warehouse": warehouse_code_version()}


def global_stamps(store: ParquetStore) -> dict[str, Stamp | None]:
    return {"canonical_entities": read_stamp(store.global_path("canonical_entities")),
            "invalidated_events": read_stamp(store.global_path("invalidated_events", "event_invalidations"))}


def warehouse_inputs(versions: dict[str, dict[str, str]], stamps: dict[str, Stamp | None]) -> dict[str, str]:
    """What the published file is built from: every partition and both global steps."""
    inputs = {stage: combine(by_partition) for stage, by_partition in versions.items()}
    for stage, stamp in stamps.items():
        inputs[stage] = stamp.version if stamp else ""
    return inputs


def global_inputs(versions: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The inputs of each global step, from the partition versions."""
    resolution = {"entities": combine(versions["entities"]), "registry": registry_fingerprint()}
    return {
        "canonical_entities": resolution,
        "invalidated_events": {"temporal_events": combine(versions["temporal_events"]),
                               "triplets": combine(versions["triplets"])},
    }


# --- global stages ---------------------------------------------------------------------------


def run_canonical_entities(store: ParquetStore) -> Resolution:
    """Resolve every mention. The previous registry only contributes the ids it issued that
    no longer name an entity (kept, with `merged_into`), never names or ids of live entities."""
    versions = consistent_versions(store)
    registry = store.global_path("canonical_entities")
    previous = store.read(registry) if registry.exists() else None
    resolution = resolve_entities(store.read_all("entities", tables.ENTITIES), previous)
    stamp = Stamp("canonical_entities", RESOLUTION_VERSION, global_inputs(versions)["canonical_entities"])
    store.write(store.global_path("canonical_entities", "entity_resolution"), stamped(resolution.mapping, stamp))
    resolution.path = store.write(registry, stamped(resolution.canonical_entities, stamp))
    resolution.stamp = stamp
    return resolution


def run_invalidation(store: ParquetStore, judge: Judge, allow_partial: bool = False) -> InvalidationResult:
    versions = consistent_versions(store)
    mapping_path = store.global_path("canonical_entities", "entity_resolution")
    resolution_stamp = read_stamp(mapping_path)
    if resolution_stamp is None:
        raise FileNotFoundError("canonical_entities has not been materialised yet; materialise it before invalidated_events")
    expected = global_inputs(versions)["canonical_entities"]
    if resolution_stamp.inputs != expected:
        raise HalfBuilt("canonical_entities is older than the partitions it should cover; materialise it first")
    resolved = canonical_triplets(
        store.read_all("triplets", tables.TRIPLETS), store.read(mapping_path), store.read(store.global_path("canonical_entities"))
    )
    stats = _stats(judge, "judge")
    before = stats.snapshot() if stats else None
    try:
        result = invalidate(store.read_all("temporal_events", tables.EVENTS), resolved, judge)
    finally:
        record_usage(store, "invalidated_events", judge)
    missing = dict(stats.since(before).unanswered_items) if stats else {}
    if missing and not allow_partial:
        raise StageIncomplete("invalidated_events", None, f"{_missing_text(missing)} (last error: "
                              f"{stats.since(before).last_error or 'none'}); rerun to retry only those")
    inputs = {**global_inputs(versions)["invalidated_events"], "canonical_entities": resolution_stamp.version}
    stamp = Stamp("invalidated_events", judge_code_version(judge.name, _judge_fingerprint(judge)), inputs, missing)
    store.write(store.global_path("invalidated_events", "invalidation_judgments"), stamped(result.judgments, stamp))
    result.path = store.write(store.global_path("invalidated_events", "event_invalidations"),
                              stamped(result.event_invalidations, stamp))
    result.stamp = stamp
    return result


def _judge_fingerprint(judge: Judge) -> str:
    fingerprint = getattr(judge, "settings_fingerprint", None)
    return fingerprint("judge") if callable(fingerprint) else ""


def run_warehouse(store: ParquetStore, target: Path, check: Callable | None = None) -> PublishResult:
    """Publish tkg.duckdb from the Parquet tree, once every partition is whole and both global
    steps cover them; `check` guards the new file before it replaces the old one."""
    versions = consistent_versions(store)
    stamps = global_stamps(store)
    expected = global_inputs(versions)
    canonical, invalidation = stamps["canonical_entities"], stamps["invalidated_events"]
    if canonical is None or canonical.inputs != expected["canonical_entities"]:
        raise HalfBuilt("canonical_entities does not cover the current partitions; materialise it before the warehouse")
    if invalidation is None or invalidation.inputs != {**expected["invalidated_events"], "canonical_entities": canonical.version}:
        raise HalfBuilt("invalidated_events does not cover the current partitions; materialise it before the warehouse")
    stamp = Stamp("warehouse", warehouse_code_version(), warehouse_inputs(versions, stamps), dict(invalidation.missing))
    return publish(store, target, stamp=stamp, check=check)


# --- without Dagster -------------------------------------------------------------------------


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


def run_partition(store: ParquetStore, company: str, quarter: date, source: LoadedSource, components: Components
                  ) -> dict[str, StageResult]:
    """Every partitioned stage of one company x quarter."""
    return build_partition(store, (company, quarter), set(PARTITIONED_STAGES), components, source.rows_for(company, quarter))


def _offline_partition(job: tuple[str, str, str, date]) -> dict[str, int]:
    """Worker-process entry: one partition with the offline extractor and embedder."""
    from tkg.extraction.offline import OfflineExtractor
    from tkg.sources import load_source

    root, source_name, company, quarter = job
    components = Components(OfflineExtractor(), WordLlamaEmbedder())
    results = run_partition(ParquetStore(root), company, quarter, load_source(source_name), components)
    return {f"{stage}_rows": result.table.num_rows for stage, result in results.items()}


def build_partitions_offline(store: ParquetStore, source_name: str, partitions: list[Partition], workers: int = 2) -> Counter:
    """Partitioned stages for many partitions in `workers` processes, offline backend."""
    from concurrent.futures import ProcessPoolExecutor

    counts: Counter = Counter()
    jobs = [(str(store.root), source_name, company, quarter) for company, quarter in partitions]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for partition_counts in pool.map(_offline_partition, jobs):
            counts.update(partition_counts)
    return counts


def build_graph(store: ParquetStore, source: LoadedSource, partitions: list[Partition], components: Components,
                judge: Judge, warehouse: Path | None = None, concurrent_partitions: int = 1,
                make_components: Callable[[], Components] | None = None) -> BuildReport:
    """Every stage without Dagster, then the global stages.

    With `concurrent_partitions` > 1, partitions run in threads, each with its own components
    from `make_components()` (the LLM ones share one client, so one limiter bounds the requests
    of all of them); that is what parallel partition runs do under Dagster."""
    report = BuildReport(partitions=list(partitions))

    def one(partition: Partition) -> dict[str, StageResult]:
        own = make_components() if make_components else components
        return run_partition(store, partition[0], partition[1], source, own)

    if concurrent_partitions > 1:
        with ThreadPoolExecutor(max_workers=concurrent_partitions, thread_name_prefix="tkg-partition") as pool:
            outcomes = list(pool.map(one, partitions))
    else:
        outcomes = [one(partition) for partition in partitions]
    for results in outcomes:
        for stage, result in results.items():
            report.counts[f"{stage}_rows"] += result.table.num_rows
    return finish_graph(store, judge, warehouse, report)


def finish_graph(store: ParquetStore, judge: Judge, warehouse: Path | None, report: BuildReport,
                 allow_partial: bool = False) -> BuildReport:
    """The global stages: resolution, invalidation and (optionally) the warehouse."""
    report.counts.update(run_canonical_entities(store).counts)
    report.counts.update(run_invalidation(store, judge, allow_partial).counts)
    if warehouse is not None:
        report.publish = run_warehouse(store, warehouse)
    return report


def stamps_summary(stamps: dict[str, Stamp | None]) -> str:
    return json.dumps({stage: stamp.version if stamp else None for stage, stamp in stamps.items()}, sort_keys=True)
