"""The financial gold questions (../shared/eval/gold_financial_dev.jsonl) against `metrics`
on the whole real corpus, built offline: reported figures, guidance as of a date with its
revision chain, and traps whose wrong number must not be recorded as the figure."""

from __future__ import annotations

import json
import re

import duckdb
import pytest

from tests.conftest import SHARED, needs_corpus

GOLD_FINANCIAL = SHARED / "eval" / "gold_financial_dev.jsonl"
pytestmark = [needs_corpus, pytest.mark.slow,
              pytest.mark.skipif(not GOLD_FINANCIAL.exists(), reason=f"the financial gold set is not at {GOLD_FINANCIAL}")]

# The gold file names metrics and units in words; the view uses its controlled vocabulary.
METRIC_OF = {"revenue": ("revenue", None), "revenue outlook": ("revenue", None), "gross margin": ("gross_margin", None),
             "segment revenue": ("segment_revenue", None), "operating expenses": ("operating_expenses", None),
             "non-GAAP EPS": ("eps", "non-GAAP")}
SCALE_OF = {"USD billion": 1e9, "USD million": 1e6, "percent": 1.0, "USD per share": 1.0}


def _cases(kind: str) -> list[dict]:
    if not GOLD_FINANCIAL.exists():
        return []
    return [case for case in map(json.loads, GOLD_FINANCIAL.read_text().splitlines()) if case["kind"] == kind]


def _period(text: str) -> tuple[int, int | None]:
    """'Q2 FY2016', 'Q4 2015', 'FY2020' -> (fiscal year, fiscal quarter or None)."""
    match = re.fullmatch(r"(?:Q([1-4]) )?(?:FY)?(\d{4})", text)
    assert match, f"unexpected period {text!r} in the gold file"
    return int(match[2]), int(match[1]) if match[1] else None


def _number(case: dict, key: str) -> float:
    return float(case[key]) * SCALE_OF[case["unit"]]


@pytest.fixture(scope="module")
def warehouse(corpus_home):
    connection = duckdb.connect(str(corpus_home / "tkg.duckdb"), read_only=True)
    yield connection
    connection.close()


def _values(connection, case: dict, kind: str, as_of: str | None = None) -> set[tuple]:
    """The distinct (value, low, high) recorded for the case's company, metric and period:
    stated at its call (reported), or standing as of `as_of` (guidance)."""
    metric, basis = METRIC_OF[case["metric"]]
    year, quarter = _period(case["period"])
    sql = ("SELECT DISTINCT value, low, high FROM " + ("metrics_as_of(CAST(? AS TIMESTAMP))" if as_of else "metrics") +
           " WHERE company = ? AND metric = ? AND kind = ? AND fiscal_year = ? AND fiscal_quarter IS NOT DISTINCT FROM ?"
           " AND segment IS NOT DISTINCT FROM ? AND (CAST(? AS VARCHAR) IS NULL OR basis = ?)")
    parameters = ([as_of] if as_of else []) + [case["company"], metric, kind, year, quarter, case.get("segment"), basis, basis]
    if not as_of:
        sql += " AND call_date = CAST(? AS DATE)"
        parameters.append(case["call_date"])
    rows = connection.execute(sql, parameters).fetchall()
    return {tuple(map(_significant, row)) for row in rows}


def _significant(value: float | None) -> float | None:
    """Nine significant digits: 33.2 x 1e9 in binary is 33200000000.000004."""
    return None if value is None else float(f"{value:.9g}")


def _expected(case: dict, key: str = "value") -> tuple:
    low = _number(case, "low") if "low" in case else None
    high = _number(case, "high") if "high" in case else None
    return tuple(map(_significant, (_number(case, key), low, high)))


@pytest.mark.parametrize("case", _cases("reported"), ids=lambda c: c["id"])
def test_gold_reported_figures(warehouse, case):
    assert _values(warehouse, case, "reported") == {_expected(case)}


@pytest.mark.parametrize("case", _cases("guidance"), ids=lambda c: c["id"])
def test_gold_guidance_as_of(warehouse, case):
    assert _values(warehouse, case, "guidance", as_of=case["as_of"]) == {_expected(case)}


