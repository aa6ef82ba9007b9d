"""Financial figures: the offline rules (amounts, periods, kinds, traps), revisions, and the
`metrics` view on the bundled sample."""

from __future__ import annotations

import random
from datetime import date, datetime, timezone

import duckdb
import pytest

from tkg.core import tables
from tkg.extract.base import DocumentContext
from tkg.extract.figures import figure_parser
from tkg.invalidate.revisions import revise_figures


def _context(ticker: str, call: str, fiscal_quarter: str, fiscal_year_end_month: int) -> DocumentContext:
    from tkg.core.companies import get_company

    company = get_company(ticker)
    day = date.fromisoformat(call)
    return DocumentContext(ticker, company.name, company.aliases[0], "Earnings Call Transcript",
                           datetime(day.year, day.month, day.day, 21, tzinfo=timezone.utc), fiscal_quarter, None, None,
                           fiscal_year_end_month)


MSFT_Q1_FY17 = _context("MSFT", "2016-10-20", "Q1 2017", 6)  # fiscal year ends in June
NVDA_Q4_FY20 = _context("NVDA", "2020-02-13", "Q4 2020", 1)  # fiscal year ends in January
INTC_Q2_16 = _context("INTC", "2016-07-20", "Q2 2016", 12)
AAPL_Q4_FY18 = _context("AAPL", "2018-11-01", "Q4 2018", 9)


def _figures(context: DocumentContext, sentence: str, prediction: bool = False) -> list[tuple]:
    return [(f.metric.value, f.segment, f.basis, f.kind.value, f.fiscal_year, f.fiscal_quarter, f.value, f.low, f.high, f.unit)
            for f in figure_parser(context).parse(sentence, prediction)]


@pytest.mark.parametrize("context, sentence, expected", [
    (INTC_Q2_16, "Revenue for the second quarter was $13.5 billion, up 3% year over year.",
     [("revenue", None, None, "reported", 2016, 2, 13.5e9, None, None, "USD"),
      ("revenue_growth", None, None, "reported", 2016, 2, 3.0, None, None, "percent")]),
    # a range: midpoint with its ends; the scale of '$89 to $93 billion' applies to both
    (AAPL_Q4_FY18, "We expect revenue to be between $89 billion and $93 billion.",
     [("revenue", None, None, "guidance", 2019, 1, 91e9, 89e9, 93e9, "USD")]),
    (AAPL_Q4_FY18, "We expect revenue of $89 to $93 billion.", [("revenue", None, None, "guidance", 2019, 1, 91e9, 89e9, 93e9, "USD")]),
    # plus or minus a percentage of the amount
    (MSFT_Q1_FY17, "We expect revenue of $10.5 billion plus or minus 5% next quarter.",
     [("revenue", None, None, "guidance", 2017, 2, 10.5e9, 9.975e9, 11.025e9, "USD")]),
    # a gross margin in percent with basis points around it
    (MSFT_Q1_FY17, "We expect non-GAAP gross margin of 64% plus or minus 50 basis points.",
     [("gross_margin", None, "non-GAAP", "guidance", 2017, 2, 64.0, 63.5, 64.5, "percent")]),
    # two figures in two clauses, each with its own period on the June fiscal calendar
    (MSFT_Q1_FY17, "We expect operating expenses between $7.85 billion and $7.95 billion in Q2, and we remain on path for "
                   "full-year operating expense of $31.1 billion to $31.4 billion.",
     [("operating_expenses", None, None, "guidance", 2017, 2, 7.9e9, 7.85e9, 7.95e9, "USD"),
      ("operating_expenses", None, None, "guidance", 2017, None, 31.25e9, 31.1e9, 31.4e9, "USD")]),
    # a segment in the registry, on NVIDIA's January fiscal calendar ('fiscal year '20')
    (NVDA_Q4_FY20, "Full year fiscal year '20 data center revenue was a record $2.98 billion, up 2% from the prior year.",
     [("segment_revenue", "Data Center", None, "reported", 2020, None, 2.98e9, None, None, "USD"),
      ("revenue_growth", "Data Center", None, "reported", 2020, None, 2.0, None, None, "percent")]),
    (_context("CSCO", "2019-11-13", "Q1 2020", 7), "Non-GAAP earnings per share is expected to range from $0.75 to $0.77.",
     [("eps", None, "non-GAAP", "guidance", 2020, 2, 0.76, 0.75, 0.77, "USD/share")]),
    (_context("ASML", "2016-10-19", "Q3 2016", 12), "For Q3, our net sales came in at EUR1.81 billion.",
     [("revenue", None, None, "reported", 2016, 3, 1.81e9, None, None, "EUR")]),
    (_context("AMD", "2020-04-28", "Q1 2020", 12), "Free cash flow was negative $120 million in the first quarter.",
     [("free_cash_flow", None, None, "reported", 2020, 1, -1.2e8, None, None, "USD")]),
    # '15.2% of revenue' after operating income is the operating margin
    (INTC_Q2_16, "Operating expenses were $5.2 billion, and operating income was $1.3 billion, or 9.6% of revenue.",
     [("operating_expenses", None, None, "reported", 2016, 2, 5.2e9, None, None, "USD"),
      ("operating_income", None, None, "reported", 2016, 2, 1.3e9, None, None, "USD"),
      ("operating_margin", None, None, "reported", 2016, 2, 9.6, None, None, "percent")]),
    # after a fourth-quarter call, 'the full year' in an outlook is the new fiscal year
    (AAPL_Q4_FY18, "For the full year, we expect capital expenditures of about $14 billion.",
     [("capex", None, None, "guidance", 2019, None, 14e9, None, None, "USD")]),
])
def test_figures_amounts_periods_and_kinds(context, sentence, expected):
    assert _figures(context, sentence) == expected


