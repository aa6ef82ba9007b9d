"""Extraction: statements, their validity ranges (temporal events), triplets and entity mentions.

Each asset runs one stage of `tkg.build` for its partition with the configured extractor
(offline rules or an LLM); the stage reads the upstream Parquet and writes its own. A stage
the provider could not finish fails the run and keeps the partition's last good output,
unless the `extraction` resource allows a partial result.
"""

import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage
from tkg_assets.assets.common import CODE_VERSIONS, OWNERS, PARTITIONED_BACKFILL, definition_metadata, materialize_stage
from tkg_assets.assets.ingestion import chunks, transcripts
from tkg_assets.partitions import company_quarter


def _extraction_asset(stage: str, **kwargs):
    return dg.asset(
        name=stage,
        partitions_def=company_quarter,
        group_name="extraction",
        kinds={"python", "parquet"},
        owners=OWNERS,
        backfill_policy=PARTITIONED_BACKFILL,
        pool="tkg_llm",
        code_version=CODE_VERSIONS[stage],
        metadata=definition_metadata(stage),
        **kwargs,
    )


@_extraction_asset("statements", deps=[transcripts, chunks])
def statements(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
    """Atomic statements extracted from each chunk, typed FACT/OPINION/PREDICTION and
    STATIC/DYNAMIC/ATEMPORAL, with pronouns and 'we' resolved to the company."""
    context.log.info(f"extraction backend: {extraction.describe()}")
    return materialize_stage(context, "statements", storage, extraction)


@_extraction_asset("temporal_events", deps=[transcripts, statements])
def temporal_events(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
    """One temporal event per statement: validity range (valid_at/invalid_at, resolved against
    the call date and the company's fiscal calendar), statement embedding, and created_at, the
    time the call was published."""
    return materialize_stage(context, "temporal_events", storage, extraction)


@_extraction_asset("triplets", deps=[transcripts, statements])
def triplets(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
    """Subject-predicate-object triplets over the 20-predicate vocabulary, with their entities,
    for every statement (its event). A triplet pointing at no extracted entity is dropped and
    counted. It needs only the statements, so it runs in parallel with temporal_events."""
    return materialize_stage(context, "triplets", storage, extraction)


@_extraction_asset("entities", deps=[triplets])
def entities(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
    """Entity mentions (every subject and object of a triplet) with type, description and a
    description embedding, ready for entity resolution."""
    return materialize_stage(context, "entities", storage, extraction)
