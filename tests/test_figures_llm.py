"""The figures stage on the LLM path, over real HTTP against the local OpenAI-compatible server.

The server's responder answers with what the offline figure rules find, so the LLM path must
give the offline figures back through the real prompt, client, parsing, batching and cache.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime, timezone

import pytest

from fakes.responders import PipelineResponder
from tests.test_llm import fresh, make, server  # noqa: F401  (the server and extractor fixtures)
from tkg.core.companies import get_company
from tkg.core.models import FigureMetric, RawStatement
from tkg.extract.base import DocumentContext
from tkg.extract.offline import OfflineExtractor
from tkg.llm.extractor import TEMPLATES, stage_fingerprint
from tkg.llm.prompts import render
from tkg.llm.settings import LLMSettings, settings_from_env

# Microsoft's fiscal year ends in June: the call of 2020-01-29 reports fiscal Q2 2020.
MSFT_Q2_2020 = DocumentContext(
    ticker="MSFT", main_entity="Microsoft Corporation", short_name="Microsoft", document_type="Earnings Call Transcript",
    publication_date=datetime(2020, 1, 29, 22, 0, tzinfo=timezone.utc), fiscal_quarter="Q2 2020",
    fiscal_period_start=date(2019, 10, 1), fiscal_period_end=date(2019, 12, 31), fiscal_year_end_month=6,
)
REPORTED_REVENUE = "Revenue for the quarter was $50.6 billion, which was within our guidance range."
OPEX_GUIDANCE = ("For the full year, we now expect operating expenses of $33.1 billion to $33.3 billion, "
                 "with about $2.3 billion from LinkedIn.")
NO_DIGIT = "We delivered a strong quarter with double-digit growth across our segments."


def statement(text: str, statement_type: str = "FACT", temporal_type: str = "STATIC") -> RawStatement:
    return RawStatement(statement=text, statement_type=statement_type, temporal_type=temporal_type)


STATEMENTS = [
    statement(REPORTED_REVENUE),
    statement(OPEX_GUIDANCE, "PREDICTION", "DYNAMIC"),
    statement("In Intelligent Cloud, we expect revenue between $11.85 billion and $12.05 billion.", "PREDICTION", "DYNAMIC"),
    statement("We expect capital expenditures of $10.5 billion plus or minus 5% in fiscal 2021.", "PREDICTION", "DYNAMIC"),
    statement("Gross margin was 67.7%, up 2 points year-over-year."),
    statement("Our commercial cloud annual revenue run rate exceeded $40 billion.", "FACT", "DYNAMIC"),
]


def essentials(per_statement):
    return [[(f.metric.value, f.segment, f.kind.value, f.fiscal_year, f.fiscal_quarter, f.value, f.low, f.high, f.unit)
             for f in figures] for figures in per_statement]


@pytest.fixture
def recorded(fresh):  # noqa: F811  (the fixture imported above)
    """The statements section of every figures request the server answered."""
    responder, inputs = PipelineResponder(), []

    def answer(request):
        if request.schema_name == "FiguresOut":
            inputs.append(request.input_text.rsplit("Statements:", 1)[-1])
        return responder(request)

    fresh.set_responder(answer)
    return inputs


def test_the_llm_path_returns_the_offline_figures(make, fresh, recorded):  # noqa: F811
    extractor, _, _ = make()
    figures = extractor.extract_figures(STATEMENTS, MSFT_Q2_2020)

    assert figures == OfflineExtractor().extract_figures(STATEMENTS, MSFT_Q2_2020)
    found = essentials(figures)
    assert found[0] == [("revenue", None, "reported", 2020, 2, 50.6e9, None, None, "USD")]
    # the LinkedIn part of operating expenses is a sub-amount, not a figure
    assert found[1] == [("operating_expenses", None, "guidance", 2020, None, 33.2e9, 33.1e9, 33.3e9, "USD")]
    assert found[2] == [("segment_revenue", "Intelligent Cloud", "guidance", 2020, 3, 11.95e9, 11.85e9, 12.05e9, "USD")]
    assert found[3] == [("capex", None, "guidance", 2021, None, 10.5e9, pytest.approx(9.975e9), pytest.approx(11.025e9), "USD")]
    assert found[4] == [("gross_margin", None, "reported", 2020, 2, 67.7, None, None, "percent")]
    assert found[5] == []  # a run rate
    stats = extractor.stats("figures")
    assert stats.requests == fresh.stats().requests["responses"] == 2  # six statements, four to a request
    assert stats.dropped_total == 0 and stats.cache_hits == 0


def test_a_statement_without_a_digit_makes_no_request(make, fresh, recorded):  # noqa: F811
    extractor, _, _ = make()
    assert extractor.extract_figures([statement(NO_DIGIT)], MSFT_Q2_2020) == [[]]
    assert fresh.stats().total_requests == 0 and extractor.stats("figures").requests == 0

    figures = extractor.extract_figures([statement(NO_DIGIT), statement(REPORTED_REVENUE)], MSFT_Q2_2020)
    assert figures[0] == [] and [f.value for f in figures[1]] == [50.6e9]
    assert fresh.stats().total_requests == 1
    assert len(recorded) == 1 and REPORTED_REVENUE in recorded[0] and NO_DIGIT not in recorded[0]


def test_a_second_call_is_answered_from_the_cache(make, fresh):  # noqa: F811
    extractor, _, _ = make()
    first = extractor.extract_figures(STATEMENTS, MSFT_Q2_2020)
    requests = fresh.stats().total_requests
    assert requests > 0

    assert extractor.extract_figures(STATEMENTS, MSFT_Q2_2020) == first
    assert fresh.stats().total_requests == requests
    stats = extractor.stats("figures")
    assert stats.requests == requests and stats.cache_hits == len(STATEMENTS)


def test_malformed_figures_are_dropped_and_counted_not_fatal(make, fresh):  # noqa: F811
    extractor, _, _ = make()
    revenue = {"metric": "revenue", "segment": None, "basis": None, "kind": "reported", "fiscal_year": 2020,
               "fiscal_quarter": 2, "value": 50.6e9, "low": None, "high": None, "unit": "USD", "text": "$50.6 billion"}

    def answer(request):
        assert request.schema_name == "FiguresOut"
        return {"items": [{"index": 0, "figures": [
            revenue,
            {**revenue, "unit": "percent", "value": 50.6},  # revenue is money, not a percentage
            {**revenue, "fiscal_quarter": 5},  # no such quarter
            "not a figure",
            {**revenue, "segment": "Retail Stores"},  # not a segment of Microsoft's
            {**revenue, "metric": "gross_margin", "segment": "Azure", "unit": "percent", "value": 70.0},  # a segment's margin
            {**revenue, "metric": "segment_revenue", "segment": "server products", "value": 8.2e9},  # an alias
        ]}]}

    fresh.set_responder(answer)
    figures = extractor.extract_figures([statement(REPORTED_REVENUE)], MSFT_Q2_2020)[0]

    assert [(f.metric.value, f.segment, f.value) for f in figures] == [
        ("revenue", None, 50.6e9), ("segment_revenue", "Server products and cloud services", 8.2e9)]
    stats = extractor.stats("figures")
    assert stats.dropped == {"figure_invalid": 3, "figure_segment_not_in_registry": 1,
                             "figure_segment_metric_not_in_vocabulary": 1}
    assert stats.repaired == {"segment_alias_mapped_to_registry_name": 1}
    assert stats.requests == 1 and stats.reasks == 0 and not stats.unanswered_items


def test_a_statement_the_answer_leaves_out_is_asked_again_then_counted(make, fresh):  # noqa: F811
    extractor, _, _ = make()
    fresh.set_responder(lambda request: {"items": []})
    assert extractor.extract_figures(STATEMENTS[:2], MSFT_Q2_2020) == [[], []]
    stats = extractor.stats("figures")
    assert stats.requests == 4  # the batch, the batch again, then each statement alone
    assert stats.unanswered_items == {"figures_statement_without_answer": 2}


def test_the_prompt_names_the_vocabulary_and_the_company_segments():
    prompt = render(TEMPLATES["figures"], segments=[{"name": n, "aliases": list(a)} for n, a in get_company("MSFT").segments],
                    statements=[{"index": 0, "statement": REPORTED_REVENUE, "statement_type": "FACT", "temporal_type": "STATIC"}],
                    main_entity="Microsoft Corporation", ticker="MSFT", publication_date="2020-01-29T22:00:00+00:00",
                    fiscal_quarter="Q2 2020", quarter_explanation=MSFT_Q2_2020.quarter_explanation())
    assert all(f"- {metric.value}:" in prompt.instructions for metric in FigureMetric)
    assert "- Intelligent Cloud\n" in prompt.input and "- Windows OEM (also: OEM)" in prompt.input
    assert "fiscal year ends in month 6" in prompt.input


def test_code_version_follows_prompt_model_and_segments(monkeypatch):
    base = LLMSettings()
    figures = stage_fingerprint(base, "figures")
    assert figures != stage_fingerprint(base, "triplets")
    assert figures != stage_fingerprint(replace(base, models={**base.models, "figures": "gpt-4.1"}), "figures")
    assert figures == stage_fingerprint(replace(base, models={**base.models, "triplets": "gpt-4.1"}), "figures")
    monkeypatch.setattr("tkg.extract.figures.segments_fingerprint", lambda: "edited registry")
    assert stage_fingerprint(base, "figures") != figures
    monkeypatch.setenv("TKG_MODEL_FIGURES", "gpt-4.1-nano")
    assert settings_from_env().model("figures") == "gpt-4.1-nano"
