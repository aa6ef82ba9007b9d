"""The resolution stage: every entity mention of every partition mapped to a canonical entity."""

from __future__ import annotations

from tkg.core import tables
from tkg.core.results import StageJob, StageResult
from tkg.resolve.resolution import MentionSource, resolve_entities
from tkg.store.manifest import scan


def canonical_entities(job: StageJob) -> StageResult:
    """Resolve every mention. Mentions are read a column at a time by DuckDB (the distinct
    names come into memory, the mentions and their embeddings do not); each mention's
    canonical is streamed to `entity_resolution`. The previous registry only contributes the
    ids it issued that no longer name an entity (kept, with `merged_into`), never names or ids
    of live entities."""
    store = job.store
    registry = store.global_path("canonical_entities")
    previous = store.read(registry) if store.is_file(registry) else None
    files = store.partition_files("entities")
    source = (MentionSource(job.connection, scan(store, job.connection, files)) if files
              else MentionSource.of_table(tables.ENTITIES.empty_table(), job.connection))
    resolution = resolve_entities(source, previous)
    return StageResult(resolution.canonical_entities, counts=resolution.counts,
                       tables={"canonical_entities": resolution.canonical_entities,
                               "entity_resolution": resolution.mapping_relation()})
