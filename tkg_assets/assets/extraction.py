"""Extraction: statements, their validity ranges (temporal events), triplets, financial figures and entity mentions.

Each asset runs one stage of `tkg.build.stages` for its partition with the configured extractor
(offline rules or an LLM); the stage reads the upstream Parquet and writes its own. A stage
the provider could not finish fails the run and keeps the partition's last good output,
unless the `extraction` resource allows a partial result.
"""

import dagster as dg

from resources.tkg import ExtractionBackend, TkgStorage
from tkg_assets.assets.common import materialize_stage, partitioned_asset
from tkg_assets.instance import LLM_POOL


def extraction_assets(partitions_def: dg.PartitionsDefinition, code_versions: dict[str, str]) -> list[dg.AssetsDefinition]:
    def extraction_asset(stage: str):
        return partitioned_asset(stage, "extraction", partitions_def, code_versions, pool=LLM_POOL)

    @extraction_asset("statements")
    def statements(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
        """Atomic statements extracted from each chunk, typed FACT/OPINION/PREDICTION and
        STATIC/DYNAMIC/ATEMPORAL, with pronouns and 'we' resolved to the company."""
        context.log.info(f"extraction backend: {extraction.describe()}")
        return materialize_stage(context, "statements", storage, extraction)

    @extraction_asset("temporal_events")
    def temporal_events(context: dg.AssetExecutionContext, storage: TkgStorage,
                        extraction: ExtractionBackend) -> dg.MaterializeResult:
        """One temporal event per statement: validity range (valid_at/invalid_at, resolved against
        the call date and the company's fiscal calendar), statement embedding, and created_at, the
        time the call was published."""
        return materialize_stage(context, "temporal_events", storage, extraction)

    @extraction_asset("triplets")
    def triplets(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
        """Subject-predicate-object triplets over the 20-predicate vocabulary, with their entities,
        for every statement (its event). A triplet pointing at no extracted entity is dropped and
        counted. It needs only the statements, so it runs in parallel with temporal_events."""
        return materialize_stage(context, "triplets", storage, extraction)

    @extraction_asset("figures")
    def figures(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
        """Financial figures the company's people stated: reported results and guidance, with
        metric, segment, basis, fiscal period and value in base units (the rows of the `metrics`
        view). Run rates, FX headwinds, backlog, comparisons and long-term targets are left out."""
        return materialize_stage(context, "figures", storage, extraction)

    @extraction_asset("entities")
    def entities(context: dg.AssetExecutionContext, storage: TkgStorage, extraction: ExtractionBackend) -> dg.MaterializeResult:
        """Entity mentions (every subject and object of a triplet) with type, description and a
        description embedding, ready for entity resolution."""
        return materialize_stage(context, "entities", storage, extraction)

    return [statements, temporal_events, triplets, figures, entities]
