"""Invalidation: newer facts retire older DYNAMIC facts they contradict (REFERENCE 1.8).

The whole history is a function of the set of events and never of the order partitions were
materialised in: a backfill of 2019 before 2016, or a missed call added last, gives the same
`invalid_at`, `invalidated_by` and `expired_at`, and removing an event re-opens whatever only
it had retired. Verdicts are cached (the LLM judge) or cheap (the rule judge), so recomputing
does not repay for old pairs.

It runs in phases, so that the heavy ones can run per shard of the blocks (one process each,
tkg.invalidate.stages) and the in-memory path (`invalidate`, for tests and small graphs) is the
same phases run once:
1. the facts (FACT, non-ATEMPORAL events with triplets, each with the key of the fact it
   states) and their links to canonical entities, by predicate group: the blocks;
2. candidate selection (tkg.invalidate.candidates: rank per shard, select over all shards,
   pair per shard);
3. `judge_pairs`: one judge request per primary event covers all its candidates (1:N), and
   each primary's earliest retirer is kept;
4. `retirements`: each event's earliest retirement over every shard, and by the revision of
   all the figures it states (tkg.invalidate.revisions).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tkg.core import policy, tables
from tkg.core.arrays import run_starts
from tkg.core.paths import read_sql
from tkg.invalidate.candidates import select_candidates
from tkg.invalidate.judges import EventView, Judge, JudgeCase, TripletView
from tkg.invalidate.positions import STATEMENT, PositionEnd
from tkg.invalidate.revisions import revise_figures
from tkg.store.warehouse import apply_model, model, register_raw

WINNERS = tables.RETIREMENTS  # each primary's earliest retirer in one shard; all shards' meet in `retirements`

# Each primary's earliest retirer among the pairs judged to retire it, over a table of
# `judgments` and one of `events` (event_id, valid_at): the earliest valid_at, ties on the event id.
EARLIEST_RETIRER_SQL = """
    SELECT j.primary_event_id AS event_id, f.valid_at AS invalid_at, j.secondary_event_id AS invalidated_by
    FROM {judgments} j JOIN {events} f ON f.event_id = j.secondary_event_id
    WHERE j.invalidates
    QUALIFY row_number() OVER (PARTITION BY j.primary_event_id ORDER BY f.valid_at, j.secondary_event_id) = 1
    ORDER BY event_id"""


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


def fact_events_sql() -> str:
    """The query of the facts (sql/pipeline/fact_events.sql) over views `events` and
    `resolved_triplets`; its two parameters are the policy's statement types and the temporal
    types never retired."""
    return read_sql("pipeline/fact_events.sql")


def fact_event_parameters() -> list:
    return [list(policy.POLICY.statement_types), list(policy.POLICY.never)]


# Each fact's canonical entities (subject and object of its triplets) under the predicate group
# of the triplet: the blocks it belongs to.
LINKS_SQL = """
    SELECT DISTINCT event_id, canonical_id, predicate_group FROM (
        SELECT t.event_id, t.subject_id AS canonical_id, g.predicate_group
        FROM resolved_triplets t JOIN predicate_groups g USING (predicate)
        UNION ALL
        SELECT t.event_id, t.object_id AS canonical_id, g.predicate_group
        FROM resolved_triplets t JOIN predicate_groups g USING (predicate))
    WHERE canonical_id IS NOT NULL AND event_id IN (SELECT event_id FROM facts)"""


def register_predicate_groups(connection: duckdb.DuckDBPyConnection) -> None:
    """The policy's predicate groups as table `predicate_groups` (predicate, predicate_group)."""
    groups = policy.POLICY.group_of
    connection.register("predicate_groups", pa.table({
        "predicate": pa.array([p.value for p in groups], pa.string()),
        "predicate_group": pa.array(list(groups.values()), pa.int8())}))