@pytest.mark.parametrize("context, sentence, kept", [
    # run rate
    (MSFT_Q1_FY17, "Our commercial cloud annualized revenue run rate surpassed $14 billion.", []),
    (MSFT_Q1_FY17, "Revenue reached a $14 billion commercial cloud run rate.", []),
    # an FX headwind
    (AAPL_Q4_FY18, "We expect almost $2 billion of foreign exchange headwinds on revenue next quarter.", []),
    # contracted / backlog revenue
    (_context("MSFT", "2019-07-18", "Q4 2019", 6), "Our contracted-not-recognized revenue was $91 billion, up 25% year-over-year.", []),
    (MSFT_Q1_FY17, "Revenue in backlog was $3 billion at the end of the quarter.", []),
    # prior-year and prior-outlook comparisons: only the level counts
    (INTC_Q2_16, "Revenue was $13.5 billion, compared to $13.2 billion a year ago.", [13.5e9]),
    (INTC_Q2_16, "Revenue was $13.5 billion, ahead of our outlook of $13.3 billion.", [13.5e9]),
    (INTC_Q2_16, "For the full year, we now expect revenue of $58 billion, up from our prior outlook of $57 billion.", [58e9]),
    # a long-term target
    (INTC_Q2_16, "We expect revenue of $70 billion by 2021.", []),
    (INTC_Q2_16, "Our long-term model calls for gross margin of 60%.", []),
    # a change is not a level: 'by $0.5 billion to $11.5 billion'
    (INTC_Q2_16, "We reduced capex guidance by $0.5 billion to $9.5 billion for the year.", [9.5e9]),
    (INTC_Q2_16, "Operating income grew $900 million year-over-year.", []),
    # a part of the total the registry does not name, and a percentage read as revenue
    (INTC_Q2_16, "Data-centric revenue was $8 billion.", []),
    (MSFT_Q1_FY17, "Revenue from emerging markets grew 12%.", []),
    (_context("MSFT", "2018-07-19", "Q4 2018", 6), "FY2019 revenue guidance is 30%.", []),
    # amounts of something else
    (INTC_Q2_16, "We paid dividends of $1.2 billion and our revenue per share rose.", []),
    (INTC_Q2_16, "In the last 12 months, revenue grew to $58 billion.", []),
])
def test_traps_are_not_figures_of_the_metric(context, sentence, kept):
    """Issue 13: run rates, FX, backlog, comparisons, long-term targets, changes and parts of
    the business are left out, or only the real level is kept."""
    assert [figure[6] for figure in _figures(context, sentence) if figure[0] != "revenue_growth"] == kept


def test_a_segment_named_before_the_clause_keeps_its_figure_out_of_the_total():
    found = _figures(_context("MSFT", "2019-01-30", "Q2 2019", 6),
                     "In Productivity and Business Processes, we expect revenue between $9.9 billion and $10.1 billion.")
    assert found == [("segment_revenue", "Productivity and Business Processes", None, "guidance", 2019, 3, 10e9, 9.9e9, 10.1e9, "USD")]


# --- issue 25: each kind of misfiled figure, from real sentences of the corpus -------------------

INTC_Q3_19 = _context("INTC", "2019-10-24", "Q3 2019", 12)
MU_Q2_FY16 = _context("MU", "2016-03-30", "Q2 2016", 8)  # fiscal year ends in August
AAPL_Q2_FY16 = _context("AAPL", "2016-04-26", "Q2 2016", 9)
CSCO_Q4_FY18 = _context("CSCO", "2018-08-15", "Q4 2018", 7)
AMD_Q4_19 = _context("AMD", "2020-01-28", "Q4 2019", 12)


def _parsed(context: DocumentContext, sentence: str, scope: str = "") -> list[tuple]:
    return [(f.metric.value, f.segment, f.basis, f.kind.value, f.fiscal_year, f.fiscal_quarter, f.value, f.low, f.high)
            for f in figure_parser(context).parse(sentence, False, scope)]


