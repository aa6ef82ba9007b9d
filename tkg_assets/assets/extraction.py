"""Extraction: statements, their validity ranges (temporal events), triplets and entity mentions.

Each asset runs one stage of `tkg.build` for its partition with the configured extractor
(offline rules or an LLM); the stage reads the upstream Parquet and writes its own.
"""

from collections import Counter

import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage
from tkg import pipeline
from tkg.build import run_entities, run_statements, run_temporal_events, run_triplets
from tkg.extraction.base import StageStats
from tkg_assets.assets.common import OWNERS, PARTITIONED_BACKFILL, table_metadata
from tkg_assets.assets.ingestion import chunks, transcripts
from tkg_assets.partitions import company_quarter, partition_of


def _stats_metadata(stats: StageStats) -> dict[str, object]:
    return {"llm_requests": stats.requests, "llm_cache_hits": stats.cache_hits, "dropped_items": stats.dropped_total}


def _extraction_asset(**kwargs):
    return dg.asset(
        partitions_def=company_quarter,
        group_name="extraction",
        kinds={"python", "parquet"},
        owners=OWNERS,
        backfill_policy=PARTITIONED_BACKFILL,
        pool="tkg_llm",
        **kwargs,
    )


@_extraction_asset(deps=[transcripts, chunks], code_version=ExtractionBackend.code_version_for("statements"))
def statements(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
    """Atomic statements extracted from each chunk, typed FACT/OPINION/PREDICTION and
    STATIC/DYNAMIC/ATEMPORAL, with pronouns and 'we' resolved to the company."""
    company, quarter = partition_of(context)
    context.log.info(f"extraction backend: {extraction.describe()}")
    extractor = extraction.extractor()
    result = run_statements(storage.store, company, quarter, extractor)
    return dg.MaterializeResult(metadata=table_metadata(result.table, result.path, result.counts,
                                                        **_stats_metadata(extractor.stats("statements"))))


@_extraction_asset(deps=[statements], code_version=ExtractionBackend.code_version_for("validity"))
def temporal_events(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
    """One temporal event per statement: validity range (valid_at/invalid_at, resolved against
    the call date and the company's fiscal calendar), statement embedding, and created_at, the
    time the call was published."""
    company, quarter = partition_of(context)
    extractor = extraction.extractor()
    result = run_temporal_events(storage.store, company, quarter, extractor, extraction.embedder())
    return dg.MaterializeResult(metadata=table_metadata(
        result.table, result.path, result.counts, labels=dg.MetadataValue.json(pipeline.statement_types(result.table)),
        **_stats_metadata(extractor.stats("validity")),
    ))


@_extraction_asset(deps=[transcripts, statements], code_version=ExtractionBackend.code_version_for("triplets"))
def triplets(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
    """Subject-predicate-object triplets over the 20-predicate vocabulary, with their entities,
    for every statement (its event). A triplet pointing at no extracted entity is dropped and
    counted. It needs only the statements, so it runs in parallel with temporal_events."""
    company, quarter = partition_of(context)
    extractor = extraction.extractor()
    result = run_triplets(storage.store, company, quarter, extractor)
    predicates = dict(sorted(Counter(result.table.column("predicate").to_pylist()).items()))
    return dg.MaterializeResult(metadata=table_metadata(
        result.table, result.path, result.counts, predicates=dg.MetadataValue.json(predicates),
        **_stats_metadata(extractor.stats("triplets")),
    ))


@_extraction_asset(deps=[triplets], code_version="entity-mentions-1")
def entities(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
    """Entity mentions (every subject and object of a triplet) with type, description and a
    description embedding, ready for entity resolution."""
    company, quarter = partition_of(context)
    result = run_entities(storage.store, company, quarter, extraction.embedder())
    return dg.MaterializeResult(metadata=table_metadata(result.table, result.path, result.counts))
