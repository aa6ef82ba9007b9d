"""The judges: what decides whether a later event retires an older one (REFERENCE 1.8).

A `Judge` answers 1:N: for an older DYNAMIC fact and the later facts that may retire it, one
verdict each, with a reason. `RuleJudge` is the offline default; the LLM judge
(tkg.llm.extractor.LLMJudge) has the same interface. Both read the invalidation policy
(tkg.core.policy).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, Sequence

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
            return Verdict(False, "the candidate does not start after the primary event")
        for old in primary.triplets:
            for new in secondary.triplets:
                if old.predicate != new.predicate:
                    continue
                if old.predicate == Predicate.HOLDS_ROLE.value and old.object_id and old.object_id == new.object_id:
                    role = _office_role(old.object)
                    if role not in policy.POLICY.offices:
                        continue
                    if old.subject_id != new.subject_id:
                        return Verdict(True, f"{new.subject} holds {old.object} from {secondary.valid_at.date()}, "
                                             f"and {role} is held by one person at a time")
                    return Verdict(False, f"{old.subject} restated as {old.object}: compatible")
                if (old.predicate in policy.POLICY.single_valued and old.subject_id == new.subject_id and old.object_id
                        and old.object_id == new.object_id):
                    if _measure(old.value) != _measure(new.value):
                        return Verdict(False, f"{old.value} and {new.value} measure different things: both can hold")
                    if _normalised_value(old.value) != _normalised_value(new.value):
                        return Verdict(True, f"{old.object} revised from {old.value} to {new.value}")
                    return Verdict(False, f"{old.object} restated at {old.value}: compatible")
        return Verdict(False, "no functional relation in common: both can hold at once")
