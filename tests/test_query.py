"""The query layer (tkg.answer.query), offline answers (tkg.answer.ask) and the answer commands, on the
bundled sample (two CFO/CEO successions) and on the real corpus (Intel and AMD, 2016-2018)."""

from __future__ import annotations

import json
from datetime import date, datetime, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import duckdb
import pytest

from tests.conftest import gold_cases, needs_gold, run_tkg
from tkg.answer.ask import answer_offline, read_period
from tkg.answer.query import AmbiguousEntity, Graph, QueryError, UnknownEntity


@pytest.fixture(scope="module")
def sample(sample_home):
    with Graph.open(sample_home / "tkg.duckdb") as graph:
        yield graph


@pytest.fixture(scope="module")
def corpus(corpus_home):
    with Graph.open(corpus_home / "tkg.duckdb") as graph:
        yield graph


def people(answer) -> set[str]:
    return {fact.subject for fact in answer.facts}


def cfo_of_helio(graph: Graph, start, end=None, **options) -> set[str]:
    answer = graph.factual_qa("Helio Robotics", start, end if end is not None else start, predicate="HOLDS_ROLE", **options)
    return {fact.subject for fact in answer.facts if fact.value == "CFO"}


# --- entities ----------------------------------------------------------------------------------


def test_find_entity_ranks_exact_then_alias_then_fuzzy(sample):
    assert sample.entity("HLIO").name == "Helio Robotics, Inc."
    assert sample.entity("helio robotics").how == "alias"
    assert sample.entity("Helio Robotics, Inc.").how == "name"
    ortega = sample.entity("Marcus Ortega")
    assert ortega.name == "Marcus J. Ortega" and ortega.type == "Person" and ortega.score < 100
    typo = sample.find_entity("Helio Robotcs")
    assert typo[0].name == "Helio Robotics, Inc." and typo[0].how == "fuzzy"
    assert sample.entity(ortega.canonical_id).how == "id"


def test_unknown_and_ambiguous_names_are_reported_not_guessed(sample):
    with pytest.raises(UnknownEntity, match="no entity called 'Zebulon Quux'"):
        sample.entity("Zebulon Quux")
    with pytest.raises(AmbiguousEntity) as ambiguous:
        sample.entity("Dana")  # Dana Whitfield (CFO) and Dana Kowalski (analyst)
    assert {c.name for c in ambiguous.value.candidates} >= {"Dana Whitfield", "Dana Kowalski"}
    with pytest.raises(QueryError, match="empty"):
        sample.entity("   ")


# --- factual_qa --------------------------------------------------------------------------------


def test_window_edges_around_a_succession(sample):
    # Dana Whitfield was CFO until Marcus J. Ortega took over on 2024-07-01 (00:00 UTC)
    assert cfo_of_helio(sample, "2024-06-30") == {"Dana Whitfield"}
    assert cfo_of_helio(sample, "2024-07-01") == {"Marcus J. Ortega"}
    assert cfo_of_helio(sample, "2024-02-06") == {"Dana Whitfield"}  # the day of the first call
    assert cfo_of_helio(sample, "2024-01-01") == set()  # before any call


def test_aware_and_naive_dates(sample):
    # 2024-06-30 23:00 in New York is 2024-07-01 03:00 UTC: after the succession
    assert cfo_of_helio(sample, datetime(2024, 6, 30, 23, 0, tzinfo=ZoneInfo("America/New_York"))) == {"Marcus J. Ortega"}
    assert cfo_of_helio(sample, datetime(2024, 6, 30, 23, 0)) == {"Dana Whitfield"}  # naive: read as UTC
    assert cfo_of_helio(sample, date(2024, 6, 30)) == {"Dana Whitfield"}
    assert cfo_of_helio(sample, "2024-07-01T01:59:00+02:00") == {"Dana Whitfield"}  # 2024-06-30 23:59 UTC


def test_history_brings_back_what_ended_inside_the_window(sample):
    assert cfo_of_helio(sample, "2024-01-01", "2024-12-31") == {"Marcus J. Ortega"}
    answer = sample.factual_qa("Helio", "2024-01-01", "2024-12-31", predicate="HOLDS_ROLE", history=True)
    retired = [fact for fact in answer.facts if fact.subject == "Dana Whitfield" and fact.value == "CFO"]
    assert len(retired) == 1 and retired[0].invalid_at == datetime(2024, 7, 1, tzinfo=timezone.utc)
    assert retired[0].invalidated_by is not None
    assert {f.subject for f in answer.facts if f.value == "CFO"} == {"Dana Whitfield", "Marcus J. Ortega"}


