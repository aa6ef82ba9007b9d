"""The invalidation policy, in one place: what may contradict what, and what holds one value at a time.

Everything that decides whether a newer fact retires an older one reads `POLICY`: the rule
judge (tkg.invalidate.judges), the LLM judge's prompt, candidate selection
(tkg.invalidate.candidates), the statement filter (sql/pipeline/fact_events.sql), figure
revisions (tkg.invalidate.revisions) and the `one_holder_per_office` check. Its fingerprint
covers every field of the policy, so a new rule cannot be left out of it: editing any of them
marks `invalidated_events` stale and never reuses a verdict given under the old policy.

The predicate vocabulary's fingerprint (names, definitions and the groups below) lives here
too: triplet extraction and the judges hash it into their code versions and cache keys.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from tkg.core import models
from tkg.core.models import Predicate


@dataclass(frozen=True)
class InvalidationPolicy:
    """Every rule of invalidation. Field names are the keys of the policy's fingerprint."""

    # Only facts retire and get retired: an opinion or a prediction states no fact a later one
    # can end (REFERENCE 1.8). Guidance, a prediction by nature, is revised through its
    # figures (below), not through its statement.
    statement_types: tuple[str, ...] = ("FACT",)
    # Temporal types that are never retired: an ATEMPORAL statement never stops being true.
    never: tuple[str, ...] = ("ATEMPORAL",)
    # Facts may only contradict facts whose predicate is in the same group (REFERENCE 1.5).
    groups: tuple[tuple[Predicate, ...], ...] = (
        (Predicate.IS_A, Predicate.HAS_A, Predicate.LOCATED_IN, Predicate.HOLDS_ROLE, Predicate.PART_OF),
        (Predicate.PRODUCES, Predicate.SELLS, Predicate.SUPPLIES, Predicate.DISCONTINUED, Predicate.SECURED),
        (Predicate.LAUNCHED, Predicate.DEVELOPED, Predicate.ADOPTED_BY, Predicate.INVESTS_IN, Predicate.COLLABORATES_WITH),
        (Predicate.HAS_REVENUE, Predicate.INCREASED, Predicate.DECREASED, Predicate.RESULTED_IN, Predicate.TARGETS),
    )
    # A candidate pair needs at least this statement-embedding cosine; each event keeps its
    # `top_k` best candidates per kind (see tkg.invalidate.candidates).
    min_cosine: float = 0.5
    top_k: int = 10
    # Offices held by one person at a time per organisation: a new holder ends the previous one.
    offices: frozenset[str] = frozenset({"CEO", "CFO", "COO", "CTO", "CAO", "President", "Chairman",
                                         "Chairman of the Management Board"})
    # Offices a company gives one person at a time beyond `offices` (which the judge compares
    # by office entity): (name, pattern on the title without the company, reason). A title
    # matching a pattern is in that office (a named group `segment` makes one office per
    # segment); a different person listed in it at a later call ends the earlier holder
    # (tkg.invalidate.positions). The first matching entry wins.
    single_holder_offices: tuple[tuple[str, str, str], ...] = (
        ("investor relations head", r"\bIR\b|Investor Relations",
         "the company's investor-relations head hosts the call; a new host listed in that office replaces the old one"),
        ("president", r"^President$", "a company has one president; a division's president is a segment head"),
        ("COO", r"^(?:COO|Chief Operating Officer)$", "one chief operating officer at a time"),
        ("CTO", r"^(?:CTO|Chief Technology Officer)$", "one chief technology officer at a time"),
        ("segment head", r"^(?:(?:S|E)?VP (?:&|and) )?(?:GM|General Manager|President|Head|Chief Executive|CEO) of (?P<segment>.+)$",
         "each named group, business or division has one general manager or president at a time"),
    )
    # Offices whose holder is on every call by function: when the holder stops appearing in the
    # participants for good, the office ends at the first call without them (an ending inferred
    # from absence, labelled so, not stated).
    absence_ends: tuple[tuple[str, str], ...] = (
        ("investor relations head", "the investor-relations head opens every call; one who is never listed again "
                                    "has left the office, though no statement says so"),
    )
    # A person works at one firm at a time, and a later title at the same firm replaces the
    # earlier one (tkg.invalidate.positions): both read the participants lists.
    one_firm_at_a_time: bool = True
    titles_replace_titles: bool = True
    # Words that do not tell one firm from another ('RBC Capital Markets, LLC, Research Division'
    # is 'RBC'), and spellings of one firm's name (folded), for tkg.core.names.firm_key.
    firm_generic_words: frozenset[str] = frozenset({
        "capital", "markets", "securities", "research", "division", "equity", "equities", "bank", "investment",
        "institutional", "companies", "company", "associates", "partners", "financial", "international", "intl",
        "america", "usa", "global", "services", "corporate", "llc", "inc", "co", "the", "and", "of", "group", "plc",
        "ltd", "limited", "incorporated", "corp", "corporation", "ag", "sa", "lp", "llp", "lllp", "chase", "arm", "technology"})
    firm_spellings: tuple[tuple[str, str], ...] = (("j p morgan", "jpmorgan"), ("jp morgan", "jpmorgan"),
                                                   ("bank of america", "bofa"), ("secuties", "securities"))
    # One value per subject, metric and period: a different later value revises the earlier one.
    single_valued: frozenset[Predicate] = frozenset({Predicate.TARGETS, Predicate.HAS_REVENUE})
    # Guidance holds one value per (company, metric, segment, fiscal period, unit) and is retired
    # by the next call that guides it differently or reports the actual, or closes with its
    # period (tkg.invalidate.revisions). The basis is compared within the group only when both
    # figures state one: an unstated basis matches either GAAP or non-GAAP.
    guidance_key: tuple[str, ...] = ("company", "metric", "segment", "fiscal_year", "fiscal_quarter", "unit")
    figure_judge: str = "rules:figure-revisions-2"
    # Two figures state the same value when every bound agrees to this relative tolerance.
    tolerance: float = 1e-9

    @cached_property
    def group_of(self) -> dict[Predicate, int]:
        """Each predicate's group, numbered from 1."""
        return {p: i + 1 for i, group in enumerate(self.groups) for p in group}

    def fingerprint(self) -> str:
        """A hash of every field, for code versions and cache keys."""
        text = json.dumps({field.name: _plain(getattr(self, field.name)) for field in fields(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def figure_values_agree(self, a: dict, b: dict) -> bool:
        """The same point value, or the same range: a restatement, which retires nothing."""
        def close(x: float | None, y: float | None) -> bool:
            if x is None or y is None:
                return x is None and y is None
            return math.isclose(x, y, rel_tol=self.tolerance, abs_tol=self.tolerance)
        return close(a["value"], b["value"]) and close(a["low"], b["low"]) and close(a["high"], b["high"])

    def describe_single_valued(self) -> str:
        """The single-valued relations in words, for the LLM judge's prompt."""
        offices = ", ".join(sorted(self.offices))
        metrics = " and ".join(sorted(p.value for p in self.single_valued))
        return (f"an office one person holds at a time ({offices}) now held by a different person; "
                f"a different value for the same subject, metric and period ({metrics}: guidance raised or cut, "
                "a result restated)")


def _plain(value: Any) -> Any:
    """A JSON-able form that does not depend on set order."""
    if isinstance(value, (frozenset, set)):
        return sorted(_plain(item) for item in value)
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    return value


POLICY = InvalidationPolicy()

# Stages whose output the vocabulary shapes: triplet extraction (names and definitions are in
# its prompt and rules) and invalidation (the groups decide which facts may contradict).
VOCABULARY_STAGES = frozenset({"triplets", "judge"})


def vocabulary_fingerprint(policy: InvalidationPolicy = POLICY) -> str:
    """A hash of the predicate vocabulary: names, definitions and groups. It is part of the code
    version and the LLM cache key of the stages it shapes, so editing a definition marks them
    stale and never reuses an answer given under the old wording."""
    text = json.dumps({"definitions": {p.value: models.PREDICATE_DEFINITIONS.get(p) for p in Predicate},
                       "groups": [[p.value for p in group] for group in policy.groups]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
