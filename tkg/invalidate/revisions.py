"""Revisions of financial figures: which guidance a later call retired, when, and by which figure.

Guidance is single-valued per (company, metric, segment, basis, fiscal period) (see
tkg.core.policy): it is retired at the first later call that
- guides the same period to a different value ('we now expect $33.1 billion to $33.3 billion'),
- or reports the actual for that period (a reported figure of the same metric and segment,
  whose basis agrees or is not stated);
- and otherwise at the first later call that reports any result of the period, or the first
  call after the period ended: guidance for a closed period no longer stands.
The basis separates two chains only when both figures state one.
Restating the same value retires nothing, so 'reaffirming $1.20 billion' keeps the chain open
and the next different value retires every restatement of the old one at once.

Like event invalidation, the result is a function of the set of figures: every figure is
compared with every later one of its key, so neither the order partitions were built in nor
the build history changes it. A statement whose figures have all been retired is retired as an
event too ('reaffirming our outlook of $1.20 billion' does not stay a valid fact once the
outlook is $1.35 billion).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from itertools import groupby
from operator import itemgetter

import pyarrow as pa
import pyarrow.compute as pc

from tkg.core import policy, tables
from tkg.core.companies import fiscal_quarter_bounds, get_company

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
    # the guidance figures closed (their period's results came, `_closer`) rather than revised or
    # reported (a later figure of their own key, `_retirer`)
    closed: frozenset[str] = frozenset()


def _in_time(row: dict) -> tuple:
    return row["stated_at"], row["figure_id"]


def _bases_agree(guidance: dict, other: dict) -> bool:
    """The basis decides only when both sides state one: a restatement tagged non-GAAP once in a
    chain of unstated ones is the same guidance, not a second one standing beside it."""
    return guidance["basis"] is None or other["basis"] is None or guidance["basis"] == other["basis"]


def _retirer(guidance: dict, later: list[dict]) -> tuple[dict, str] | None:
    """The first later figure that retires `guidance`, with the reason; `later` holds the
    figures of its key stated after it, sorted by time and figure.

    Call by call: a reported actual retires it; a guided value retires it only when no figure of
    that call with an agreeing basis restates its value (a call that guides GAAP and non-GAAP
    EPS at once restates an unstated-basis guidance by one of them, and revises nothing)."""
    for _, call in groupby(later, key=itemgetter("stated_at")):  # a call's figures share its time
        rows = [r for r in call if _bases_agree(guidance, r)]
        if (actual := next((r for r in rows if r["kind"] == "reported"), None)) is not None:
            return actual, (f"{period_label(guidance)} {guidance['metric']} reported at {describe(actual)}: "
                            f"the guidance of {describe(guidance)} is retired")
        guided = [r for r in rows if r["kind"] == "guidance"]
        if any(policy.POLICY.figure_values_agree(guidance, r) for r in guided):
            continue  # restated: the guidance stands
        if guided:
            return guided[0], f"{period_label(guidance)} {guidance['metric']} guidance revised from {describe(guidance)} to {describe(guided[0])}"
    return None


# A figure's time is read as microseconds since the epoch (UTC): making a datetime of every
# figure's took two thirds of the time it took to read the figures.
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _moment(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def _period_end(fiscal_year_end_month: int | None, fiscal_year: int, fiscal_quarter: int | None) -> int | None:
    """The (exclusive) end of a fiscal period (a year when `fiscal_quarter` is None) on a
    calendar whose year ends in `fiscal_year_end_month` (None: a company not in the registry),
    in microseconds since the epoch."""
    if fiscal_year_end_month is None:
        return None
    _, after = fiscal_quarter_bounds(fiscal_year_end_month, fiscal_quarter or 4, fiscal_year)
    return _micros(datetime(after.year, after.month, after.day, tzinfo=timezone.utc))


def year_end_month(company_ticker: str) -> int | None:
    try:
        return get_company(company_ticker).fiscal_year_end_month
    except KeyError:
        return None


def _closer(guidance: dict, reported_by_period: dict[tuple, list[dict]], calls: tuple[list[int], list[dict]],
            end: int | None) -> tuple[dict, str] | None:
    """Guidance nothing revised or reported closes when its period's results are published: at
    the first later call that reports any figure of the period, or else the first call after the
    period ended (`end`; its results were due there). `calls` holds the company's calls by time:
    their times, and one figure of each."""
    key = (guidance["company"], guidance["fiscal_year"], guidance["fiscal_quarter"])
    reported = next((r for r in reported_by_period.get(key, []) if r["stated_at"] > guidance["stated_at"]), None)
    after_end = None
    if end is not None:  # the first call at or after the end, and after the guidance
        times, firsts = calls
        found = bisect_left(times, max(end, guidance["stated_at"] + 1))
        after_end = firsts[found] if found < len(times) else None
    if reported is not None and (after_end is None or reported["stated_at"] <= after_end["stated_at"]):
        return reported, (f"{period_label(guidance)} results reported on {_moment(reported['stated_at']):%Y-%m-%d}: the "
                          f"{guidance['metric']} guidance of {describe(guidance)} is closed")
    if after_end is not None:
        return after_end, (f"{period_label(guidance)} ended before the call of {_moment(after_end['stated_at']):%Y-%m-%d}: the "
                           f"{guidance['metric']} guidance of {describe(guidance)} is closed")
    return None


# The columns of a figure the revisions read (its text and call are not).
READ_COLUMNS = ("figure_id", "event_id", "company", "stated_at", "metric", "segment", "basis", "kind", "fiscal_year",
                "fiscal_quarter", "value", "low", "high", "unit")
READ_SCHEMA = pa.schema([tables.FIGURES.field(name) for name in READ_COLUMNS])


def company_slices(figures: pa.Table) -> Iterator[pa.Table]:
    """`figures` (ordered by company) a company at a time: guidance is keyed by its company, so
    each company's figures are revised on their own, one company's in memory at once."""
    companies = figures.column("company").to_pylist()
    start = 0
    for end in range(1, len(companies) + 1):
        if end == len(companies) or companies[end] != companies[start]:
            yield figures.slice(start, end - start)
            start = end


def revise_figures(figures: pa.Table, only: frozenset[str] | None = None) -> FigureRevisions:
    """Retire every guidance figure a later call revised or reported (see the module docstring).

    With `only`, the retirements of those guidance figures alone, and no retired events (they
    need every figure of an event): `figures` then needs to hold, for each of them, the figures
    of its key, the reported figures of its period and the first figure of each of its
    company's calls (tkg.invalidate.revising)."""
    by_period: dict[tuple, list[dict]] = defaultdict(list)
    read = figures.select(list(READ_COLUMNS))
    at = read.schema.get_field_index("stated_at")
    rows = read.set_column(at, "stated_at", pc.cast(pc.cast(read.column(at), pa.timestamp("us", tz="UTC")), pa.int64())).to_pylist()
    period_key = itemgetter(*policy.POLICY.guidance_key)
    for row in rows:
        by_period[period_key(row)].append(row)
    reported_by_period: dict[tuple, list[dict]] = defaultdict(list)
    first_of_call: dict[tuple, dict] = {}
    for row in sorted(rows, key=_in_time):
        if row["kind"] == "reported":
            reported_by_period[(row["company"], row["fiscal_year"], row["fiscal_quarter"])].append(row)
        first_of_call.setdefault((row["company"], row["stated_at"]), row)
    calls_of: dict[str, tuple[list[int], list[dict]]] = defaultdict(lambda: ([], []))
    for (company, stated_at), row in sorted(first_of_call.items(), key=lambda item: (item[0][0], item[0][1])):
        calls_of[company][0].append(stated_at)
        calls_of[company][1].append(row)
    invalidations, judgments, closed = [], [], set()
    retired: dict[str, dict] = {}
    year_ends: dict[str, int | None] = {}  # each company's, from the registry once
    ends: dict[tuple, int | None] = {}  # each period's end, once for its guidance figures
    for group in by_period.values():
        group.sort(key=_in_time)
        times = [row["stated_at"] for row in group]
        for row in group:
            if row["kind"] != "guidance" or (only is not None and row["figure_id"] not in only):
                continue
            found = _retirer(row, group[bisect_right(times, row["stated_at"]):])
            if found is None:
                company = row["company"]
                period = (company, row["fiscal_year"], row["fiscal_quarter"])
                if period not in ends:
                    if company not in year_ends:
                        year_ends[company] = year_end_month(company)
                    ends[period] = _period_end(year_ends[company], row["fiscal_year"], row["fiscal_quarter"])
                found = _closer(row, reported_by_period, calls_of[company], ends[period])
                if found is not None:
                    closed.add(row["figure_id"])
            if found is None:
                continue
            winner, reason = found
            retired_at = _moment(winner["stated_at"])
            retired[row["figure_id"]] = {"invalid_at": retired_at, "invalidated_by": winner["event_id"]}
            invalidations.append({"figure_id": row["figure_id"], "invalid_at": retired_at,
                                  "expired_at": retired_at, "invalidated_by": winner["event_id"],
                                  "invalidated_by_figure": winner["figure_id"], "reason": reason})
            judgments.append({"primary_event_id": row["event_id"], "secondary_event_id": winner["event_id"], "invalidates": True,
                              "reason": reason, "judge": policy.POLICY.figure_judge, "cosine": None, "shared_entity_id": None,
                              "predicate_group": None})
    by_event: dict[str, list[str]] = defaultdict(list)
    for row in rows if only is None else ():
        by_event[row["event_id"]].append(row["figure_id"])
    retired_events = {}
    for event_id, figure_ids in by_event.items():
        if all(figure_id in retired for figure_id in figure_ids):
            last = max((retired[f] for f in figure_ids), key=lambda r: (r["invalid_at"], r["invalidated_by"]))
            retired_events[event_id] = (last["invalid_at"], last["invalidated_by"])
    invalidations.sort(key=lambda r: r["figure_id"])
    judgments.sort(key=lambda r: (r["primary_event_id"], r["secondary_event_id"], r["reason"]))
    return FigureRevisions(tables.to_table(invalidations, tables.FIGURE_INVALIDATIONS), judgments, retired_events,
                           frozenset(closed))

