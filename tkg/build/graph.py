"""The global steps (entity resolution, invalidation, the warehouse) and building without Dagster.

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

from tkg.build.stages import Components, StageIncomplete, _missing_text, _stats, build_partition, record_usage
from tkg.build.state import (
    PARTITIONED_STAGES,
    RESOLUTION_VERSION,
    RETENTION_VERSION,
    HalfBuilt,
    consistent_versions,
    global_inputs,
    global_stamps,
    judge_code_version,
    partial_partitions,
    stale_globals,
    warehouse_code_version,
    warehouse_inputs,
)
from tkg.core import tables
from tkg.core.embeddings import WordLlamaEmbedder
from tkg.core.partitions import Partition
from tkg.core.versions import Stamp, stamped
from tkg.extract.stages import StageResult
from tkg.ingest.sources import LoadedSource
from tkg.invalidate.invalidation import InvalidationResult, Judge, canonical_triplets, invalidate
from tkg.invalidate.retention import RetentionSettings, retention_settings, score_facts
from tkg.resolve.resolution import Resolution, resolve_entities
from tkg.store.parquet import ParquetStore
from tkg.store.warehouse import PublishResult, publish

# --- global stages ---------------------------------------------------------------------------


def run_canonical_entities(store: ParquetStore) -> Resolution:
    """Resolve every mention. The previous registry only contributes the ids it issued that
    no longer name an entity (kept, with `merged_into`), never names or ids of live entities."""
    versions = consistent_versions(store)
    registry = store.global_path("canonical_entities")
    previous = store.read(registry) if store.is_file(registry) else None
    resolution = resolve_entities(store.read_all("entities", tables.ENTITIES), previous)
    stamp = Stamp("canonical_entities", RESOLUTION_VERSION, global_inputs(versions, {})["canonical_entities"])
    store.write(store.global_path("canonical_entities", "entity_resolution"), stamped(resolution.mapping, stamp))
    resolution.path = store.write(registry, stamped(resolution.canonical_entities, stamp))
    resolution.stamp = stamp
    return resolution


def run_invalidation(store: ParquetStore, judge: Judge, allow_partial: bool = False) -> InvalidationResult:
    versions = consistent_versions(store)
    mapping_path = store.global_path("canonical_entities", "entity_resolution")
    resolution_stamp = store.stamp(mapping_path)
    if resolution_stamp is None:
        raise FileNotFoundError("canonical_entities has not been materialised yet; materialise it before invalidated_events")
    if resolution_stamp.inputs != global_inputs(versions, {})["canonical_entities"]:
        raise HalfBuilt("canonical_entities is older than the partitions it should cover; materialise it first")
    resolved = canonical_triplets(
        store.read_all("triplets", tables.TRIPLETS), store.read(mapping_path), store.read(store.global_path("canonical_entities"))
    )
    stats = _stats(judge, "judge")
    before = stats.snapshot() if stats else None
    try:
        result = invalidate(store.read_all("temporal_events", tables.EVENTS), resolved, judge,
                            store.read_all("figures", tables.FIGURES))
    finally:
        record_usage(store, "invalidated_events", judge)
    missing = dict(stats.since(before).unanswered_items) if stats else {}
    if missing and not allow_partial:
        raise StageIncomplete("invalidated_events", None, f"{_missing_text(missing)} (last error: "
                              f"{stats.since(before).last_error or 'none'}); rerun to retry only those")
    inputs = global_inputs(versions, {"canonical_entities": resolution_stamp})["invalidated_events"]
    stamp = Stamp("invalidated_events", judge_code_version(judge.name, _judge_fingerprint(judge)), inputs, missing)
    store.write(store.global_path("invalidated_events", "invalidation_judgments"), stamped(result.judgments, stamp))
    store.write(store.global_path("invalidated_events", "figure_invalidations"), stamped(result.figure_invalidations, stamp))
    result.path = store.write(store.global_path("invalidated_events", "event_invalidations"),
                              stamped(result.event_invalidations, stamp))
    result.stamp = stamp
    return result


def _judge_fingerprint(judge: Judge) -> str:
    fingerprint = getattr(judge, "settings_fingerprint", None)
    return fingerprint("judge") if callable(fingerprint) else ""


def run_fact_relevance(store: ParquetStore, settings: RetentionSettings | None = None) -> StageResult:
    """Score every fact for retention and mark the ones to archive (tkg.invalidate.retention)."""
    settings = settings or retention_settings()
    versions = consistent_versions(store)
    events = store.read_all("temporal_events", tables.EVENTS, columns=["event_id", "statement_hash", "statement_type", "created_at"])
    result = StageResult(score_facts(events, settings))
    result.counts["archived"] = result.table.num_rows - result.table.column("archive_reason").null_count
    result.stamp = Stamp("fact_relevance", f"{RETENTION_VERSION}:{settings.fingerprint()}",
                         global_inputs(versions, {})["fact_relevance"])
    result.path = store.write(store.global_path("fact_relevance"), stamped(result.table, result.stamp))
    return result


def run_warehouse(store: ParquetStore, target: Path, check: Callable | None = None, embedder: str | None = None) -> PublishResult:
    """Publish tkg.duckdb from the Parquet tree, once every partition is whole and the global
    steps cover them; `check` guards the new file before it replaces the old one. `embedder`
    names the model the statement vectors come from (recorded in raw.build_info)."""
    versions = consistent_versions(store)
    stamps = global_stamps(store)
    reasons = stale_globals(versions, stamps)
    if reasons:
        raise HalfBuilt(f"the global steps do not cover the current partitions ({'; '.join(reasons)}); "
                        "materialise them before the warehouse")
    missing = Counter(stamps["invalidated_events"].missing)
    for lacking in partial_partitions(store).values():
        missing.update(lacking)
    stamp = Stamp("warehouse", warehouse_code_version(), warehouse_inputs(versions, stamps), dict(missing))
    return publish(store, target, stamp=stamp, check=check, info={"embedder": embedder} if embedder else None)


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


def _offline_partition(job: tuple[str, str, str, str, date]) -> dict[str, int]:
    """Worker-process entry: one partition with the offline extractor and embedder."""
    from tkg.extract.offline import OfflineExtractor
    from tkg.ingest.sources import load_source

    root, storage, source_name, company, quarter = job
    components = Components(OfflineExtractor(), WordLlamaEmbedder())
    results = run_partition(ParquetStore(root, storage), company, quarter, load_source(source_name), components)
    return {f"{stage}_rows": result.table.num_rows for stage, result in results.items()}


def build_partitions_offline(store: ParquetStore, source_name: str, partitions: list[Partition], workers: int = 2) -> Counter:
    """Partitioned stages for many partitions in `workers` processes, offline backend."""
    from concurrent.futures import ProcessPoolExecutor

    counts: Counter = Counter()
    jobs = [(str(store.root), store.uri, source_name, company, quarter) for company, quarter in partitions]
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
    return finish_graph(store, judge, warehouse, report, embedder=getattr(components.embedder, "name", None))


def finish_graph(store: ParquetStore, judge: Judge, warehouse: Path | None, report: BuildReport,
                 allow_partial: bool = False, embedder: str | None = None) -> BuildReport:
    """The global stages: resolution, invalidation and (optionally) the warehouse."""
    report.counts.update(run_canonical_entities(store).counts)
    report.counts.update(run_invalidation(store, judge, allow_partial).counts)
    report.counts.update(run_fact_relevance(store).counts)
    if warehouse is not None:
        report.publish = run_warehouse(store, warehouse, embedder=embedder)
    return report
