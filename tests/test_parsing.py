"""The StreetEvents parser on the bundled sample and on all 188 real transcripts."""

from __future__ import annotations

import re
from datetime import date, timezone

import pytest

from tests.conftest import needs_corpus
from tkg.core.companies import get_company
from tkg.ingest.parsing import (
    SourceRow,
    TranscriptParseError,
    parse_transcript,
    split_affiliation,
)
from tkg.ingest.sources import load_source


def _parse(row):
    return parse_transcript(row, get_company(row.company))


def test_sample_parses_with_fiscal_periods():
    rows = load_source("sample").rows
    parsed = {t.transcript_id: t for t in map(_parse, rows)}
    assert len(parsed) == 8
    # Quantaris' fiscal year ends in June: its 'Q1 2025' is July-September 2024.
    qntx = parsed["QNTX_20241029"]
    assert qntx.fiscal_quarter == "Q1 2025"
    assert (qntx.fiscal_period_start, qntx.fiscal_period_end) == (date(2024, 7, 1), date(2024, 9, 30))
    helio = parsed["HLIO_20240806"]
    assert helio.call_datetime.tzinfo == timezone.utc
    corporate = {p.name: p.title for p in helio.participants if p.kind == "corporate"}
    assert corporate["Marcus J. Ortega"] == "CFO"


@needs_corpus
def test_all_real_transcripts_parse(corpus_rows):
    assert len(corpus_rows) == 188
    for row in corpus_rows:
        transcript = _parse(row)
        assert transcript.call_date == row.call_date
        assert transcript.fiscal_quarter and transcript.turns, transcript.transcript_id


@needs_corpus
def test_participant_counts_match_the_raw_lists(corpus_rows):
    """Every ' * name' line of the two participant sections becomes exactly one participant."""
    for row in corpus_rows:
        transcript = _parse(row)
        for section, kind in (("Corporate Participants", "corporate"), ("Conference Call Participiants", "conference")):
            block = re.search(rf"{section}\n=+\n(.*?)\n=+", row.text, re.S)
            expected = len(re.findall(r"^\s*\* ", block[1], re.M)) if block else 0
            assert sum(p.kind == kind for p in transcript.participants) == expected, (transcript.transcript_id, section)


@needs_corpus
def test_known_participants_and_titles(corpus_rows):
    intc = _parse(next(r for r in corpus_rows if r.company == "INTC" and r.call_date == date(2016, 10, 18)))
    corporate = {p.name: (p.organization, p.title) for p in intc.participants if p.kind == "corporate"}
    assert corporate["Bob Swan"] == ("Intel Corporation", "CFO")
    assert corporate["Stacy Smith"][1] == "EVP of Manufacturing, Sales, and Operations"
    assert sum(p.kind == "conference" for p in intc.participants) > 5
    nvda = _parse(next(r for r in corpus_rows if r.company == "NVDA" and r.call_date == date(2020, 8, 19)))
    assert nvda.fiscal_quarter == "Q2 2021" and nvda.fiscal_period_start == date(2020, 5, 1)
    assert nvda.call_datetime.date() == date(2020, 8, 19) and nvda.call_datetime.tzinfo == timezone.utc


@needs_corpus
def test_boilerplate_is_dropped(corpus_rows):
    for row in corpus_rows:
        transcript = _parse(row)
        body = row.text[: transcript.body_end]
        assert "Disclaimer\n---" not in body and "reserves the right to make changes" not in body, transcript.transcript_id
        assert all(turn.end <= transcript.body_end for turn in transcript.turns)
        assert all(row.text[turn.start : turn.end] == turn.text for turn in transcript.turns)


@needs_corpus
def test_event_brief_summaries_are_attributed(corpus_rows):
    """AAPL 'Event Brief' files: summary blocks under '(T.C.)' headings belong to Tim Cook."""
    brief = _parse(next(r for r in corpus_rows if r.company == "AAPL" and r.call_date == date(2017, 5, 2)))
    sections = {turn.section for turn in brief.turns}
    assert {"OVERVIEW", "FINANCIAL DATA", "PRESENTATION SUMMARY", "QUESTIONS AND ANSWERS"} <= sections
    summary = [t for t in brief.turns if t.section == "PRESENTATION SUMMARY"]
    assert summary[0].speaker == "Timothy D. Cook" and summary[0].heading.endswith("(T.C.)")


@pytest.mark.parametrize(
    "affiliation, expected",
    [
        ("Intel Corporation - Executive VP & CFO", ("Intel Corporation", "Executive VP & CFO")),
        ("Alphabet Inc. - CEO - Google Inc.", ("Alphabet Inc.", "CEO - Google Inc.")),
        ("Sr. Director Investor Relations -", (None, "Sr. Director Investor Relations")),
        (" - ", (None, None)),
    ],
)
def test_split_affiliation(affiliation, expected):
    assert split_affiliation(affiliation) == expected


def test_unparseable_transcript_names_itself():
    row = SourceRow("AMD", date(2016, 7, 21), "no rulers here at all")
    with pytest.raises(TranscriptParseError, match="AMD 2016-07-21"):
        _parse(row)
