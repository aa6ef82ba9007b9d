"""Revisions of financial figures: which guidance a later call retired, when, and by which figure.

Guidance is single-valued per (company, metric, segment, basis, fiscal period) (see
tkg.core.policy): it is retired at the first later call that
- guides the same period to a different value ('we now expect $33.1 billion to $33.3 billion'),
- or reports the actual for that period (a reported figure of the same metric and segment,
  whose basis agrees or is not stated).
Restating the same value retires nothing, so 'reaffirming $1.20 billion' keeps the chain open
and the next different value retires every restatement of the old one at once.

Like event invalidation, the result is a function of the set of figures: every figure is
compared with every later one of its key, so neither the order partitions were built in nor
the build history changes it. A statement whose figures have all been retired is retired as an
event too ('reaffirming our outlook of $1.20 billion' does not stay a valid fact once the
outlook is $1.35 billion).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa

from tkg.core import policy, tables

_SHORT_SCALES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))


def _amount(value: float, unit: str) -> str:
    if unit == "percent":
        return f"{value:g}%"
    for scale, suffix in _SHORT_SCALES:
        if abs(value) >= scale:
            return f"{value / scale:.4g}{suffix} {unit}"
    return f"{value:g} {unit}"


def describe(row: dict) -> str:
    """'33.1B-33.3B USD' or '46%': a figure's value for a reason text."""
    if row["low"] is not None and row["high"] is not None:
        return f"{_amount(row['low'], row['unit'])} to {_amount(row['high'], row['unit'])}"
    return _amount(row["value"], row["unit"])


def period_label(row: dict) -> str:
    return f"Q{row['fiscal_quarter']} FY{row['fiscal_year']}" if row["fiscal_quarter"] else f"FY{row['fiscal_year']}"


@dataclass
class FigureRevisions:
    figure_invalidations: pa.Table
    judgments: list[dict]  # rows of tables.INVALIDATION_JUDGMENTS
    retired_events: dict[str, tuple[datetime, str]]  # event -> (invalid_at, invalidated_by): every figure retired


def _period_key(row: dict) -> tuple:
    return tuple(row[column] for column in policy.POLICY.guidance_key)


def _bases_agree(guidance: dict, actual: dict) -> bool:
    return guidance["basis"] is None or actual["basis"] is None or guidance["basis"] == actual["basis"]


def _retirer(guidance: dict, later: list[dict]) -> tuple[dict, str] | None:
    """The first later figure that retires `guidance`, with the reason; `later` is sorted by time."""
    for row in later:
        if row["stated_at"] <= guidance["stated_at"]:
            continue
        if row["kind"] == "reported" and _bases_agree(guidance, row):
            return row, (f"{period_label(guidance)} {guidance['metric']} reported at {describe(row)}: "
                         f"the guidance of {describe(guidance)} is retired")
        if row["kind"] == "guidance" and row["basis"] == guidance["basis"] and not policy.POLICY.figure_values_agree(guidance, row):
            return row, f"{period_label(guidance)} {guidance['metric']} guidance revised from {describe(guidance)} to {describe(row)}"
    return None


def revise_figures(figures: pa.Table) -> FigureRevisions:
    """Retire every guidance figure a later call revised or reported (see the module docstring)."""
    by_period: dict[tuple, list[dict]] = defaultdict(list)
    rows = figures.to_pylist()
    for row in rows:
        by_period[_period_key(row)].append(row)
    invalidations, judgments = [], []
    retired: dict[str, dict] = {}
    for group in by_period.values():
        group.sort(key=lambda r: (r["stated_at"], r["figure_id"]))
        for row in group:
            if row["kind"] != "guidance":
                continue
            found = _retirer(row, group)
            if found is None:
                continue
            winner, reason = found
            retired[row["figure_id"]] = {"invalid_at": winner["stated_at"], "invalidated_by": winner["event_id"]}
            invalidations.append({"figure_id": row["figure_id"], "invalid_at": winner["stated_at"],
                                  "expired_at": winner["stated_at"], "invalidated_by": winner["event_id"],
                                  "invalidated_by_figure": winner["figure_id"], "reason": reason})
            judgments.append({"primary_event_id": row["event_id"], "secondary_event_id": winner["event_id"], "invalidates": True,
                              "reason": reason, "judge": policy.POLICY.figure_judge, "cosine": None, "shared_entity_id": None,
                              "predicate_group": None})
    by_event: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        by_event[row["event_id"]].append(row["figure_id"])
    retired_events = {}
    for event_id, figure_ids in by_event.items():
        if all(figure_id in retired for figure_id in figure_ids):
            last = max((retired[f] for f in figure_ids), key=lambda r: (r["invalid_at"], r["invalidated_by"]))
            retired_events[event_id] = (last["invalid_at"], last["invalidated_by"])
    invalidations.sort(key=lambda r: r["figure_id"])
    judgments.sort(key=lambda r: (r["primary_event_id"], r["secondary_event_id"], r["reason"]))
    return FigureRevisions(tables.to_table(invalidations, tables.FIGURE_INVALIDATIONS), judgments, retired_events)