@pytest.mark.parametrize("context, scope, sentence, expected", [
    # a difference from the guide is not the figure
    (INTC_Q3_19, "", "Q3 EPS was $1.42, $0.18 above our guide.", [("eps", None, None, "reported", 2019, 3, 1.42, None, None)]),
    # a signed range keeps its sign, and a stated basis holds for every clause of the sentence
    (MU_Q2_FY16, "", "On a non-GAAP basis, we expect the following: consolidated revenue in the range of $2.8 billion to $3.1 "
                     "billion, gross margin in the range of 16.5% to 19%, operating expenses between $560 million and $610 "
                     "million, operating income ranging between a loss of $70 million and income of $10 million.",
     [("revenue", None, "non-GAAP", "guidance", 2016, 3, 2.95e9, 2.8e9, 3.1e9),
      ("gross_margin", None, "non-GAAP", "guidance", 2016, 3, 17.75, 16.5, 19.0),
      ("operating_expenses", None, "non-GAAP", "guidance", 2016, 3, 5.85e8, 5.6e8, 6.1e8),
      ("operating_income", None, "non-GAAP", "guidance", 2016, 3, -3e7, -7e7, 1e7)]),
    # a result measured against the outlook is a result, and the year-ago amount is not the figure
    (AAPL_Q2_FY16, "", "Revenue for the quarter landed within our guidance range at $50.6 billion, compared to $58 billion in "
                       "the year-ago quarter, a decline of 13%.", [("revenue", None, None, "reported", 2016, 2, 50.6e9, None, None)]),
    # a full-year paragraph: its heading sets the period of the figures under it
    (CSCO_Q4_FY18, "I'll now cover the full fiscal year. We delivered solid revenue, margins, net income, EPS and operating "
                   "cash flows.", "Revenue was $49.3 billion, up 3%.",
     [("revenue", None, None, "reported", 2018, None, 49.3e9, None, None),
      ("revenue_growth", None, None, "reported", 2018, None, 3.0, None, None)]),
    # a segment's paragraph: 'Revenue' under its heading is the segment's, not the company's
    (AMD_Q4_19, "Turning to our Enterprise, Embedded and Semi-Custom segment.",
     "Revenue of $465 million increased 7% year-over-year, as EPYC processor revenue growth offset declines in semi-custom revenue.",
     [("segment_revenue", "Enterprise, Embedded and Semi-Custom", None, "reported", 2019, 4, 4.65e8, None, None),
      ("revenue_growth", "Enterprise, Embedded and Semi-Custom", None, "reported", 2019, 4, 7.0, None, None)]),
    # a new heading for the quarter ends the segment's paragraph
    (AMD_Q4_19, "Turning to our Enterprise, Embedded and Semi-Custom segment. Revenue of $465 million increased 7%. Now turning "
                "to the fourth quarter.", "Revenue was $2.13 billion.", [("revenue", None, None, "reported", 2019, 4, 2.13e9, None, None)]),
    # a segment's margin under its heading is not the company's: no row
    (MSFT_Q1_FY17, "In commercial cloud, annualized revenue run rate grew.", "Gross margin was 63%.", []),
    # a remark about a fiscal year still under way is no reported result
    (INTC_Q2_16, "", "Moving to the full year, gross margin was 61%.", []),
    # a year-ago amount joined by 'or' to the compared amount is a comparison too
    (_context("AMD", "2017-10-24", "Q3 2017", 12), "", "Net income was $110 million or diluted earnings of $0.10 per share as "
     "compared to $27 million or $0.03 per share a year ago.",
     [("net_income", None, None, "reported", 2017, 3, 1.1e8, None, None), ("eps", None, None, "reported", 2017, 3, 0.1, None, None)]),
    # 'an improvement of $155 million' is the change; the negative level keeps its sign
    (_context("AMD", "2020-04-28", "Q1 2020", 12), "", "Free cash flow was negative $120 million in the first quarter, an "
     "improvement of $155 million from the prior year.", [("free_cash_flow", None, None, "reported", 2020, 1, -1.2e8, None, None)]),
    # a percentage of something else ('a 12% cost per bit reduction') is not the margin
    (_context("MU", "2017-06-29", "Q3 2017", 8), "", "Non-GAAP gross margin was 41%, up 10 percentage points, driven by a 12% cost "
     "per bit reduction and better product mix.", [("gross_margin", None, "non-GAAP", "reported", 2017, 3, 41.0, None, None)]),
    # a statement naming its own segment is that segment's, whatever paragraph it is in
    (_context("INTC", "2016-10-18", "Q3 2016", 12), "In the data center group, revenue grew 10% year over year to a record $4.5 billion.",
     "Another key growth opportunity for Intel, our Internet of Things business, grew 19% over last year, setting an all-time "
     "revenue record of nearly $700 million.",
     [("segment_revenue", "Internet of Things Group", None, "reported", 2016, 3, 7e8, None, None)]),
    # 'Total revenue' under a segment's heading is the company's
    (_context("GOOGL", "2016-10-27", "Q3 2016", 12), "For the third quarter, Other Bets revenue was $197 million, primarily "
     "generated by Nest, Fiber and Verily.", "Total revenue was $22.5 billion, up 20% year over year, and up 4% sequentially.",
     [("revenue", None, None, "reported", 2016, 3, 22.5e9, None, None), ("revenue_growth", None, None, "reported", 2016, 3, 20.0, None, None)]),
    # a total without a segment is neither the total nor the segment
    (MSFT_Q1_FY17, "", "Excluding LinkedIn, our second-quarter revenue was $25.8 billion, up 1%, and 3% in constant currency.", []),
    # a segment's operating loss in its clause is the segment's, which has no row
    (_context("MU", "2016-06-30", "Q3 2016", 8), "", "Micron storage business unit posted fiscal Q3 revenue of $719 million, down "
     "20% from the previous quarter with a non-GAAP operating loss of $62 million or 9% of revenue.",
     [("segment_revenue", "Storage", "non-GAAP", "reported", 2016, 3, 7.19e8, None, None)]),
    # every amount after 'compared to' is a comparison
    (_context("MU", "2019-09-26", "Q4 2019", 8), "", "Looking at cash generation, we generated adjusted free cash flow of "
     "approximately $260 million in fiscal Q4 compared to $500 million in fiscal Q3 and $3.1 billion in the year ago quarter.",
     [("free_cash_flow", None, "non-GAAP", "reported", 2019, 4, 2.6e8, None, None)]),
    # an earlier outlook recalled in Q&A is neither a result nor guidance
    (_context("MU", "2018-09-20", "Q4 2018", 8), "", "So, first of all, the gross margin guidance was 57% to 60%.", []),
    # growth in constant currency beside the reported figure leaves the figure alone
    (_context("MSFT", "2019-07-18", "Q4 2019", 6), "", "Microsoft's fourth quarter revenue was $33.7 billion, up 12% and 14% in "
     "constant currency.", [("revenue", None, None, "reported", 2019, 4, 33.7e9, None, None),
                            ("revenue_growth", None, None, "reported", 2019, 4, 12.0, None, None)]),
    # a sentence restated at fixed exchange rates gives no row
    (_context("GOOGL", "2016-07-28", "Q2 2016", 12), "", "In fixed FX terms, revenues were up 26% year over year.", []),
    (_context("GOOGL", "2016-07-28", "Q2 2016", 12), "", "Holding currency constant to prior periods, our total revenue grew 25% year "
     "over year and increased 5% sequentially.", []),
    # each amount takes the segment named nearest before its metric
    (_context("AAPL", "2020-01-28", "Q1 2020", 9), "", "Mac revenue was $7.2b and iPad revenue was $6b.",
     [("segment_revenue", "Mac", None, "reported", 2020, 1, 7.2e9, None, None),
      ("segment_revenue", "iPad", None, "reported", 2020, 1, 6e9, None, None)]),
    # each amount takes the period named since the amount before it
    (_context("MU", "2017-09-26", "Q4 2017", 8), "", "Free cash flow for the quarter was $1.7 billion and, for the full year, was "
     "$3.3 billion compared to negative $2.7 billion in fiscal 2016.",
     [("free_cash_flow", None, None, "reported", 2017, 4, 1.7e9, None, None),
      ("free_cash_flow", None, None, "reported", 2017, None, 3.3e9, None, None)]),
    # what it would have been, what it includes, and a benefit to a figure are not the figure
    (_context("ASML", "2019-01-23", "Q4 2018", 12), "", "ASML's gross margin for 2018 was 46%, which would have been 47.2% without "
     "the Nikon settlement charges.", [("gross_margin", None, None, "reported", 2018, None, 46.0, None, None)]),
    (_context("CSCO", "2016-02-10", "Q2 2016", 7), "", "The total impact of these and other immaterial items was a benefit to GAAP "
     "EPS of $0.13.", []),
    # a segment named well before its metric, and a total after a segment's figure
    (_context("MSFT", "2017-04-27", "Q3 2017", 6), "", "The Intelligent Cloud segment delivered approximately $6.8 billion in "
     "revenue, growing 11% and 12% in constant currency.", [("revenue_growth", "Intelligent Cloud", None, "reported", 2017, 3, 11.0, None, None)]),
    (_context("MSFT", "2017-04-27", "Q3 2017", 6), "", "Intelligent Cloud revenue was $6.8 billion, and total revenue was $23.6 billion.",
     [("segment_revenue", "Intelligent Cloud", None, "reported", 2017, 3, 6.8e9, None, None),
      ("revenue", None, None, "reported", 2017, 3, 23.6e9, None, None)]),
    # the same sentence without a paragraph is the quarter's
    (CSCO_Q4_FY18, "", "Revenue was $49.3 billion, up 3%.",
     [("revenue", None, None, "reported", 2018, 4, 49.3e9, None, None), ("revenue_growth", None, None, "reported", 2018, 4, 3.0, None, None)]),
])
def test_figures_attach_to_the_right_period_segment_and_basis(context, scope, sentence, expected):
    assert _parsed(context, sentence, scope) == expected


