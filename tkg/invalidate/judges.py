"""The judges: what decides whether a later event retires an older one (REFERENCE 1.8).

A `Judge` answers 1:N: for an older DYNAMIC fact and the later facts that may retire it, one
verdict each, with a reason. `RuleJudge` is the offline default; the LLM judge
(tkg.llm.extractor.LLMJudge) has the same interface. Both read the invalidation policy
(tkg.core.policy). The rule judge also takes a table of pairs at once (`RuleJudge.judge_table`,
what a build uses: millions of pairs in seconds), with the verdicts `judge` gives one by one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, Sequence

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tkg.core import policy
from tkg.core.models import Predicate
from tkg.core.policy import vocabulary_fingerprint
from tkg.core.results import Counted, StageStats


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
    """Keeps a usage counter 'judge' (tkg.core.results.Counted)."""

    name: str
    counters: tuple[str, ...]

    def settings_fingerprint(self, stage: str) -> str:
        """A short hash of everything besides its input that decides its verdicts."""
        ...

    def judge(self, cases: Sequence[JudgeCase]) -> list[list[Verdict]]:
        """For each case, one verdict per candidate, in order."""
        ...

    def stats(self, counter: str) -> StageStats: ...

    def usage_row(self, counter: str, usage: StageStats) -> dict | None: ...


# --- the offline judge -----------------------------------------------------------------------



def _office_role(office_name: str) -> str:
    return office_name.rpartition(" of ")[0] or office_name


def _normalised_value(value: str | None) -> str:
    return re.sub(r"[^\w.%$]", "", (value or "").lower())


def _measure(value: str | None) -> str:
    """What a value measures: an amount of money, a percentage (growth or margin) or basis points."""
    text = (value or "").lower()
    return "money" if "$" in text else "percent" if "%" in text or "percent" in text else "bps" if "basis point" in text else "other"


class RuleJudge(Counted):
    """Rule-based judge for functional relations.

    - One holder at a time: a newer, different holder of the same functional office (CEO,
      CFO, ...) at the same organisation retires the older holder. The same person restated,
      or a second, non-exclusive office, is compatible.
    - One value per metric per period: a newer, different value for the same subject,
      predicate (guidance or revenue) and metric-period retires the older value.
    """

    name = "rules:functional-v1"
    counters = ("judge",)

    def settings_fingerprint(self, stage: str) -> str:
        """Besides the rules, the vocabulary and the policy (tkg.core.policy) decide the verdicts."""
        return f"{vocabulary_fingerprint()}:{policy.POLICY.fingerprint()}"

    def judge(self, cases: Sequence[JudgeCase]) -> list[list[Verdict]]:
        return [[self._verdict(case.primary, candidate) for candidate in case.candidates] for case in cases]

    def _verdict(self, primary: EventView, secondary: EventView) -> Verdict:
        if secondary.valid_at is None or primary.valid_at is None or secondary.valid_at <= primary.valid_at:
            return Verdict(False, NOT_AFTER)
        for old in primary.triplets:
            for new in secondary.triplets:
                verdict = _functional_verdict(old, new, secondary.valid_at)
                if verdict is not None:
                    return verdict
        return Verdict(False, NO_RELATION)

    def judge_table(self, pairs: pa.Table, facts: pa.Table, triplets: pa.Table) -> tuple[pa.Array, pa.Array]:
        """The verdicts `judge` gives, for a table of pairs at once: (invalidates, reason), one
        per row of `pairs` (primary_event_id, secondary_event_id), in its order. `facts` hold
        each event's event_id and valid_at, `triplets` the events' canonical triplets.

        Most pairs share no functional relation, or do not start in order: they are told so by
        joins. Only the triplet pairs a rule could decide on go through the rules one by one,
        in the order `judge` tries them (the primary's triplets, then the candidate's, in the
        order of `triplets`)."""
        starts = (pl.from_arrow(facts.select(["event_id", "valid_at"]))
                  .unique("event_id", keep="last", maintain_order=True))
        rows = (pl.from_arrow(pairs.select(["primary_event_id", "secondary_event_id"])).with_row_index("pair")
                .join(starts.rename({"event_id": "primary_event_id", "valid_at": "primary_at"}), on="primary_event_id",
                      how="left")
                .join(starts.rename({"event_id": "secondary_event_id", "valid_at": "secondary_at"}), on="secondary_event_id",
                      how="left")
                .sort("pair"))
        known = pl.concat([rows["primary_event_id"], rows["secondary_event_id"]]).is_in(starts["event_id"])
        if not known.all():
            raise ValueError("pairs name events the facts do not hold")
        after = (rows["secondary_at"] > rows["primary_at"]).fill_null(False).to_numpy()
        invalidates = np.zeros(len(rows), dtype=bool)
        texts = [NOT_AFTER, NO_RELATION]  # each pair's reason, as its position in `texts`
        reasons = after.astype(np.int64)
        columns = ["event_id", "subject", "subject_id", "predicate", "object", "object_id", "value"]
        views = pl.from_arrow(triplets.select(columns)).with_row_index("position")
        rules = policy.POLICY
        present = views["predicate"].unique().drop_nulls().to_list()
        single_valued = [name for name in present if name in rules.single_valued]
        # the triplet pairs a rule may decide on: the same predicate and object (HOLDS_ROLE),
        # or the same subject, predicate and object (a single-valued predicate)
        matches = (rows.filter(pl.Series(after)).select("pair", "primary_event_id", "secondary_event_id", "secondary_at")
                   .join(views, left_on="primary_event_id", right_on="event_id")
                   .join(views, left_on=["secondary_event_id", "predicate"], right_on=["event_id", "predicate"],
                         suffix="_new")
                   .filter(pl.col("object_id").is_not_null() & (pl.col("object_id") != "")
                           & (pl.col("object_id") == pl.col("object_id_new"))
                           & ((pl.col("predicate") == Predicate.HOLDS_ROLE.value)
                              | (pl.col("predicate").is_in(single_valued)
                                 & pl.col("subject_id").eq_missing(pl.col("subject_id_new")))))
                   .sort("pair", "position", "position_new"))
        decided = -1
        fields = ("subject", "subject_id", "predicate", "object", "object_id", "value")
        for row in matches.iter_rows(named=True):
            if row["pair"] == decided:
                continue
            old = TripletView(**{name: row[name] for name in fields})
            new = TripletView(**{name: row[name if name == "predicate" else name + "_new"] for name in fields})
            verdict = _functional_verdict(old, new, row["secondary_at"])
            if verdict is not None:
                decided = row["pair"]
                invalidates[decided], reasons[decided] = verdict.invalidates, len(texts)
                texts.append(verdict.reason)
        return pa.array(invalidates, pa.bool_()), pc.take(pa.array(texts, pa.string()), pa.array(reasons))


NOT_AFTER = "the candidate does not start after the primary event"
NO_RELATION = "no functional relation in common: both can hold at once"


def _functional_verdict(old: TripletView, new: TripletView, secondary_at: datetime) -> Verdict | None:
    """What one triplet of the older event and one of the newer decide, or None when they
    decide nothing (the judge goes on to the next two)."""
    if old.predicate != new.predicate:
        return None
    if old.predicate == Predicate.HOLDS_ROLE.value and old.object_id and old.object_id == new.object_id:
        role = _office_role(old.object)
        if role not in policy.POLICY.offices:
            return None
        if old.subject_id != new.subject_id:
            return Verdict(True, f"{new.subject} holds {old.object} from {secondary_at.date()}, "
                                 f"and {role} is held by one person at a time")
        return Verdict(False, f"{old.subject} restated as {old.object}: compatible")
    if (old.predicate in policy.POLICY.single_valued and old.subject_id == new.subject_id and old.object_id
            and old.object_id == new.object_id):
        if _measure(old.value) != _measure(new.value):
            return Verdict(False, f"{old.value} and {new.value} measure different things: both can hold")
        if _normalised_value(old.value) != _normalised_value(new.value):
            return Verdict(True, f"{old.object} revised from {old.value} to {new.value}")
        return Verdict(False, f"{old.object} restated at {old.value}: compatible")
    return None
