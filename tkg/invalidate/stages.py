"""The global stages of invalidation and retention: which facts later facts retired (with the
guidance revisions of financial figures), and each fact's relevance."""

from __future__ import annotations

from tkg.core import tables
from tkg.core.results import StageJob, StageResult
from tkg.invalidate.invalidation import canonical_triplets, invalidate
from tkg.invalidate.retention import retention_settings, score_facts


def invalidated_events(job: StageJob) -> StageResult:
    """Judge every candidate pair over all partitions, and revise guidance figures."""
    store, judge = job.store, job.providers.judge
    resolved = canonical_triplets(store.read_all("triplets", tables.TRIPLETS),
                                  store.read(store.global_path("canonical_entities", "entity_resolution")),
                                  store.read(store.global_path("canonical_entities")))
    result = invalidate(store.read_all("temporal_events", tables.EVENTS), resolved, judge,
                        store.read_all("figures", tables.FIGURES))
    return StageResult(result.event_invalidations, counts=result.counts, metadata={"judge": judge.name},
                       tables={"event_invalidations": result.event_invalidations, "invalidation_judgments": result.judgments,
                               "figure_invalidations": result.figure_invalidations})


def fact_relevance(job: StageJob) -> StageResult:
    """Score every fact for retention and mark the ones to archive (tkg.invalidate.retention)."""
    events = job.store.read_all("temporal_events", tables.EVENTS,
                                columns=["event_id", "statement_hash", "statement_type", "created_at"])
    result = StageResult(score_facts(events, retention_settings()))
    result.counts["archived"] = result.table.num_rows - result.table.column("archive_reason").null_count
    return result
