"""Ingestion: transcripts from the configured source, parsed, then semantically chunked."""

import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage, TranscriptSource
from tkg.build import run_chunks, run_transcripts
from tkg_assets.assets.common import OWNERS, PARTITIONED_BACKFILL, table_metadata
from tkg_assets.partitions import company_quarter, partition_of


@dg.asset(
    partitions_def=company_quarter,
    group_name="ingestion",
    kinds={"python", "parquet"},
    owners=OWNERS,
    code_version="streetevents-parser-1",
    backfill_policy=PARTITIONED_BACKFILL,
)
def transcripts(context: dg.AssetExecutionContext, storage: TkgStorage, source: TranscriptSource) -> dg.MaterializeResult:
    """Earnings calls of one company in one calendar quarter, parsed from StreetEvents text:
    title and fiscal quarter (with the period it covers), call time, participants with their
    organisations and titles, sections and speaker turns. Definitions/Disclaimer boilerplate is
    dropped. A call that does not parse is skipped and named in the metadata; the rest go on."""
    company, quarter = partition_of(context)
    loaded = source.load()
    result = run_transcripts(storage.store, company, quarter, loaded)
    for note in result.notes:
        context.log.info(note)
    return dg.MaterializeResult(metadata=table_metadata(
        result.table, result.path, result.counts, source=loaded.name,
        notes=dg.MetadataValue.md("\n".join(f"- {note}" for note in result.notes) or "none"),
        fiscal_quarters=", ".join(result.table.column("fiscal_quarter").to_pylist()) or "none",
    ))


@dg.asset(
    partitions_def=company_quarter,
    group_name="ingestion",
    kinds={"python", "parquet"},
    owners=OWNERS,
    deps=[transcripts],
    code_version="semantic-chunks-1",
    backfill_policy=PARTITIONED_BACKFILL,
)
def chunks(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
    """Semantic chunks (chonkie SemanticChunker over sentence embeddings) of each speaker turn,
    plus one chunk for the participants list. Each chunk keeps its speaker and its character
    offsets into the transcript."""
    company, quarter = partition_of(context)
    result = run_chunks(storage.store, company, quarter, extraction.chunk_embedder())
    return dg.MaterializeResult(metadata=table_metadata(result.table, result.path, result.counts))
