"""Stage runners: read a stage's inputs from the store, run it, write its Parquet file.

The Dagster assets are one call to one of these each; `build_graph` chains them without
Dagster for library use, tests and benchmarks. Both paths therefore produce the same files.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from tkg import pipeline, tables
from tkg.chunking import ChunkingSettings
from tkg.companies import get_company
from tkg.embeddings import Embedder, WordLlamaEmbedder
from tkg.extraction.base import Extractor
from tkg.invalidation import InvalidationResult, Judge, canonical_triplets, invalidate
from tkg.pipeline import StageResult
from tkg.resolution import Resolution, resolve_entities
from tkg.sources import LoadedSource, quarter_start, rows_for_partition
from tkg.store import ParquetStore
from tkg.warehouse import PublishResult, publish

PARTITIONED_STAGES = ("transcripts", "chunks", "statements", "temporal_events", "triplets", "entities")


def read_partition(store: ParquetStore, asset: str, company: str, quarter: date):
    path = store.partition_path(asset, company, quarter)
    if not path.exists():
        raise FileNotFoundError(
            f"{asset} for partition {company}|{quarter.isoformat()} has not been materialised ({path}); "
            f"materialise `{asset}` for this partition first"
        )
    return store.read(path)


def _write(store: ParquetStore, asset: str, company: str, quarter: date, result: StageResult) -> StageResult:
    result.path = store.write(store.partition_path(asset, company, quarter), result.table)
    return result


def record_usage(store: ParquetStore, step: str, *components: object, company: str | None = None,
                 quarter: date | None = None) -> list[dict]:
    """Write the LLM accounting of the components a step used (offline ones have none)."""
    from datetime import datetime, timezone

    rows = []
    for component in components:
        usage_rows = getattr(component, "usage_rows", None)
        if usage_rows is not None:
            rows.extend(usage_rows(step))
    if rows:
        now = datetime.now(timezone.utc)
        for row in rows:
            row.update(company=company, quarter=quarter, recorded_at=now)
        store.write(store.usage_path(step, company, quarter), tables.to_table(rows, tables.LLM_CALLS))
    return rows


def run_transcripts(store: ParquetStore, company: str, quarter: date, source: LoadedSource) -> StageResult:
    rows = rows_for_partition(source, company, quarter)
    result = pipeline.parse_rows(rows, get_company(company))
    if not rows:
        result.notes.append(f"no call for {company} in the quarter starting {quarter.isoformat()} in {source.name}")
    return _write(store, "transcripts", company, quarter, result)


def run_chunks(store: ParquetStore, company: str, quarter: date, embedder: Embedder,
               settings: ChunkingSettings = ChunkingSettings()) -> StageResult:
    result = pipeline.chunk_transcripts(read_partition(store, "transcripts", company, quarter), embedder, settings)
    return _write(store, "chunks", company, quarter, result)


def run_statements(store: ParquetStore, company: str, quarter: date, extractor: Extractor) -> StageResult:
    result = pipeline.extract_statements(
        read_partition(store, "transcripts", company, quarter), read_partition(store, "chunks", company, quarter), extractor
    )
    record_usage(store, "statements", extractor, company=company, quarter=quarter)
    return _write(store, "statements", company, quarter, result)


def run_temporal_events(store: ParquetStore, company: str, quarter: date, extractor: Extractor, embedder: Embedder) -> StageResult:
    result = pipeline.build_events(
        read_partition(store, "transcripts", company, quarter), read_partition(store, "statements", company, quarter),
        extractor, embedder,
    )
    record_usage(store, "temporal_events", extractor, embedder, company=company, quarter=quarter)
    return _write(store, "temporal_events", company, quarter, result)


def run_triplets(store: ParquetStore, company: str, quarter: date, extractor: Extractor) -> StageResult:
    result = pipeline.extract_triplets(
        read_partition(store, "transcripts", company, quarter), read_partition(store, "statements", company, quarter),
        extractor,
    )
    record_usage(store, "triplets", extractor, company=company, quarter=quarter)
    return _write(store, "triplets", company, quarter, result)


def run_entities(store: ParquetStore, company: str, quarter: date, embedder: Embedder) -> StageResult:
    result = pipeline.build_entity_mentions(read_partition(store, "triplets", company, quarter), embedder)
    record_usage(store, "entities", embedder, company=company, quarter=quarter)
    return _write(store, "entities", company, quarter, result)


def run_partition(store: ParquetStore, company: str, quarter: date, source: LoadedSource, extractor: Extractor,
                  embedder: Embedder, chunk_embedder: Embedder | None = None) -> dict[str, StageResult]:
    """All partitioned stages of one company x quarter. Validity ranges (temporal_events) and
    triplets both need only the statements, so they run at the same time, as the two assets
    do under Dagster's multiprocess executor."""
    from concurrent.futures import ThreadPoolExecutor

    results = {
        "transcripts": run_transcripts(store, company, quarter, source),
        # chunking embeds every sentence window: always with the local model (as the asset does)
        "chunks": run_chunks(store, company, quarter, chunk_embedder or WordLlamaEmbedder()),
        "statements": run_statements(store, company, quarter, extractor),
    }
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"tkg-{company}") as pool:
        events = pool.submit(run_temporal_events, store, company, quarter, extractor, embedder)
        triplets = pool.submit(run_triplets, store, company, quarter, extractor)
        results["temporal_events"], results["triplets"] = events.result(), triplets.result()
    results["entities"] = run_entities(store, company, quarter, embedder)
    return results