@pytest.mark.parametrize("case", _cases("trap"), ids=lambda c: c["id"])
def test_gold_traps(warehouse, case):
    """The right figure is recorded for the period, and the trap's number is not."""
    kind = "guidance" if "outlook" in case["metric"] or "guide" in case["question"] else "reported"
    values = _values(warehouse, case, kind, as_of=case["call_date"] + " 23:59:59" if kind == "guidance" else None)
    assert {value for value, _, _ in values} == {_significant(_number(case, "right_value"))}
    wrong = _number(case, "wrong_value")
    anywhere = warehouse.execute("SELECT count(*) FROM metrics WHERE company = ? AND call_date = CAST(? AS DATE) "
                                 "AND least(abs(value - ?), abs(coalesce(low, 0) - ?), abs(coalesce(high, 0) - ?)) < 1e-6 * ?",
                                 [case["company"], case["call_date"], wrong, wrong, wrong, wrong]).fetchone()[0]
    assert anywhere == 0


def test_gold_guidance_chain_is_revised_at_each_call(warehouse):
    """Microsoft's FY2017 operating-expense guidance: each step retired at the call that revised it."""
    chain = sorted((case for case in _cases("guidance") if case.get("chain")), key=lambda c: c["call_date"])
    assert len(chain) >= 3
    for earlier, later in zip(chain, chain[1:]):
        if _expected(earlier) == _expected(later):
            continue
        metric, _ = METRIC_OF[earlier["metric"]]
        year, quarter = _period(earlier["period"])
        rows = warehouse.execute(
            "SELECT DISTINCT m.invalid_at::DATE, e.created_at::DATE FROM metrics m JOIN events e ON e.event_id = m.invalidated_by "
            "WHERE m.company = ? AND m.metric = ? AND m.kind = 'guidance' AND m.fiscal_year = ? "
            "AND m.fiscal_quarter IS NOT DISTINCT FROM ? AND abs(m.value - ?) < 1e-6 * ?",
            [earlier["company"], metric, year, quarter, _number(earlier, "value"), _number(earlier, "value")]).fetchall()
        assert {(str(invalid), str(stated)) for invalid, stated in rows} == {(later["call_date"], later["call_date"])}, rows


def test_reported_keys_rarely_carry_two_values_and_closed_guidance_is_retired(warehouse):
    """Issue 25, on the whole corpus: a (company, metric, segment, basis, period, call) reported key
    with two or more values is a misfiled figure (before: 226 of 1,896 keys); guidance whose
    period has reported results must not stand (before: 136 of 500 rows open)."""
    conflicts, keys = warehouse.execute(
        "WITH k AS (SELECT count(DISTINCT (value, low, high)) AS n FROM metrics WHERE kind = 'reported' "
        "GROUP BY company, metric, segment, basis, fiscal_year, fiscal_quarter, call_date) "
        "SELECT count(*) FILTER (WHERE n >= 2), count(*) FROM k").fetchone()
    assert keys > 1500 and conflicts / keys <= 0.05, (conflicts, keys)
    open_rows, closed_periods = warehouse.execute(
        "SELECT count(*) FILTER (WHERE g.invalid_at IS NULL), count(*) FROM metrics AS g WHERE g.kind = 'guidance' AND EXISTS ("
        "SELECT 1 FROM metrics AS r WHERE r.kind = 'reported' AND r.company = g.company AND r.fiscal_year = g.fiscal_year "
        "AND r.fiscal_quarter IS NOT DISTINCT FROM g.fiscal_quarter)").fetchone()
    assert closed_periods > 300 and open_rows / closed_periods <= 0.05, (open_rows, closed_periods)
    # a restatement of the same guidance is one row: no two open guidance rows share key and value
    duplicated = warehouse.execute(
        "SELECT count(*) FROM (SELECT 1 FROM metrics WHERE kind = 'guidance' AND invalid_at IS NULL "
        "GROUP BY company, metric, segment, basis, fiscal_year, fiscal_quarter, unit, value, low, high HAVING count(*) > 1)"
    ).fetchone()[0]
    assert duplicated == 0
