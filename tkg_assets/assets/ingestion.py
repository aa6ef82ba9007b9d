"""Ingestion: transcripts from the configured source, parsed, then semantically chunked."""

import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage, TranscriptSource
from tkg_assets.assets.common import materialize_stage, partitioned_asset


def ingestion_assets(partitions_def: dg.PartitionsDefinition, code_versions: dict[str, str]) -> list[dg.AssetsDefinition]:
    @partitioned_asset("transcripts", "ingestion", partitions_def, code_versions)
    def transcripts(context: dg.AssetExecutionContext, storage: TkgStorage, source: TranscriptSource,
                    extraction: ExtractionBackend) -> dg.MaterializeResult:
        """Earnings calls of one company in one calendar quarter, parsed from StreetEvents text:
        title and fiscal quarter (with the period it covers), call time, participants with their
        organisations and titles, sections and speaker turns. Definitions/Disclaimer boilerplate
        is dropped. A call that no longer parses fails the run and keeps the partition's last good
        output; so does a source row that cannot be read once the partition is built."""
        return materialize_stage(context, "transcripts", storage, extraction, source)

    @partitioned_asset("chunks", "ingestion", partitions_def, code_versions)
    def chunks(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
        """Semantic chunks (chonkie SemanticChunker over sentence embeddings) of each speaker turn,
        plus one chunk for the participants list. Each chunk keeps its speaker and its character
        offsets into the transcript."""
        return materialize_stage(context, "chunks", storage, extraction)

    return [transcripts, chunks]