def facts_and_links(events: pa.Table, resolved_triplets: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Phase 1 in memory: the facts and their links (event_id, canonical_id, predicate_group)."""
    with duckdb.connect() as connection:
        connection.register("events", events)
        connection.register("resolved_triplets", resolved_triplets)
        register_predicate_groups(connection)
        facts = connection.sql(f"SELECT f.*, e.statement, e.embedding FROM ({fact_events_sql()}) f "
                               "JOIN events e USING (event_id) ORDER BY event_id", params=fact_event_parameters()).to_arrow_table()
        connection.register("facts", facts)
        links = connection.sql(LINKS_SQL + " ORDER BY ALL").to_arrow_table()
    return facts, links


# Primaries judged at once: their pairs and what the judge sees of their events are Python
# objects, so a shard of millions of pairs is judged a slice at a time in bounded memory.
JUDGE_SLICE = 20_000


def judge_pairs(pairs: pa.Table, facts: pa.Table, resolved_triplets: pa.Table, judge: Judge) -> tuple[pa.Table, pa.Table, Counter]:
    """Phase 3: the judge's verdict on every pair (one request per primary event for all its
    candidates, or the whole table at once for a judge with `judge_table`), and each primary's
    earliest retirer among the pairs it said retire it. Returns (judgments, winners, counts)."""
    counts: Counter = Counter(candidate_pairs=pairs.num_rows)
    if pairs.num_rows == 0:
        return tables.INVALIDATION_JUDGMENTS.empty_table(), WINNERS.empty_table(), counts
    pairs = pairs.sort_by([("primary_event_id", "ascending")])
    if hasattr(judge, "judge_table"):  # a judge that takes the pairs as a table (the rule judge)
        judgments = _judge_table(pairs, facts, resolved_triplets, judge)
    else:
        primary_ids = pairs.column("primary_event_id")
        starts = run_starts(pc.dictionary_encode(primary_ids).combine_chunks().indices.to_numpy(zero_copy_only=False))
        bounds = [*starts[::JUDGE_SLICE].tolist(), pairs.num_rows]
        judgments = pa.concat_tables([
            tables.to_table(_judge_slice(pairs.slice(low, high - low), facts, resolved_triplets, judge),
                            tables.INVALIDATION_JUDGMENTS)
            for low, high in zip(bounds[:-1], bounds[1:])])
    counts["judged_pairs"] += judgments.num_rows
    counts["true_verdicts"] += pc.sum(judgments.column("invalidates")).as_py() or 0
    with duckdb.connect() as connection:
        connection.register("judged", judgments)
        connection.register("facts", facts.select(["event_id", "valid_at"]))
        winners = connection.sql(EARLIEST_RETIRER_SQL.format(judgments="judged", events="facts")).to_arrow_table()
    return judgments, winners.cast(WINNERS), counts


def _judge_table(pairs: pa.Table, facts: pa.Table, resolved_triplets: pa.Table, judge: Judge) -> pa.Table:
    """The judgment rows of `pairs` by a judge's `judge_table`: made as columns rather than a
    Python object per pair."""
    invalidates, reasons = judge.judge_table(pairs, facts, resolved_triplets)
    return pa.table({**{name: pairs.column(name) for name in ("primary_event_id", "secondary_event_id")},
                     "invalidates": invalidates, "reason": reasons,
                     "judge": pa.repeat(pa.scalar(judge.name, pa.string()), pairs.num_rows),
                     **{name: pairs.column(name) for name in ("cosine", "shared_entity_id", "predicate_group")}}
                    ).cast(tables.INVALIDATION_JUDGMENTS)


def _judge_slice(pairs: pa.Table, facts: pa.Table, resolved_triplets: pa.Table, judge: Judge) -> list[dict]:
    """The judgment rows of the pairs of some primaries (`pairs` holds every pair of each), by
    the judge's `judge`, a case per primary."""
    involved = set(pairs.column("primary_event_id").to_pylist()) | set(pairs.column("secondary_event_id").to_pylist())
    views = _event_views(facts, resolved_triplets, involved)
    by_primary: dict[str, list[dict]] = defaultdict(list)
    for pair in pairs.to_pylist():
        by_primary[pair["primary_event_id"]].append(pair)
    primaries = sorted(by_primary)
    cases = [JudgeCase(views[p], tuple(views[c["secondary_event_id"]] for c in by_primary[p])) for p in primaries]
    return [{**pair, "invalidates": verdict.invalidates, "reason": verdict.reason, "judge": judge.name}
            for primary_id, case_verdicts in zip(primaries, judge.judge(cases))
            for pair, verdict in zip(by_primary[primary_id], case_verdicts)]