def test_one_row_per_fact_with_its_restatements(sample):
    answer = sample.factual_qa("Helio", "2024-01-01", "2024-12-31", predicate="HOLDS_ROLE", history=True)
    keys = [(f.subject_id, f.predicate, f.object_id, f.value) for f in answer.facts]
    assert len(keys) == len(set(keys))
    counted = sample.rows("SELECT count(*) AS n FROM facts WHERE subject = 'Priya K. Raman' AND value = 'CEO'")[0]["n"]
    priya = [f for f in answer.facts if f.subject == "Priya K. Raman" and f.value == "CEO"]
    assert priya[0].restatements == counted > 1


def test_an_unknown_predicate_maps_to_the_closest_and_says_so(sample):
    answer = sample.factual_qa("Helio", "2024-06-30", "2024-06-30", predicate="works as")
    assert answer.predicate.predicate == "HOLDS_ROLE" and not answer.predicate.exact
    assert answer.facts and {f.predicate for f in answer.facts} == {"HOLDS_ROLE"}
    assert sample.factual_qa("Helio", predicate="HOLDS_ROLE").predicate.exact


def test_a_window_that_ends_before_it_starts_is_an_error(sample):
    with pytest.raises(QueryError, match="starts .* after it ends"):
        sample.factual_qa("Helio", "2024-12-31", "2024-01-01")
    with pytest.raises(QueryError, match="not a date"):
        sample.factual_qa("Helio", "last tuesday", None)


# --- timeline, search, trends ---------------------------------------------------------------------


def test_timeline_is_one_row_per_fact_with_its_retirement(sample):
    match, entries, _ = sample.timeline("Dana Whitfield")
    assert match.name == "Dana Whitfield"
    cfo = [e for e in entries if e.value == "CFO"]
    assert len(cfo) == 1
    assert cfo[0].restatements == sample.rows(
        "SELECT count(*) AS n FROM facts WHERE subject = 'Dana Whitfield' AND value = 'CFO'")[0]["n"]
    assert cfo[0].ended_at == datetime(2024, 7, 1, tzinfo=timezone.utc)
    assert "Marcus Ortega became CFO" in cfo[0].retired_by_statement
    assert all(e.ended_at is None and e.retired_by is None for e in entries if e.value != "CFO")


def test_officer_tenures_merge_restatements(sample):
    rows = sample.rows("SELECT person, title, started_at, ended_at, restatements, ended_by_statement FROM officer_tenures "
                       "WHERE organization = 'Quantaris Networks Corporation' AND title = 'CEO' ORDER BY started_at")
    assert [(r["person"], r["ended_at"] is None) for r in rows] == [("Thomas Becker", False), ("Elena Vasquez", True)]
    assert rows[0]["ended_at"] == rows[1]["started_at"] and "Elena Vasquez became CEO" in rows[0]["ended_by_statement"]
    assert rows[0]["restatements"] == sample.rows(
        "SELECT count(*) AS n FROM facts WHERE subject = 'Thomas Becker' AND value = 'CEO'")[0]["n"]


def test_search_finds_statements_by_meaning_with_filters(sample):
    found = sample.search("who will be the next chief financial officer", k=5, company="Helio")
    assert len(found) == 5 and all(f.company == "HLIO" for f in found)
    assert [f.score for f in found] == sorted((f.score for f in found), reverse=True)
    assert any("CFO" in f.statement for f in found[:3])
    before = sample.search("Marcus Ortega became CFO", k=50, as_of="2024-06-30", company="HLIO")
    assert all(f.valid_at is None or f.valid_at <= datetime(2024, 6, 30, 23, 59, 59, tzinfo=timezone.utc) for f in before)
    with pytest.raises(QueryError, match="not a configured company"):
        sample.search("revenue", company="Globex")


def test_trend_analysis_groups_by_company_and_quarter(sample):
    trend = sample.trend_analysis("how did revenue develop", ["HLIO", "QNTX"], "2024-01-01", "2024-12-31", "revenue")
    assert trend.groups and {company for company, _ in trend.groups} <= {"HLIO", "QNTX"}
    quarters = [quarter for company, quarter in trend.groups if company == "HLIO"]
    assert quarters == sorted(quarters, key=lambda q: (q.split()[-1], q))


# --- safety ------------------------------------------------------------------------------------

INJECTIONS = ["x' OR '1'='1", "HLIO'; DROP TABLE facts; --", "\"; ATTACH '/tmp/evil.duckdb' AS evil; --",
              "Helio') UNION SELECT * FROM read_csv('/etc/passwd') --"]