# --- revisions -----------------------------------------------------------------------------------


def _row(figure_id: str, call: str, kind: str, value: float, low: float | None = None, high: float | None = None,
         metric: str = "operating_expenses", quarter: int | None = None, basis: str | None = None) -> dict:
    day = date.fromisoformat(call)
    return {"figure_id": figure_id, "event_id": f"e-{figure_id}", "transcript_id": f"MSFT_{call}", "company": "MSFT",
            "quarter": day, "call_date": day, "stated_at": datetime(day.year, day.month, day.day, tzinfo=timezone.utc),
            "metric": metric, "segment": None, "basis": basis, "kind": kind, "fiscal_year": 2017, "fiscal_quarter": quarter,
            "value": value, "low": low, "high": high, "unit": "USD", "amount_text": ""}


# The Microsoft FY2017 operating-expense chain of the gold set, then the actual.
CHAIN = [
    _row("jul", "2016-07-19", "guidance", 31.25e9, 31.1e9, 31.4e9),
    _row("oct", "2016-10-20", "guidance", 31.25e9, 31.1e9, 31.4e9),  # restated: retires nothing
    _row("jan", "2017-01-26", "guidance", 33.2e9, 33.1e9, 33.3e9),
    _row("apr", "2017-04-27", "guidance", 32.95e9, 32.9e9, 33.0e9),
    _row("q4", "2017-07-20", "reported", 32.8e9),
    _row("q2", "2016-10-20", "guidance", 7.9e9, 7.85e9, 7.95e9, quarter=2),  # another period: untouched by the chain
]


