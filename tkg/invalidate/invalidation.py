"""Invalidation: newer facts retire older DYNAMIC facts they contradict (REFERENCE 1.8).

The whole history is recomputed from all events at once, so the outcome is a function of the
set of events and never of the order partitions were materialised in: a backfill of 2019
before 2016, or a missed call added last, gives the same `invalid_at`, `invalidated_by` and
`expired_at`, and removing an event re-opens whatever only it had retired. Verdicts are cached
(the LLM judge) or cheap (the rule judge), so the recompute does not repay for old pairs.

Candidate selection (`tkg.invalidate.candidates`) blocks events by shared canonical entity and predicate
group, sweeps each block in time and scores cosines as matrix products; of a fact restated
every quarter, a primary event is paired with the earliest restatement only (the only one
that can win). Then one judge request per primary event covers all its candidates (1:N).
When several events retire the same one, the earliest wins.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tkg.core import policy, tables
from tkg.core.paths import read_sql
from tkg.invalidate.candidates import select_candidates
from tkg.invalidate.judges import EventView, Judge, JudgeCase, TripletView
from tkg.invalidate.revisions import revise_figures
from tkg.store.warehouse import apply_model, model, register_raw


@dataclass
class InvalidationResult:
    event_invalidations: pa.Table
    judgments: pa.Table
    counts: Counter = field(default_factory=Counter)
    figure_invalidations: pa.Table = field(default_factory=lambda: tables.FIGURE_INVALIDATIONS.empty_table())


def canonical_triplets(triplets: pa.Table, mapping: pa.Table, canonical: pa.Table) -> pa.Table:
    """Triplets with subject and object rewritten to canonical ids and names: the warehouse's
    `triplets` model (sql/triplets.sql), run in memory on these tables."""
    with duckdb.connect() as connection:
        register_raw(connection, {"triplets": triplets, "entity_resolution": mapping, "canonical_entities": canonical})
        apply_model(connection, model("triplets"), record=False)
        return connection.sql("SELECT * FROM triplets ORDER BY triplet_id").to_arrow_table()


def invalidate(
    events: pa.Table,
    resolved_triplets: pa.Table,
    judge: Judge,
    figures: pa.Table | None = None,
    min_cosine: float | None = None,
    top_k: int | None = None,
) -> InvalidationResult:
    """Judge every candidate pair and retire what the judge says is contradicted; revise
    guidance figures (tkg.invalidate.revisions) and retire statements whose figures were all revised.

    `events` are all temporal events; `resolved_triplets` come from `canonical_triplets`.
    """
    counts: Counter = Counter()
    facts = _fact_events(events, resolved_triplets)
    links = _links(resolved_triplets, facts)
    rules = policy.POLICY
    pairs = select_candidates(facts, links, rules.min_cosine if min_cosine is None else min_cosine,
                              rules.top_k if top_k is None else top_k)
    counts["fact_events"] = facts.num_rows
    counts["candidate_pairs"] = pairs.num_rows

    views = _event_views(facts, resolved_triplets)
    by_primary: dict[str, list[dict]] = defaultdict(list)
    for pair in pairs.to_pylist():
        by_primary[pair["primary_event_id"]].append(pair)
    primaries = sorted(by_primary)
    cases = [JudgeCase(views[p], tuple(views[c["secondary_event_id"]] for c in by_primary[p])) for p in primaries]
    verdicts = judge.judge(cases) if cases else []

    judgments, winners = [], {}
    for primary_id, case_verdicts in zip(primaries, verdicts):
        primary = views[primary_id]
        for pair, verdict in zip(by_primary[primary_id], case_verdicts):
            secondary = views[pair["secondary_event_id"]]
            judgments.append({**pair, "invalidates": verdict.invalidates, "reason": verdict.reason, "judge": judge.name})
            if not verdict.invalidates:
                continue
            best = winners.get(primary_id)
            if best is None or (secondary.valid_at, secondary.event_id) < (best.valid_at, best.event_id):
                winners[primary_id] = secondary
        counts["judged_pairs"] += len(case_verdicts)

    # Each event's earliest retirement: by a judged contradiction, or by the revision of every figure it states.
    ends: dict[str, tuple[datetime, str]] = {p: (s.valid_at, s.event_id) for p, s in winners.items()}
    revisions = revise_figures(figures if figures is not None else tables.FIGURES.empty_table())
    for event_id, retirement in revisions.retired_events.items():
        if event_id not in ends or retirement < ends[event_id]:
            ends[event_id] = retirement
    judgments.extend(revisions.judgments)
    involved = pa.array(sorted(set(ends) | {retirer for _, retirer in ends.values()}), pa.string())
    timing = {row["event_id"]: row for row in events.select(["event_id", "invalid_at", "created_at"])
              .filter(pc.is_in(events.column("event_id"), value_set=involved)).to_pylist()}
    invalidations = []
    for event_id, (invalid_at, invalidated_by) in sorted(ends.items()):
        primary, secondary = timing[event_id], timing[invalidated_by]
        if primary["invalid_at"] is not None and invalid_at >= primary["invalid_at"]:
            continue  # a finished event's end only ever moves earlier
        invalidations.append({
            "event_id": event_id, "invalid_at": invalid_at,
            # Transaction time: the record is retired when the retiring statement was published.
            "expired_at": max(primary["created_at"], secondary["created_at"]),
            "invalidated_by": invalidated_by,
        })
    counts["invalidated_events"] = len(invalidations)
    counts["true_verdicts"] = sum(1 for j in judgments if j["invalidates"] and j["judge"] == judge.name)
    counts["revised_figures"] = revisions.figure_invalidations.num_rows
    counts["events_retired_by_figures"] = len(revisions.retired_events)
    return InvalidationResult(
        event_invalidations=tables.to_table(invalidations, tables.EVENT_INVALIDATIONS),
        judgments=tables.to_table(judgments, tables.INVALIDATION_JUDGMENTS),
        counts=counts,
        figure_invalidations=revisions.figure_invalidations,
    )


def _fact_events(events: pa.Table, resolved_triplets: pa.Table) -> pa.Table:
    """FACT, non-ATEMPORAL events that have triplets, each with a key naming the fact it states."""
    with duckdb.connect() as connection:
        connection.register("events", events)
        connection.register("resolved_triplets", resolved_triplets)
        return connection.sql(read_sql("pipeline/fact_events.sql"),
                              params=[list(policy.POLICY.statement_types), list(policy.POLICY.never)]).to_arrow_table()


def _links(resolved_triplets: pa.Table, facts: pa.Table) -> pa.Table:
    groups = {p.value: g for p, g in policy.POLICY.group_of.items()}
    fact_ids = set(facts.column("event_id").to_pylist())
    rows = []
    for row in resolved_triplets.select(["event_id", "subject_id", "object_id", "predicate"]).to_pylist():
        if row["event_id"] not in fact_ids or row["predicate"] not in groups:
            continue
        for canonical_id in {row["subject_id"], row["object_id"]} - {None}:
            rows.append({"event_id": row["event_id"], "canonical_id": canonical_id, "predicate_group": groups[row["predicate"]]})
    schema = pa.schema([("event_id", pa.string()), ("canonical_id", pa.string()), ("predicate_group", pa.int8())])
    return tables.to_table(rows, schema)


def _event_views(facts: pa.Table, resolved_triplets: pa.Table) -> dict[str, EventView]:
    triplets_by_event: dict[str, list[TripletView]] = defaultdict(list)
    for row in resolved_triplets.to_pylist():
        triplets_by_event[row["event_id"]].append(TripletView(
            subject=row["subject"], subject_id=row["subject_id"], predicate=row["predicate"],
            object=row["object"], object_id=row["object_id"], value=row["value"]))
    views = {}
    for row in facts.select(["event_id", "statement", "statement_type", "temporal_type", "valid_at", "invalid_at", "created_at"]).to_pylist():
        views[row["event_id"]] = EventView(**row, triplets=tuple(triplets_by_event.get(row["event_id"], ())))
    return views
