"""The invalidation policy, in one place: what may contradict what, and what holds one value at a time.

Everything that decides whether a newer fact retires an older one reads this module: the rule
judge (tkg.invalidate.invalidation), the LLM judge's prompt, candidate selection (tkg.invalidate.candidates), the
statement filter (sql/pipeline/fact_events.sql), figure revisions (tkg.invalidate.revisions) and the
`one_holder_per_office` check. Its fingerprint is part of the judges' code version and of the
LLM judge's cache key, so editing any of it marks `invalidated_events` stale and never reuses
a verdict given under the old policy.
"""

from __future__ import annotations

import hashlib
import json
import math

from tkg.core.models import Predicate

# -- which events take part ---------------------------------------------------------------------

# Only facts retire and get retired: an opinion or a prediction states no fact a later one can
# end, and an ATEMPORAL statement never stops being true (REFERENCE 1.8). Guidance, a
# prediction by nature, is revised through its figures (below), not through its statement.
INVALIDATED_STATEMENT_TYPES = ("FACT",)
NEVER_INVALIDATED_TEMPORAL_TYPES = ("ATEMPORAL",)

# -- which pairs are compared ---------------------------------------------------------------------

# Facts may only contradict facts whose predicate is in the same group (REFERENCE 1.5).
PREDICATE_GROUPS: tuple[tuple[Predicate, ...], ...] = (
    (Predicate.IS_A, Predicate.HAS_A, Predicate.LOCATED_IN, Predicate.HOLDS_ROLE, Predicate.PART_OF),
    (Predicate.PRODUCES, Predicate.SELLS, Predicate.SUPPLIES, Predicate.DISCONTINUED, Predicate.SECURED),
    (Predicate.LAUNCHED, Predicate.DEVELOPED, Predicate.ADOPTED_BY, Predicate.INVESTS_IN, Predicate.COLLABORATES_WITH),
    (Predicate.HAS_REVENUE, Predicate.INCREASED, Predicate.DECREASED, Predicate.RESULTED_IN, Predicate.TARGETS),
)
PREDICATE_GROUP_OF: dict[Predicate, int] = {p: i + 1 for i, group in enumerate(PREDICATE_GROUPS) for p in group}
# A candidate pair needs at least this statement-embedding cosine; each event keeps its
# TOP_K best candidates per kind (see tkg.invalidate.candidates).
MIN_COSINE = 0.5
TOP_K = 10

# -- what holds one value at a time --------------------------------------------------------------

# Offices held by one person at a time per organisation: a new holder ends the previous one.
FUNCTIONAL_OFFICES = frozenset({"CEO", "CFO", "COO", "CTO", "CAO", "President", "Chairman", "Chairman of the Management Board"})
# One value per subject, metric and period: a different later value revises the earlier one.
SINGLE_VALUED_PREDICATES = frozenset({Predicate.TARGETS, Predicate.HAS_REVENUE})
# Guidance holds one value per (company, metric, segment, fiscal period, unit) and is retired by
# the next call that guides it differently or reports the actual (tkg.invalidate.revisions). The basis is
# compared within the group: an unstated basis matches either GAAP or non-GAAP.
GUIDANCE_KEY = ("company", "metric", "segment", "fiscal_year", "fiscal_quarter", "unit")
FIGURE_JUDGE = "rules:figure-revisions-1"
# Two figures state the same value when every bound agrees to this relative tolerance.
SAME_VALUE_TOLERANCE = 1e-9


def figure_values_agree(a: dict, b: dict) -> bool:
    """The same point value, or the same range: a restatement, which retires nothing."""
    def close(x: float | None, y: float | None) -> bool:
        if x is None or y is None:
            return x is None and y is None
        return math.isclose(x, y, rel_tol=SAME_VALUE_TOLERANCE, abs_tol=SAME_VALUE_TOLERANCE)
    return close(a["value"], b["value"]) and close(a["low"], b["low"]) and close(a["high"], b["high"])


def describe_single_valued() -> str:
    """The single-valued relations in words, for the LLM judge's prompt."""
    offices = ", ".join(sorted(FUNCTIONAL_OFFICES))
    metrics = " and ".join(sorted(p.value for p in SINGLE_VALUED_PREDICATES))
    return (f"an office one person holds at a time ({offices}) now held by a different person; "
            f"a different value for the same subject, metric and period ({metrics}: guidance raised or cut, "
            "a result restated)")


def policy_fingerprint() -> str:
    """A hash of the whole policy, for code versions and cache keys."""
    text = json.dumps({
        "statement_types": INVALIDATED_STATEMENT_TYPES, "never": NEVER_INVALIDATED_TEMPORAL_TYPES,
        "groups": [[p.value for p in group] for group in PREDICATE_GROUPS], "min_cosine": MIN_COSINE, "top_k": TOP_K,
        "offices": sorted(FUNCTIONAL_OFFICES), "single_valued": sorted(p.value for p in SINGLE_VALUED_PREDICATES),
        "guidance_key": GUIDANCE_KEY, "figure_judge": FIGURE_JUDGE, "tolerance": SAME_VALUE_TOLERANCE,
    }, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