def _retired(rows: list[dict]) -> dict[str, tuple[str, str]]:
    result = revise_figures(tables.to_table(rows, tables.FIGURES))
    return {r["figure_id"]: (r["invalid_at"].date().isoformat(), r["invalidated_by_figure"])
            for r in result.figure_invalidations.to_pylist()}


def test_guidance_is_retired_by_the_next_different_value_and_by_the_actual():
    # Q2 FY2017 (October-December 2016) closes at the first call after it ended
    assert _retired(CHAIN) == {"jul": ("2017-01-26", "jan"), "oct": ("2017-01-26", "jan"), "jan": ("2017-04-27", "apr"),
                               "apr": ("2017-07-20", "q4"), "q2": ("2017-01-26", "jan")}


def test_revisions_do_not_depend_on_the_order_figures_arrive_in():
    expected = _retired(CHAIN)
    for seed in range(5):
        shuffled = CHAIN[:]
        random.Random(seed).shuffle(shuffled)
        assert _retired(shuffled) == expected


def test_restating_the_same_value_and_a_different_stated_basis_retire_nothing():
    rows = [_row("a", "2016-07-19", "guidance", 5e9, basis="GAAP"), _row("b", "2016-10-20", "guidance", 5e9, basis="GAAP"),
            _row("c", "2017-01-26", "guidance", 6e9, basis="non-GAAP")]
    assert _retired(rows) == {}


def test_one_basis_label_does_not_split_a_chain():
    """Issue 25: a restatement tagged non-GAAP once in a chain of unstated ones is the same
    guidance: it revises and is revised as if unlabelled, so one value stands at a time."""
    rows = [_row("a", "2016-07-19", "guidance", 4.35, metric="eps"), _row("b", "2016-10-20", "guidance", 4.40, metric="eps",
                                                                        basis="non-GAAP"),
            _row("c", "2017-01-26", "guidance", 4.55, metric="eps")]
    assert _retired(rows) == {"a": ("2016-10-20", "b"), "b": ("2017-01-26", "c")}
    # a call that guides both bases at once restates the unlabelled value by one of them: nothing is revised
    both = [_row("a", "2016-07-19", "guidance", 4.35, metric="eps"),
            _row("g", "2016-10-20", "guidance", 3.90, metric="eps", basis="GAAP"),
            _row("n", "2016-10-20", "guidance", 4.35, metric="eps", basis="non-GAAP")]
    assert _retired(both) == {}


def test_guidance_closes_when_its_period_is_reported_or_over():
    """Issue 25: guidance for a period is not left standing once the period's results are out,
    even when the actual of that metric was not recorded (another metric was) or no result was."""
    rows = [_row("gm", "2016-10-20", "guidance", 64.0, metric="gross_margin", quarter=2),
            _row("rev", "2017-01-26", "reported", 24.1e9, metric="revenue", quarter=2),
            _row("q3", "2017-01-26", "guidance", 65.0, metric="gross_margin", quarter=3),
            _row("later", "2017-07-20", "reported", 23.3e9, metric="revenue", quarter=4)]
    retired = _retired(rows)
    assert retired["gm"] == ("2017-01-26", "rev")  # Q2 results published
    assert retired["q3"] == ("2017-07-20", "later")  # Q3 (January-March 2017) over; the next call came after it
    assert set(retired) == {"gm", "q3"}


