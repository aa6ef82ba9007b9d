"""Figure revisions against their last output (tkg.invalidate.revising): after any change to the
figures (a new quarter, a call rebuilt with other figures, a call removed, a value changed),
revising only the guidance a changed figure may retire differently gives what revising every
figure gives, and a new quarter revises less than all the guidance."""

from __future__ import annotations

import random
from datetime import date, datetime, timezone

import duckdb
import pyarrow as pa
import pytest

from tkg.core import tables
from tkg.invalidate import revising
from tkg.invalidate.revising import revise_since
from tkg.invalidate.revisions import READ_COLUMNS, revise_figures

# MSFT's fiscal year ends in June, NVDA's in January; ZZZZ is not in the registry (no period ends)
COMPANIES = ("MSFT", "NVDA", "ZZZZ")
METRICS = ("revenue", "eps", "gross_margin")
CALL_DAYS = [date(2016 + month // 12, month % 12 + 1, 20) for month in range(0, 48, 3)]


def _call(rng: random.Random, company: str, day: date, version: int) -> list[dict]:
    """One call's figures: guided and reported values of a few metrics and periods, drawn from
    few values so that restatements, revisions and actuals all occur."""
    rows = []
    for n in range(rng.randint(1, 7)):
        guided = rng.random() < 0.6
        value = rng.choice((1.0, 1.1, 1.2, 2.0))
        low_high = (value - 0.05, value + 0.05) if guided and rng.random() < 0.3 else (None, None)
        figure_id = f"{company}-{day.isoformat()}-{version}-{n}"
        rows.append({
            "figure_id": figure_id, "event_id": f"e-{company}-{day.isoformat()}-{version}-{n // 2}",
            "transcript_id": f"{company}_{day:%Y%m%d}", "company": company, "quarter": day, "call_date": day,
            "stated_at": datetime(day.year, day.month, day.day, tzinfo=timezone.utc),
            "metric": rng.choice(METRICS), "segment": rng.choice((None, None, "Cloud")),
            "basis": rng.choice((None, None, "GAAP", "non-GAAP")), "kind": "guidance" if guided else "reported",
            "fiscal_year": day.year + rng.choice((0, 0, 1)), "fiscal_quarter": rng.choice((None, 1, 2, 3, 4)),
            "value": value, "low": low_high[0], "high": low_high[1], "unit": "USD", "amount_text": ""})
    return rows


def _full(rows: list[dict]) -> tuple[list[dict], dict, list[dict]]:
    """What revising every figure gives: invalidations, retired events and judgments."""
    result = revise_figures(tables.to_table(rows, tables.FIGURES))
    judgments = tables.to_table(result.judgments, tables.INVALIDATION_JUDGMENTS).to_pylist()
    return result.figure_invalidations.to_pylist(), result.retired_events, judgments


def _since(rows: list[dict], last: revising.RevisedFigures | None) -> revising.RevisedFigures:
    connection = duckdb.connect()
    figures = connection.from_arrow(tables.to_table(rows, tables.FIGURES).select(list(READ_COLUMNS)))
    previous = None if last is None else (connection.from_arrow(last.figure_invalidations), connection.from_arrow(last.memo))
    return revise_since(connection, figures, previous)


def _guidance(rows: list[dict]) -> int:
    return sum(row["kind"] == "guidance" for row in rows)


def _check(rows: list[dict], last: revising.RevisedFigures | None) -> revising.RevisedFigures:
    now = _since(rows, last)
    invalidations, retired, judgments = _full(rows)
    assert now.figure_invalidations.to_pylist() == invalidations
    assert now.retired_events == retired
    assert now.judgments.to_pylist() == judgments
    assert now.memo.num_rows == len(rows)
    return now


@pytest.mark.parametrize("seed", range(12))
def test_revising_against_the_last_output_gives_what_revising_every_figure_gives(seed):
    rng = random.Random(seed)
    calls = {(company, day): _call(rng, company, day, 0) for company in COMPANIES for day in CALL_DAYS}
    held = CALL_DAYS[-2:]
    state = {key: rows for key, rows in calls.items() if key[1] not in held}

    def rows_of(state: dict) -> list[dict]:
        rows = [row for key in sorted(state) for row in state[key]]
        rng.shuffle(rows)  # the order figures arrive in never matters
        return rows

    cold = _check(rows_of(state), None)
    assert cold.revised_again == _guidance(rows_of(state))  # with no last output, every guidance figure

    # a new quarter for two of the three companies: only some of the guidance is revised again
    state.update({key: rows for key, rows in calls.items() if key[1] == held[0] and key[0] != "ZZZZ"})
    quarter = _check(rows_of(state), cold)
    assert 0 < quarter.revised_again < _guidance(rows_of(state))

    # nothing changed: nothing is revised again
    assert _check(rows_of(state), quarter).revised_again == 0

    # a call of the middle rebuilt with other figures, another removed, the last quarter added
    # for every company, and a figure read differently (another value)
    middle = sorted(state)[len(state) // 2]
    state[middle] = _call(rng, *middle, 1)
    del state[sorted(state)[len(state) // 3]]
    state.update({key: rows for key, rows in calls.items() if key[1] == held[1]})
    changed = sorted(state)[len(state) // 4]
    state[changed] = [{**row, "value": row["value"] + 0.5} if n == 0 else row for n, row in enumerate(state[changed])]
    again = _check(rows_of(state), quarter)

    # back to the first state: the same as it was built cold
    state = {key: rows for key, rows in calls.items() if key[1] not in held}
    back = _check(rows_of(state), again)
    assert back.figure_invalidations.equals(cold.figure_invalidations)
    assert back.memo.equals(cold.memo)


def test_a_company_whose_fiscal_year_end_changed_has_its_closings_revised_again(monkeypatch):
    """The registry's fiscal year end decides when guidance for a closed period ends: when it
    changes, a guidance figure closed by its period's end is closed again at the new end."""
    rows = [
        {"figure_id": "g", "event_id": "e-g", "company": "MSFT", "stated_at": datetime(2016, 7, 20, tzinfo=timezone.utc),
         "metric": "revenue", "segment": None, "basis": None, "kind": "guidance", "fiscal_year": 2017, "fiscal_quarter": 1,
         "value": 1.0, "low": None, "high": None, "unit": "USD"},
        *({"figure_id": f"r{n}", "event_id": f"e-r{n}", "company": "MSFT", "stated_at": datetime(year, month, 20, tzinfo=timezone.utc),
           "metric": "opex", "segment": None, "basis": None, "kind": "reported", "fiscal_year": 2015, "fiscal_quarter": 1,
           "value": 1.0, "low": None, "high": None, "unit": "USD"} for n, (year, month) in enumerate(((2016, 10), (2017, 2)))),
    ]
    full = [{**row, "transcript_id": "", "quarter": row["stated_at"].date(), "call_date": row["stated_at"].date(),
             "amount_text": ""} for row in rows]
    june = _check(full, None)  # Q1 FY2017 ends in September: closed at the October call
    assert june.figure_invalidations.column("invalid_at").to_pylist()[0].month == 10
    monkeypatch.setattr(revising, "year_end_month", lambda company: 9)
    monkeypatch.setattr("tkg.invalidate.revisions.year_end_month", lambda company: 9)
    september = _check(full, june)  # a September year end: Q1 FY2017 ends in December, closed in February
    assert september.revised_again == 1
    assert september.figure_invalidations.column("invalid_at").to_pylist()[0].month == 2