def retirements(winners: pa.Table, retired_by_figures: dict[str, tuple[datetime, str]],
                timing: dict[str, dict], positions: dict[str, PositionEnd] | None = None) -> pa.Table:
    """Phase 4: each event's earliest retirement, by a judged contradiction (the `winners` of
    every shard), by the revision of every figure it states, or by what the participants lists
    show (`positions`, tkg.invalidate.positions); `timing` holds each involved event's
    invalid_at and created_at. A finished event's end only ever moves earlier. On one day a
    stated ending wins over one inferred from absence."""
    ends: dict[str, tuple] = {}

    def offer(event_id: str, invalid_at: datetime, invalidated_by: str | None, evidence: str, reason: str | None,
              known_at: datetime | None) -> None:
        key = (invalid_at, evidence != STATEMENT, invalidated_by or "")
        if event_id not in ends or key < ends[event_id][0]:
            ends[event_id] = (key, invalidated_by, evidence, reason, known_at)

    for row in winners.to_pylist():
        offer(row["event_id"], row["invalid_at"], row["invalidated_by"], STATEMENT, None, None)
    for event_id, (invalid_at, invalidated_by) in retired_by_figures.items():
        offer(event_id, invalid_at, invalidated_by, STATEMENT, None, None)
    for event_id, end in (positions or {}).items():
        offer(event_id, end.invalid_at, end.invalidated_by, end.evidence, end.reason, end.known_at)
    invalidations = []
    for event_id, ((invalid_at, _, _), invalidated_by, evidence, reason, known_at) in sorted(ends.items()):
        primary = timing[event_id]
        if primary["invalid_at"] is not None and invalid_at >= primary["invalid_at"]:
            continue
        shown_at = timing[invalidated_by]["created_at"] if invalidated_by is not None else known_at
        invalidations.append({
            "event_id": event_id, "invalid_at": invalid_at,
            # Transaction time: the record is retired when the retiring statement was published
            # (for an ending inferred from absence, the first call without the holder).
            "expired_at": max(primary["created_at"], shown_at),
            "invalidated_by": invalidated_by, "end_evidence": evidence, "end_reason": reason,
        })
    return tables.to_table(invalidations, tables.EVENT_INVALIDATIONS)


def involved_events(winners: pa.Table, retired_by_figures: dict[str, tuple[datetime, str]],
                    positions: dict[str, PositionEnd] | None = None) -> list[str]:
    """The events `retirements` needs the timing of."""
    found = set(winners.column("event_id").to_pylist()) | set(winners.column("invalidated_by").to_pylist())
    for event_id, (_, retirer) in retired_by_figures.items():
        found.update((event_id, retirer))
    for event_id, end in (positions or {}).items():
        found.update(item for item in (event_id, end.invalidated_by) if item is not None)
    return sorted(found)


def invalidate(
    events: pa.Table,
    resolved_triplets: pa.Table,
    judge: Judge,
    figures: pa.Table | None = None,
    min_cosine: float | None = None,
    top_k: int | None = None,
) -> InvalidationResult:
    """All the phases in memory, as one shard: judge every candidate pair and retire what the
    judge says is contradicted; revise guidance figures (tkg.invalidate.revisions) and retire
    statements whose figures were all revised.

    `events` are all temporal events; `resolved_triplets` come from `canonical_triplets`.
    """
    rules = policy.POLICY
    facts, links = facts_and_links(events, resolved_triplets)
    pairs = select_candidates(facts, links, rules.min_cosine if min_cosine is None else min_cosine,
                              rules.top_k if top_k is None else top_k)
    judgments, winners, counts = judge_pairs(pairs, facts, resolved_triplets, judge)
    counts["fact_events"] = facts.num_rows
    revisions = revise_figures(figures if figures is not None else tables.FIGURES.empty_table())
    wanted = pa.array(involved_events(winners, revisions.retired_events), pa.string())
    timing = {row["event_id"]: row for row in events.select(["event_id", "invalid_at", "created_at"])
              .filter(pc.is_in(events.column("event_id"), value_set=wanted)).to_pylist()}
    invalidations = retirements(winners, revisions.retired_events, timing)
    counts["invalidated_events"] = invalidations.num_rows
    counts["revised_figures"] = revisions.figure_invalidations.num_rows
    counts["events_retired_by_figures"] = len(revisions.retired_events)
    return InvalidationResult(
        event_invalidations=invalidations,
        judgments=pa.concat_tables([judgments, tables.to_table(revisions.judgments, tables.INVALIDATION_JUDGMENTS)]),
        counts=counts,
        figure_invalidations=revisions.figure_invalidations,
    )


def _event_views(facts: pa.Table, resolved_triplets: pa.Table, wanted: set[str]) -> dict[str, EventView]:
    """What the judge sees of the `wanted` events: statement, labels, validity and canonical triplets."""
    chosen = pa.array(sorted(wanted), pa.string())
    triplets_by_event: dict[str, list[TripletView]] = defaultdict(list)
    picked = resolved_triplets.filter(pc.is_in(resolved_triplets.column("event_id"), value_set=chosen))
    for row in picked.select(["event_id", "subject", "subject_id", "predicate", "object", "object_id", "value"]).to_pylist():
        triplets_by_event[row["event_id"]].append(TripletView(
            subject=row["subject"], subject_id=row["subject_id"], predicate=row["predicate"],
            object=row["object"], object_id=row["object_id"], value=row["value"]))
    views = {}
    rows = facts.filter(pc.is_in(facts.column("event_id"), value_set=chosen))
    for row in rows.select(["event_id", "statement", "statement_type", "temporal_type", "valid_at", "invalid_at", "created_at"]).to_pylist():
        views[row["event_id"]] = EventView(**row, triplets=tuple(triplets_by_event.get(row["event_id"], ())))
    return views