def test_an_event_is_retired_only_when_every_figure_it_states_is():
    rows = [_row("fy", "2016-10-20", "guidance", 31.25e9, 31.1e9, 31.4e9), _row("q2", "2016-10-20", "guidance", 7.9e9, quarter=2),
            _row("jan", "2017-01-26", "guidance", 33.2e9), _row("q2actual", "2017-01-26", "reported", 8.0e9, quarter=2),
            _row("h1", "2016-10-20", "guidance", 15e9, quarter=3)]
    rows[1]["event_id"] = rows[0]["event_id"]  # one sentence, two figures
    result = revise_figures(tables.to_table(rows, tables.FIGURES))
    assert set(result.retired_events) == {"e-fy"}
    assert result.retired_events["e-fy"][0].date() == date(2017, 1, 26)
    rows[4]["event_id"] = rows[0]["event_id"]  # a third figure, for Q3, still stands
    assert revise_figures(tables.to_table(rows, tables.FIGURES)).retired_events == {}


# --- the metrics view on the sample ----------------------------------------------------------------


@pytest.fixture(scope="module")
def sample(sample_home):
    connection = duckdb.connect(str(sample_home / "tkg.duckdb"), read_only=True)
    yield connection
    connection.close()


def test_metrics_contract_columns(sample):
    columns = [row[0] for row in sample.execute("DESCRIBE metrics").fetchall()]
    assert columns[:17] == ["company", "metric", "segment", "basis", "kind", "fiscal_year", "fiscal_quarter", "value", "low", "high",
                            "unit", "statement", "event_id", "call_date", "valid_at", "invalid_at", "invalidated_by"]


def test_a_raised_outlook_leaves_no_old_figure_valid_in_any_form(sample):
    """The sample's FY2024 guidance: $1.20 billion (Q4 2023 call, reaffirmed Q1 2024), raised to
    $1.35 billion on 2024-08-06. Afterwards neither metrics nor facts hold $1.20 billion."""
    def guided(as_of: str) -> set[float]:
        return {v for (v,) in sample.execute(
            "SELECT value FROM metrics_as_of(CAST(? AS TIMESTAMP)) WHERE company = 'HLIO' AND metric = 'revenue' "
            "AND kind = 'guidance' AND fiscal_year = 2024 AND fiscal_quarter IS NULL", [as_of]).fetchall()}

    assert guided("2024-06-01") == {1.2e9}
    assert guided("2024-09-01") == {1.35e9}
    stale = sample.execute("SELECT statement FROM facts_as_of(TIMESTAMP '2024-09-01') WHERE company = 'HLIO' "
                           "AND value LIKE '%1.20 billion%'").fetchall()
    assert stale == []
    retired_by = sample.execute("SELECT DISTINCT e.statement FROM metrics m JOIN events e ON e.event_id = m.invalidated_by "
                                "WHERE m.company = 'HLIO' AND m.value = 1.2e9").fetchall()
    assert len(retired_by) == 1 and "1.35 billion" in retired_by[0][0]


def test_quarterly_guidance_is_retired_when_the_actual_is_reported(sample):
    rows = sample.execute("SELECT value, call_date, invalid_at::DATE, revision FROM metrics WHERE company = 'HLIO' "
                          "AND metric = 'revenue' AND kind = 'guidance' AND fiscal_quarter = 1 AND fiscal_year = 2024").fetchall()
    assert [(value, invalid_at) for value, _, invalid_at, _ in rows] == [(2.8e8, date(2024, 5, 7))]
    assert "reported" in rows[0][3]
    audit = sample.execute("SELECT count(*) FROM invalidation_judgments WHERE judge LIKE 'rules:figure-revisions%'").fetchone()[0]
    assert audit == sample.execute("SELECT count(*) FROM raw.figure_invalidations").fetchone()[0] > 0


MSFT_Q1_FY19 = _context("MSFT", "2018-10-24", "Q1 2019", 6)
GOOGL_Q3_16 = _context("GOOGL", "2016-10-27", "Q3 2016", 12)
GOOGL_Q3_16_GAAP = ("GAAP operating expenses were $8 billion in the quarter, up 15% year over year. Non-GAAP operating expenses "
                    "were $6.5 billion, up 13% year over year. On a GAAP basis, operating income was $5.8 billion, up 22% versus last year. ")