@pytest.mark.parametrize("text", INJECTIONS)
def test_every_string_argument_is_a_parameter(sample, text, tmp_path):
    facts_before = sample.rows("SELECT count(*) AS n FROM facts")[0]["n"]
    for call in (lambda: sample.entity(text), lambda: sample.factual_qa(text),
                 lambda: sample.factual_qa("Helio", predicate=text), lambda: sample.factual_qa("Helio", text, None),
                 lambda: sample.timeline("Helio", predicate=text), lambda: sample.search(text, k=3),
                 lambda: sample.search("revenue", company=text), lambda: sample.trend_analysis(text, None, None, None, text)):
        try:
            call()
        except QueryError:
            pass  # a clear refusal is fine; anything else (a SQL error) is not
    assert sample.rows("SELECT count(*) AS n FROM facts")[0]["n"] == facts_before
    assert not Path("/tmp/evil.duckdb").exists()


def test_the_connection_cannot_touch_other_files(sample, tmp_path):
    outside = tmp_path / "secret.csv"
    outside.write_text("a\n1\n")
    with pytest.raises(duckdb.Error):
        sample.rows("SELECT * FROM read_csv(?)", [str(outside)])
    with pytest.raises(duckdb.Error):
        sample.rows(f"COPY (SELECT 1) TO '{tmp_path / 'out.csv'}'")
    with pytest.raises(duckdb.Error):
        sample.rows("SET enable_external_access = true")
    assert not (tmp_path / "out.csv").exists()


# --- offline answers ------------------------------------------------------------------------------


def test_periods_in_questions():
    june, _ = read_period("Who was Intel's CFO in June 2017?", "INTC")
    assert (june.start.date(), june.end.date()) == (date(2017, 6, 1), date(2017, 6, 30))
    as_of, _ = read_period("Who was the CEO as of March 2017?", None)
    assert (as_of.start.date(), as_of.end.date()) == (date(2017, 3, 1), date(2017, 3, 31))
    # Apple's fiscal year ends in September: fiscal Q2 2016 is January-March 2016
    fiscal, notes = read_period("What did Apple report for fiscal Q2 2016?", "AAPL")
    assert (fiscal.start.date(), fiscal.end.date()) == (date(2016, 1, 1), date(2016, 3, 31)) and notes
    fourth, notes = read_period("What revenue did NVIDIA report for the fourth quarter?", "NVDA", latest=date(2020, 8, 19))
    assert fourth.said == "fourth quarter" and "names no year" in notes[0]
    assert read_period("Who runs Helio?", "HLIO") == (None, [])


def test_ask_offline_on_the_sample(sample):
    before = answer_offline(sample, "Who was Helio Robotics' CFO in June 2024?")
    # one line from officer_tenures, and the ranked facts as its evidence
    assert before.answer.startswith("Helio's CFO in June 2024: Dana Whitfield") and "no model wrote a summary" in before.note
    assert before.facts[0].subject == "Dana Whitfield"
    after = answer_offline(sample, "Who is the CFO of Helio as of August 2024?")
    assert after.facts[0].subject == "Marcus J. Ortega"
    assert [call.tool for call in after.tool_calls][:2] == ["office_holders", "factual_qa"] and after.plan
    assert "Marcus J. Ortega" in after.answer


