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

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol, Sequence

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tkg.core import tables
from tkg.core.models import Predicate
from tkg.core.paths import read_sql
from tkg.core.policy import (
    FUNCTIONAL_OFFICES,
    INVALIDATED_STATEMENT_TYPES,
    MIN_COSINE,
    NEVER_INVALIDATED_TEMPORAL_TYPES,
    PREDICATE_GROUP_OF,
    SINGLE_VALUED_PREDICATES,
    TOP_K,
    policy_fingerprint,
)
from tkg.invalidate.candidates import select_candidates
from tkg.invalidate.revisions import revise_figures
from tkg.store.warehouse import apply_model, model, register_raw


@dataclass(frozen=True)
class TripletView:
    subject: str
    subject_id: str
    predicate: str
    object: str
    object_id: str | None
    value: str | None


@dataclass(frozen=True)
class EventView:
    """What a judge sees of an event: statement, labels, validity range and canonical triplets."""

    event_id: str
    statement: str
    statement_type: str
    temporal_type: str
    valid_at: datetime | None
    invalid_at: datetime | None
    created_at: datetime
    triplets: tuple[TripletView, ...] = ()


@dataclass(frozen=True)
class Verdict:
    invalidates: bool
    reason: str


@dataclass(frozen=True)
class JudgeCase:
    """One primary (older, DYNAMIC) event and the later events that might retire it."""

    primary: EventView
    candidates: tuple[EventView, ...]


class Judge(Protocol):
    name: str

    def judge(self, cases: Sequence[JudgeCase]) -> list[list[Verdict]]:
        """For each case, one verdict per candidate, in order."""
        ...


# --- the offline judge -----------------------------------------------------------------------

_FUNCTIONAL_METRICS = {p.value for p in SINGLE_VALUED_PREDICATES}


def _office_role(office_name: str) -> str:
    return office_name.rpartition(" of ")[0] or office_name


def _normalised_value(value: str | None) -> str:
    return re.sub(r"[^\w.%$]", "", (value or "").lower())


def _measure(value: str | None) -> str:
    """What a value measures: an amount of money, a percentage (growth or margin) or basis points."""
    text = (value or "").lower()
    return "money" if "$" in text else "percent" if "%" in text or "percent" in text else "bps" if "basis point" in text else "other"


class RuleJudge:
    """Rule-based judge for functional relations.

    - One holder at a time: a newer, different holder of the same functional office (CEO,
      CFO, ...) at the same organisation retires the older holder. The same person restated,
      or a second, non-exclusive office, is compatible.
    - One value per metric per period: a newer, different value for the same subject,
      predicate (guidance or revenue) and metric-period retires the older value.
    """

    name = "rules:functional-v1"

    def settings_fingerprint(self, stage: str) -> str:
        """Besides the rules, the vocabulary and the policy (tkg.core.policy) decide the verdicts."""
        from tkg.core.models import vocabulary_fingerprint

        return f"{vocabulary_fingerprint()}:{policy_fingerprint()}"

    def judge(self, cases: Sequence[JudgeCase]) -> list[list[Verdict]]:
        return [[self._verdict(case.primary, candidate) for candidate in case.candidates] for case in cases]

    def _verdict(self, primary: EventView, secondary: EventView) -> Verdict:
        if secondary.valid_at is None or primary.valid_at is None or secondary.valid_at <= primary.valid_at:
            return Verdict(False, "the candidate does not start after the primary event")
        for old in primary.triplets:
            for new in secondary.triplets:
                if old.predicate != new.predicate:
                    continue
                if old.predicate == Predicate.HOLDS_ROLE.value and old.object_id and old.object_id == new.object_id:
                    role = _office_role(old.object)
                    if role not in FUNCTIONAL_OFFICES:
                        continue
                    if old.subject_id != new.subject_id:
                        return Verdict(True, f"{new.subject} holds {old.object} from {secondary.valid_at.date()}, "
                                             f"and {role} is held by one person at a time")
                    return Verdict(False, f"{old.subject} restated as {old.object}: compatible")
                if (old.predicate in _FUNCTIONAL_METRICS and old.subject_id == new.subject_id and old.object_id
                        and old.object_id == new.object_id):
                    if _measure(old.value) != _measure(new.value):
                        return Verdict(False, f"{old.value} and {new.value} measure different things: both can hold")
                    if _normalised_value(old.value) != _normalised_value(new.value):
                        return Verdict(True, f"{old.object} revised from {old.value} to {new.value}")
                    return Verdict(False, f"{old.object} restated at {old.value}: compatible")
        return Verdict(False, "no functional relation in common: both can hold at once")


# --- candidate selection and application -----------------------------------------------------


@dataclass
class InvalidationResult:
    event_invalidations: pa.Table
    judgments: pa.Table
    counts: Counter = field(default_factory=Counter)
    figure_invalidations: pa.Table = field(default_factory=lambda: tables.FIGURE_INVALIDATIONS.empty_table())
    path: Path | None = None
    stamp: object = None  # the tkg.core.versions.Stamp the tables were written with


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
    min_cosine: float = MIN_COSINE,
    top_k: int = TOP_K,
) -> InvalidationResult:
    """Judge every candidate pair and retire what the judge says is contradicted; revise
    guidance figures (tkg.invalidate.revisions) and retire statements whose figures were all revised.

    `events` are all temporal events; `resolved_triplets` come from `canonical_triplets`.
    """
    counts: Counter = Counter()
    facts = _fact_events(events, resolved_triplets)
    links = _links(resolved_triplets, facts)
    pairs = select_candidates(facts, links, min_cosine, top_k)
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
                              params=[list(INVALIDATED_STATEMENT_TYPES), list(NEVER_INVALIDATED_TEMPORAL_TYPES)]).to_arrow_table()


def _links(resolved_triplets: pa.Table, facts: pa.Table) -> pa.Table:
    groups = {p.value: g for p, g in PREDICATE_GROUP_OF.items()}
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