def run_canonical_entities(store: ParquetStore) -> Resolution:
    """Resolve every mention, keeping the ids of the previous registry."""
    registry = store.global_path("canonical_entities")
    previous = store.read(registry) if registry.exists() else None
    resolution = resolve_entities(store.read_all("entities", tables.ENTITIES), previous)
    resolution.path = store.write(registry, resolution.canonical_entities)
    store.write(store.global_path("canonical_entities", "entity_resolution"), resolution.mapping)
    return resolution


def run_invalidation(store: ParquetStore, judge: Judge) -> InvalidationResult:
    mapping_path = store.global_path("canonical_entities", "entity_resolution")
    if not mapping_path.exists():
        raise FileNotFoundError("canonical_entities has not been materialised yet; materialise it before invalidated_events")
    resolved = canonical_triplets(
        store.read_all("triplets", tables.TRIPLETS), store.read(mapping_path), store.read(store.global_path("canonical_entities"))
    )
    result = invalidate(store.read_all("temporal_events", tables.EVENTS), resolved, judge)
    record_usage(store, "invalidated_events", judge)
    result.path = store.write(store.global_path("invalidated_events", "event_invalidations"), result.event_invalidations)
    store.write(store.global_path("invalidated_events", "invalidation_judgments"), result.judgments)
    return result


@dataclass
class BuildReport:
    partitions: list[tuple[str, date]]
    counts: Counter = field(default_factory=Counter)
    publish: PublishResult | None = None


def partitions_of(source: LoadedSource, companies: set[str] | None = None, since: date | None = None,
                  until: date | None = None) -> list[tuple[str, date]]:
    """(company, quarter) keys with at least one call matching the filters, oldest first."""
    keys = {
        (row.company, quarter_start(row.call_date)) for row in source.rows
        if (not companies or row.company in companies) and (since is None or row.call_date >= since)
        and (until is None or row.call_date <= until)
    }
    return sorted(keys, key=lambda key: (key[1], key[0]))


def _offline_partition(job: tuple[str, str, str, date]) -> dict[str, int]:
    """Worker-process entry: one partition with the offline extractor and embedder."""
    from tkg.embeddings import WordLlamaEmbedder
    from tkg.extraction.offline import OfflineExtractor
    from tkg.sources import load_source

    root, source_name, company, quarter = job
    results = run_partition(ParquetStore(root), company, quarter, load_source(source_name), OfflineExtractor(), WordLlamaEmbedder())
    return {f"{stage}_rows": result.table.num_rows for stage, result in results.items()}


def build_partitions_offline(store: ParquetStore, source_name: str, partitions: list[tuple[str, date]], workers: int = 2) -> Counter:
    """Partitioned stages for many partitions in `workers` processes (offline backend only:
    the LLM path parallelises requests inside a partition instead)."""
    from concurrent.futures import ProcessPoolExecutor

    counts: Counter = Counter()
    jobs = [(str(store.root), source_name, company, quarter) for company, quarter in partitions]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for partition_counts in pool.map(_offline_partition, jobs):
            counts.update(partition_counts)
    return counts


def build_graph(store: ParquetStore, source: LoadedSource, partitions: list[tuple[str, date]], extractor: Extractor,
                embedder: Embedder, judge: Judge, warehouse: Path | None = None, concurrent_partitions: int = 1,
                components: Callable[[], tuple[Extractor, Embedder]] | None = None) -> BuildReport:
    """Every stage without Dagster, then the global stages.

    With `concurrent_partitions` > 1, partitions run in threads, each with its own extractor
    and embedder from `components()` (the LLM ones share one client, so one limiter bounds the
    requests of all of them); that is what parallel partition runs do under Dagster."""
    from concurrent.futures import ThreadPoolExecutor

    report = BuildReport(partitions=list(partitions))

    def one(partition: tuple[str, date]) -> dict[str, StageResult]:
        own_extractor, own_embedder = components() if components else (extractor, embedder)
        return run_partition(store, partition[0], partition[1], source, own_extractor, own_embedder)

    if concurrent_partitions > 1:
        with ThreadPoolExecutor(max_workers=concurrent_partitions, thread_name_prefix="tkg-partition") as pool:
            outcomes = list(pool.map(one, partitions))
    else:
        outcomes = [one(partition) for partition in partitions]
    for results in outcomes:
        for stage, result in results.items():
            report.counts[f"{stage}_rows"] += result.table.num_rows
    return finish_graph(store, judge, warehouse, report)


def finish_graph(store: ParquetStore, judge: Judge, warehouse: Path | None, report: BuildReport) -> BuildReport:
    """The global stages: resolution, invalidation and (optionally) the warehouse."""
    report.counts.update(run_canonical_entities(store).counts)
    report.counts.update(run_invalidation(store, judge).counts)
    if warehouse is not None:
        report.publish = publish(store, warehouse)
    return report