@pytest.mark.parametrize("context, scope, sentence, expected", [
    # a product line inside a registry segment is not the segment: no row ...
    (_context("MSFT", "2017-07-20", "Q4 2017", 6), "", "Office 365 commercial revenue grew 43% and 44% in constant currency, with "
     "continued install base growth across all workloads, ARPU expansion and emerging E5 momentum.", []),
    (MSFT_Q1_FY19, "", "Xbox software and services revenue grew 36% with continued strength from a third-party title.", []),
    (_context("MSFT", "2018-04-26", "Q3 2018", 6), "", "OEM Pro revenue grew 11%, in line with a strong commercial PC market.", []),
    (_context("AAPL", "2018-07-31", "Q3 2018", 9), "", "Cloud Services revenue up over 50% YoverY.", []),
    # ... while the segment's own figure stays, beside a product named after it ('Dynamics 365')
    (_context("MSFT", "2017-07-20", "Q4 2017", 6), "", "Office commercial revenue increased 5% and 6% in constant currency.",
     [("revenue_growth", "Office Commercial", None, "reported", 2017, 4, 5.0, None, None)]),
    (_context("MSFT", "2019-10-23", "Q1 2020", 6), "", "Dynamics revenue grew 14% and 16% in constant currency driven by Dynamics 365 "
     "revenue growth of 41% and 44% in constant currency.", [("revenue_growth", "Dynamics", None, "reported", 2020, 1, 14.0, None, None)]),
    (_context("AMD", "2019-01-29", "Q4 2018", 12), "", "Computing and Graphics segment revenue was $986 million, down 28% year-over-year.",
     [("segment_revenue", "Computing and Graphics", None, "reported", 2018, 4, 9.86e8, None, None)]),
    # a line named by two segments' words ('Network' + 'advertising') is neither's total
    (_context("GOOGL", "2020-04-28", "Q1 2020", 12), "", "Network advertising revenues were $5.2 billion, up 4% year-on-year, with "
     "healthy year-on-year growth for the first 2 months of the quarter.", []),
    # a segment named well before its figure in a long sentence is still the figure's
    (MSFT_Q1_FY17, "", "This quarter, our Productivity and Business Processes segment delivered results above our expectations, "
     "with approximately $6.7 billion in revenue, an increase of 6% and 8% in constant currency.",
     [("revenue_growth", "Productivity and Business Processes", None, "reported", 2017, 1, 6.0, None, None)]),
    (_context("INTC", "2018-07-26", "Q2 2018", 12), "", "Finally, the Client Computing Group continued to execute on all fronts with "
     "another outstanding quarter, generating $8.7 billion of revenue, up 6%.",
     [("revenue_growth", "Client Computing Group", None, "reported", 2018, 2, 6.0, None, None)]),
    # a margin is the ratio of the income stated before it: a subsidiary's (Google's under Alphabet) gives no row ...
    (_context("GOOGL", "2020-07-30", "Q2 2020", 12), "", "Google operating income was $7.6 billion, down 26% versus last year, and the "
     "operating margin was 20%.", []),
    # ... and the income's basis is the margin's, over the paragraph's stated basis
    (GOOGL_Q3_16, GOOGL_Q3_16_GAAP, "The operating margin was 26%.", [("operating_margin", None, "GAAP", "reported", 2016, 3, 26.0, None, None)]),
    (GOOGL_Q3_16, GOOGL_Q3_16_GAAP + "The operating margin was 26%. Non-GAAP operating income was $7.6 billion, up 24% versus last year. ",
     "The operating margin was 34%.", [("operating_margin", None, "non-GAAP", "reported", 2016, 3, 34.0, None, None)]),
    # a loss named by its metric is negative, as 'a net loss of $48 million' is
    (_context("MU", "2016-03-30", "Q2 2016", 8), "", "The non-GAAP net loss for the second quarter was $48 million, or $0.05 per share, "
     "at the favorable end of our guided range.", [("net_income", None, "non-GAAP", "reported", 2016, 2, -4.8e7, None, None),
                                                   ("eps", None, "non-GAAP", "reported", 2016, 2, -0.05, None, None)]),
    # growth over a span of years is no fiscal period's
    (_context("INTC", "2016-04-19", "Q1 2016", 12), "", "From 2013 to 2015 the PC TAM declined 10%, yet Intel's revenue "
     "grew 5%, and our operating profit grew 14% over this horizon.", []),
    # a threshold crossed is not the figure
    (_context("NVDA", "2016-11-10", "Q3 2017", 1), "", "Gaming revenue crossed the $1 billion mark and increased 63% year on year to a "
     "record $1.24 billion fueled by our Pascal-based GPUs.", [("segment_revenue", "Gaming", None, "reported", 2017, 3, 1.24e9, None, None)]),
    # at a fourth-quarter call, a sentence looking back on the year heads the full-year figures under it
    (_context("INTC", "2018-01-25", "Q4 2017", 12), "This transaction both lowered our leverage and our interest expense. Adding it all "
     "up, 2017 was another record year for Intel. ", "Revenue of $62.8 billion was up 9% year-over-year, driven by 16% growth in our "
     "data-centric businesses and 3% growth in PC-centric business.",
     [("revenue", None, None, "reported", 2017, None, 62.8e9, None, None), ("revenue_growth", None, None, "reported", 2017, None, 9.0, None, None)]),
    # ... until a sentence with figures opens on its own period: the figures after it are that period's
    (_context("AMD", "2020-01-28", "Q4 2019", 12), "Thank you, Lisa, and good afternoon, everyone. 2019 was an outstanding year for "
     "AMD. Our competitive product portfolio and market share gains drove the highest annual and highest quarterly revenue in AMD's "
     "history. Fourth quarter revenue was $2.13 billion, up 50% from a year ago and up 18% from the prior quarter, driven by strong "
     "sales of Ryzen and EPYC processors and Radeon GPUs, partially offset by softer semi-custom sales. ", "Gross margin was 45%, up "
     "360 basis points from a year ago, driven primarily by sales of our leadership 7-nanometer products.",
     [("gross_margin", None, None, "reported", 2019, 4, 45.0, None, None)]),
    # growth excluding currency moves is no basis, and an opener excluding them restates the sentence: no row
    (_context("AMZN", "2016-01-28", "Q4 2015", 12), "", "Revenue increased 20% to $107 billion, or 26% excluding year-over-year changes "
     "in foreign exchange.", [("revenue_growth", None, None, "reported", 2015, 4, 20.0, None, None),
                              ("revenue", None, None, "reported", 2015, 4, 1.07e11, None, None)]),
    (_context("AMZN", "2016-07-28", "Q2 2016", 12), "", "Excluding the $184 million year-over-year favorable foreign exchange impact, "
     "revenue growth was 28%.", []),
    # growth over an earlier quarter of the same year is sequential: the level stays, the growth gives no row
    (_context("AMD", "2019-07-30", "Q2 2019", 12), "", "Second quarter revenue of $1.53 billion grew 20% over the first quarter.",
     [("revenue", None, None, "reported", 2019, 2, 1.53e9, None, None)]),
    # a year before the metric names the period: the full year, not the next quarter
    (_context("INTC", "2020-01-23", "Q4 2019", 12), "", "Intel expect 2020 CapEx of approximately $17 billion.",
     [("capex", None, None, "guidance", 2020, None, 1.7e10, None, None)]),
    # a basis stated by a later subject ('and non-GAAP was 61%') is not the first amount's
    (_context("NVDA", "2018-11-15", "Q3 2019", 1), "", "Q3 gross margins was 60.4% and non-GAAP was 61%, below our outlook due to "
     "the $57 million charge for prior architecture components and chips following the sharp falloff in crypto demand.",
     [("gross_margin", None, None, "reported", 2019, 3, 60.4, None, None), ("gross_margin", None, "non-GAAP", "reported", 2019, 3, 61.0, None, None)]),
    # a sentence opening with its basis states it for the income figures of its later clauses
    (_context("NVDA", "2017-11-09", "Q3 2018", 1), "", "Non-GAAP net income was $833 million, and EPS was $1.33, up 46% and 41%, "
     "respectively from a year earlier, reflecting revenue strength as well as gross margin and operating margin expansion.",
     [("net_income", None, "non-GAAP", "reported", 2018, 3, 8.33e8, None, None), ("eps", None, "non-GAAP", "reported", 2018, 3, 1.33, None, None)]),
    # a segment's name written without its punctuation is still that segment, not the smaller one inside it
    (_context("AMD", "2017-01-31", "Q4 2016", 12), "", "Enterprise embedded and semi-custom revenue was $506 million, up 4% year "
     "over year and down 39% from the prior quarter, primarily due to lower sales of our semi-custom SoCs.",
     [("segment_revenue", "Enterprise, Embedded and Semi-Custom", None, "reported", 2016, 4, 5.06e8, None, None),
      ("revenue_growth", "Enterprise, Embedded and Semi-Custom", None, "reported", 2016, 4, 4.0, None, None)]),
    # what a figure would have been is not what it was
    (_context("ASML", "2020-07-15", "Q2 2020", 12), "", "Taking into account the additional approximately EUR 260 million of revenue "
     "from the net 2 systems we didn't recognize in Q2, this would hypothetically have resulted in revenue of around EUR 3.6 billion "
     "and a growth of around 50%.", []),
    # 'from a GAAP perspective' states the basis for the sentence's figures
    (_context("CSCO", "2020-02-12", "Q2 2020", 7), "", "In terms of the bottom line, from a GAAP perspective, Q2 net income was $2.9 "
     "billion, and EPS was $0.68.", [("net_income", None, "GAAP", "reported", 2020, 2, 2.9e9, None, None),
                                     ("eps", None, "GAAP", "reported", 2020, 2, 0.68, None, None)]),
    # a basis after an alternative amount is that amount's ('or 19% excluding Wind River')
    (_context("INTC", "2018-10-25", "Q3 2018", 12), "", "Intel's Internet of Things business achieved record revenue of $919 million "
     "on broad business strength, up 8% or 19% excluding Wind River.",
     # (the level, '$919 million on broad business strength', is read as an amount of something else: a known miss)
     [("revenue_growth", "Internet of Things Group", None, "reported", 2018, 3, 8.0, None, None)]),
])
def test_product_lines_parent_margins_losses_and_year_headings(context, scope, sentence, expected):
    """Kinds of misfiled figures found reading the full-corpus `metrics` (issue 25), each from a real sentence."""
    assert _parsed(context, sentence, scope) == expected
