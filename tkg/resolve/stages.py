"""The resolution stage: every entity mention of every partition mapped to a canonical entity."""

from __future__ import annotations

from tkg.core import tables
from tkg.core.results import StageJob, StageResult
from tkg.resolve.resolution import resolve_entities


def canonical_entities(job: StageJob) -> StageResult:
    """Resolve every mention. The previous registry only contributes the ids it issued that no
    longer name an entity (kept, with `merged_into`), never names or ids of live entities."""
    store = job.store
    registry = store.global_path("canonical_entities")
    previous = store.read(registry) if store.is_file(registry) else None
    resolution = resolve_entities(store.read_all("entities", tables.ENTITIES), previous)
    return StageResult(resolution.canonical_entities, counts=resolution.counts,
                       tables={"canonical_entities": resolution.canonical_entities, "entity_resolution": resolution.mapping})