def test_tkg_ask_facts_and_timeline_commands(sample, sample_home, tmp_path):
    asked = run_tkg(sample_home, "ask", "--json", "Who was the CEO of Quantaris in November 2024?")
    assert asked.returncode == 0, asked.stderr[-2000:]
    document = json.loads(asked.stdout)
    assert set(document) >= {"answer", "plan", "tool_calls", "facts"} and "Elena Vasquez" in document["answer"]
    first = document["facts"][0]
    assert first["subject"] == "Elena Vasquez" and set(first) >= {
        "event_id", "company", "call_date", "subject", "predicate", "object", "value", "statement", "valid_at", "invalid_at"}

    shown = run_tkg(sample_home, "facts", "Quantaris", "--predicate", "role", "--as-of", "2024-09-30")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "Thomas Becker HOLDS_ROLE CEO of" in shown.stdout and "Elena Vasquez HOLDS_ROLE CEO of" not in shown.stdout
    assert "using HOLDS_ROLE" in shown.stderr

    typo = run_tkg(sample_home, "facts", "Zebulon")
    assert typo.returncode == 2 and typo.stderr.count("\n") <= 2 and "no entity called 'Zebulon'" in typo.stderr
    both = run_tkg(sample_home, "facts", "Helio", "--as-of", "2024-01-01", "--from", "2024-01-01")
    assert both.returncode == 2 and "--as-of" in both.stderr

    history = run_tkg(sample_home, "timeline", "Thomas Becker", "--json")
    entries = json.loads(history.stdout)["entries"]
    assert any(e["value"] == "CEO" and e["ended_at"] and "Elena Vasquez" in e["retired_by_statement"] for e in entries)
    drawn = run_tkg(sample_home, "timeline", "Dana Whitfield", "--png", str(tmp_path / "dana.png"))
    assert drawn.returncode == 0 and (tmp_path / "dana.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"({len(sample.timeline('Dana Whitfield')[1])} bar(s))" in drawn.stderr
    around = run_tkg(sample_home, "export", "--png", str(tmp_path / "helio.png"), "--around", "Helio", "--as-of", "2024-06-30")
    assert around.returncode == 0 and (tmp_path / "helio.png").stat().st_size > 0, around.stderr[-2000:]
    nothing = run_tkg(sample_home, "export")
    assert nothing.returncode == 2 and "--graphml FILE" in nothing.stderr
    missing = run_tkg(tmp_path / "empty", "ask", "anything")
    assert missing.returncode == 2 and "run `tkg build` first" in missing.stderr


# --- the real corpus ------------------------------------------------------------------------------


def test_real_aliases_and_windows(corpus):
    assert corpus.entity("Bob Swan").name == "Robert H. Swan"
    assert corpus.entity("Intel Corp").canonical_id == corpus.entity("INTC").canonical_id
    assert corpus.entity("Lisa Su").name == "Lisa T. Su"
    cfo = lambda day: {f.subject for f in corpus.factual_qa("Intel", day, day, predicate="HOLDS_ROLE").facts  # noqa: E731
                       if f.value == "CFO"}
    assert cfo("2016-06-01") == {"Stacy Smith"} and cfo("2017-06-01") == {"Robert H. Swan"}
    amd = corpus.factual_qa("AMD", "2016-01-01", "2018-12-31", predicate="HOLDS_ROLE")
    assert "Lisa T. Su" in {f.subject for f in amd.facts if f.value == "CEO"}
    history = corpus.factual_qa("Intel", "2016-01-01", "2017-12-31", predicate="HOLDS_ROLE", history=True)
    assert {"Stacy Smith", "Robert H. Swan"} <= {f.subject for f in history.facts if f.value == "CFO"}
    tenures = corpus.rows("SELECT person, ended_by_statement FROM officer_tenures WHERE office = 'CFO of Intel Corporation' "
                          "AND title = 'CFO' ORDER BY started_at")
    assert [t["person"] for t in tenures][:2] == ["Stacy Smith", "Robert H. Swan"]


@needs_gold
@pytest.mark.parametrize("case", gold_cases("role_as_of"), ids=lambda case: case["id"])
def test_ask_answers_the_gold_role_questions_in_its_top_3(corpus, case):
    names = {"INTC": "Intel", "AMD": "AMD", "NVDA": "NVIDIA", "MSFT": "Microsoft", "AAPL": "Apple", "CSCO": "Cisco",
             "MU": "Micron", "ASML": "ASML", "AMZN": "Amazon", "GOOGL": "Alphabet"}
    day = date.fromisoformat(case["as_of"])
    answer = answer_offline(corpus, f"Who was {names[case['company']]}'s {case['role']} in {day:%B %Y}?")
    top = [fact.subject for fact in answer.facts[:3]]
    assert set(top) & set(case["aliases"]), (top, answer.note)


# --- issue 25: figures and offices from the warehouse's tables ---------------------------------------


def test_ask_reads_metrics_for_a_reported_figure(sample):
    answer = answer_offline(sample, "What revenue did Helio Robotics report for Q3 2024?")
    assert answer.answer.startswith("Helio reported Q3 FY2024 revenue of $361 million")
    top = answer.facts[0]
    assert (top.predicate, top.object, top.value) == ("reported revenue", "Q3 FY2024", "$361 million")
    assert f"[{top.event_id}]" in answer.answer and str(top.call_date) in answer.answer  # cites the row it used
    assert [call.tool for call in answer.tool_calls] == ["metrics"]


def test_ask_gives_the_whole_revision_chain(sample):
    """FY2024 guidance of $1.20 billion (restated once) raised to $1.35 billion: every step, the
    restatement folded into the step it restates."""
    answer = answer_offline(sample, "How did Helio's FY2024 revenue guidance change?")
    assert "$1.2 billion on 2024-02-06 (restated until 2024-05-07)" in answer.answer
    assert answer.answer.index("$1.2 billion") < answer.answer.index("then $1.35 billion on 2024-08-06")
    assert [fact.value for fact in answer.facts][:2] == ["$1.2 billion", "$1.35 billion"]
    as_of = answer_offline(sample, "What FY2024 revenue did Helio expect, as of July 2024?")
    assert "$1.2 billion" in as_of.answer and "$1.35 billion" not in as_of.answer


def test_ask_compares_two_companies_on_their_own_fiscal_calendars(sample):
    answer = answer_offline(sample, "Helio vs Quantaris revenue, Q2 2024")
    assert "Helio reported Q2 FY2024 revenue of $326 million" in answer.answer
    assert "Quantaris reported Q2 FY2024 revenue of $712 million" in answer.answer
    assert any("QNTX's own fiscal quarter" in note for note in answer.note.split("; "))  # a June fiscal year


def test_ask_says_plainly_what_is_not_in_the_data(sample):
    registered = answer_offline(sample, "Who was Amazon's CEO in 2024?")  # in the registry, no calls here
    assert registered.answer.startswith("Not in the data") and registered.facts == []
    unknown = answer_offline(sample, "What was Tesla's revenue in 2024?")
    assert unknown.answer.startswith("Not in the data: Tesla") and unknown.facts == []
    period = answer_offline(sample, "What revenue did Helio report for Q3 2019?")
    assert period.answer.startswith("Not in the data: no Q3 FY2019 revenue of Helio")


def test_periods_of_financial_questions():
    from tkg.answer.financial import fiscal_period
    from tkg.core.companies import get_company

    nvidia, apple = get_company("NVDA"), get_company("AAPL")
    assert (fiscal_period("NVIDIA revenue, fiscal Q2 2018", nvidia)[0].year, fiscal_period("NVIDIA revenue, fiscal Q2 2018", nvidia)[0].quarter) == (2018, 2)
    march, notes = fiscal_period("Apple revenue for the March 2016 quarter", apple)
    assert (march.year, march.quarter) == (2016, 2) and notes
    calendar_q, _ = fiscal_period("NVIDIA revenue in calendar Q2 2018", nvidia)  # April-June 2018: NVIDIA's Q2 FY2019 (May-July)
    assert (calendar_q.year, calendar_q.quarter) == (2019, 1) or (calendar_q.year, calendar_q.quarter) == (2019, 2)
    full, _ = fiscal_period("What full-year fiscal 2017 operating expense did Microsoft expect, as of December 2016?",
                            get_company("MSFT"))
    assert (full.year, full.quarter, full.full_year) == (2017, None, True)


@pytest.mark.slow
def test_ask_answers_the_analyst_questions_on_the_corpus(corpus):
    """Issue 25's questions, on the whole real corpus built offline."""
    def said(question: str) -> str:
        return answer_offline(corpus, question).answer or ""
    assert "NVIDIA reported Q2 FY2018 revenue of $2.23 billion" in said("NVIDIA revenue, fiscal Q2 2018")
    assert "Apple reported Q3 FY2020 revenue of $59.7 billion" in said("Apple revenue, fiscal Q3 2020")
    assert "gross margin of 45%" in said("AMD gross margin, Q4 2019")
    both = said("Intel vs AMD revenue, Q3 2019")
    assert "Intel reported Q3 FY2019 revenue of $19.2 billion" in both and "AMD reported Q3 FY2019 revenue of $1.8 billion" in both
    chain = said("How did Microsoft's FY2017 opex guidance change?")
    assert all(step in chain for step in ("$31.1 billion to $31.4 billion", "$33.1 billion to $33.3 billion",
                                          "$32.9 billion to $33 billion"))
    cfos = said("Intel CFO timeline 2016–2020")
    assert cfos.index("Stacy Smith") < cfos.index("Robert H. Swan") < cfos.index("George S. Davis")
    assert said("Amazon CEO in 2018").startswith("Not in the data")


@pytest.mark.slow
def test_an_interim_tenure_closes_when_the_permanent_one_starts(corpus):
    """Issue 25: Robert H. Swan was Intel's interim CEO from July 2018, then CEO: the interim
    tenure ends where the permanent one starts, so the two never overlap."""
    rows = corpus.rows("SELECT title, started_at, ended_at FROM officer_tenures WHERE office = 'CEO of Intel Corporation' "
                       "AND person = 'Robert H. Swan' ORDER BY started_at")
    interim = [row for row in rows if "interim" in row["title"].lower()]
    permanent = [row for row in rows if "interim" not in row["title"].lower()]
    assert interim and permanent
    assert interim[0]["ended_at"] == permanent[0]["started_at"]
