"""Answering a question offline: read the entities, dates and fiscal periods it names, run the
query tools, and rank the facts that answer it. No model writes a summary; the facts are the
answer, best first, each with its evidence. `tkg.answer.agent` does the same with a model."""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from typing import Any

from tkg.answer.query import PREDICATE_CUES, EntityMatch, Fact, Graph, QueryError
from tkg.core.companies import load_companies
from tkg.core.names import company_for_name, fold

MONTHS = {name.lower(): number for number, name in enumerate(calendar.month_name) if name}
MONTHS.update({name.lower(): number for number, name in enumerate(calendar.month_abbr) if name})
ORDINALS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "1st": 1, "2nd": 2, "3rd": 3, "4th": 4}

# Office words a question may use, and how titles spell them.
ROLES = {
    "ceo": ("ceo", "chief executive"), "cfo": ("cfo", "chief financial"), "coo": ("coo", "chief operating"),
    "cto": ("cto", "chief technology"), "president": ("president",), "chairman": ("chairman", "chair", "chairwoman"),
    "investor relations": ("ir", "investor relations"), "treasurer": ("treasurer",), "general counsel": ("general counsel",),
}
STOPWORDS = frozenset("what who whom which when where how did does do was were is are the a an of in on at as to for by "
                      "and or its it their about report reported say said expect".split())


@dataclass
class Period:
    """A window a question names, and the words that named it."""

    start: datetime
    end: datetime
    said: str


@dataclass
class Reading:
    """What the offline reader found in a question."""

    entities: list[EntityMatch] = field(default_factory=list)
    company: str | None = None  # the ticker of the first configured company named
    period: Period | None = None
    predicates: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class ToolCall:
    tool: str
    arguments: dict[str, Any]
    results: int
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": self.arguments, "results": self.results, "error": self.error}


@dataclass
class Answer:
    question: str
    answer: str | None
    plan: list[str]
    tool_calls: list[ToolCall]
    facts: list[Fact]
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        keys = ("event_id", "company", "call_date", "subject", "predicate", "object", "value", "statement", "valid_at",
                "invalid_at")
        return {"question": self.question, "answer": self.answer, "plan": self.plan,
                "tool_calls": [call.as_dict() for call in self.tool_calls],
                "facts": [{key: fact.as_dict()[key] for key in keys} | {"score": fact.score} for fact in self.facts],
                "note": self.note}


def _day_start(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=timezone.utc)


def _day_end(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, 23, 59, 59, tzinfo=timezone.utc)


def _year(text: str) -> int:
    digits = text.strip("'")
    return int(digits) + 2000 if len(digits) == 2 else int(digits)


_FISCAL_QUARTER = re.compile(
    r"\b(?:fiscal\s+)?(?:q([1-4])|(first|second|third|fourth|1st|2nd|3rd|4th)\s+(?:fiscal\s+)?quarter)"
    r"(?:\s+(?:of\s+)?(?:fiscal\s+(?:year\s+)?|fy\s*)?('?\d{2}\b|\d{4}))?", re.IGNORECASE)
_FISCAL_YEAR = re.compile(r"\b(?:fiscal\s+(?:year\s+)?|fy\s?)('?\d{2}\b|\d{4})", re.IGNORECASE)
_MONTH = re.compile(r"\b(" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?(?:\s+(\d{1,2}))?,?\s+(\d{4})\b",
                    re.IGNORECASE)
_ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_YEAR = re.compile(r"\b(19\d{2}|20\d{2})\b")


def read_period(question: str, company: str | None, latest: date | None = None) -> tuple[Period | None, list[str]]:
    """The window a question names: a day, a month, a fiscal quarter or year (on the company's
    fiscal calendar), or a calendar year. A quarter without a year takes the year the question
    names elsewhere, else the newest the graph holds."""
    notes: list[str] = []
    fiscal_calendar = load_companies().get(company) if company else None
    if (found := _FISCAL_QUARTER.search(question)) is not None:
        quarter = int(found[1]) if found[1] else ORDINALS[found[2].lower()]
        if found[3]:
            year = _year(found[3])
        elif (other := _YEAR.search(question[found.end():]) or _YEAR.search(question)) is not None:
            year = int(other[1])
        else:
            year = (latest or date.today()).year
            notes.append(f"'{found[0]}' names no year; read as fiscal {year}, the newest in the graph")
        if fiscal_calendar is not None:
            first, last = fiscal_calendar.fiscal_period(quarter, year)
            notes.append(f"'{found[0]}' is Q{quarter} of {company}'s fiscal {year}: {first} to {last}")
        else:
            first = date(year, 3 * quarter - 2, 1)
            last = date(year, 3 * quarter, calendar.monthrange(year, 3 * quarter)[1])
        return Period(_day_start(first), _day_end(last), found[0]), notes
    if (found := _ISO.search(question)) is not None:
        day = date(int(found[1]), int(found[2]), int(found[3]))
        return Period(_day_start(day), _day_end(day), found[0]), notes
    if (found := _MONTH.search(question)) is not None:
        month, year = MONTHS[found[1].lower()], int(found[3])
        if found[2]:
            day = date(year, month, int(found[2]))
            return Period(_day_start(day), _day_end(day), found[0]), notes
        last = calendar.monthrange(year, month)[1]
        return Period(_day_start(date(year, month, 1)), _day_end(date(year, month, last)), found[0]), notes
    if (found := _FISCAL_YEAR.search(question)) is not None:
        year = _year(found[1])
        if fiscal_calendar is not None:
            first, _ = fiscal_calendar.fiscal_period(1, year)
            _, last = fiscal_calendar.fiscal_period(4, year)
            notes.append(f"'{found[0]}' is {company}'s fiscal {year}: {first} to {last}")
        else:
            first, last = date(year, 1, 1), date(year, 12, 31)
        return Period(_day_start(first), _day_end(last), found[0]), notes
    if (found := _YEAR.search(question)) is not None:
        year = int(found[1])
        return Period(_day_start(date(year, 1, 1)), _day_end(date(year, 12, 31)), found[0]), notes
    return None, notes


def _words(question: str) -> list[str]:
    return re.findall(r"[\w&.\-']+", question)


def read_entities(graph: Graph, question: str) -> list[EntityMatch]:
    """Entities named in the question: the longest runs of words that are a known name or alias
    (possessives dropped: "Intel's"), companies first."""
    words = [re.sub(r"'s$|’s$|[.,?!]+$", "", word) for word in _words(question)]
    known = {fold(row[0]) for row in graph._alias_rows()}
    found: list[EntityMatch] = []
    taken: set[int] = set()
    for size in range(min(6, len(words)), 0, -1):
        for begin in range(len(words) - size + 1):
            span = range(begin, begin + size)
            if taken & set(span):
                continue
            text = " ".join(words[begin:begin + size])
            if size == 1 and (fold(text) in STOPWORDS or len(text) < 2 or text.islower() or fold(text) in ROLES):
                continue
            if fold(text) not in known and company_for_name(text) is None:
                continue
            try:
                match = graph.entity(text)
            except QueryError:
                continue
            if match.type in ("Metric", "Role") and size == 1:
                continue
            found.append(match)
            taken.update(span)
    return sorted(found, key=lambda m: (m.type != "Organization", -m.score))


def read_question(graph: Graph, question: str) -> Reading:
    reading = Reading()
    reading.entities = read_entities(graph, question)
    reading.company = next((found.ticker for m in reading.entities
                            if m.type == "Organization" and (found := company_for_name(m.name))), None)
    latest = graph.rows("SELECT max(call_date) AS latest FROM transcripts")[0]["latest"]
    reading.period, reading.notes = read_period(question, reading.company, latest)
    folded = f" {fold(question)} "
    reading.roles = [role for role, spellings in ROLES.items() if any(f" {s} " in folded for s in (role, *spellings))]
    words = set(folded.split())
    reading.predicates = [predicate for predicate, cues in PREDICATE_CUES.items() if words & set(cues)]
    if reading.roles and "HOLDS_ROLE" not in reading.predicates:
        reading.predicates.insert(0, "HOLDS_ROLE")
    return reading


def _role_match(fact: Fact, roles: list[str]) -> bool:
    text = f" {fold(' '.join(filter(None, (fact.value, fact.object))))} "
    return any(f" {spelling} " in text for role in roles for spelling in (role, *ROLES[role]))


def answer_offline(graph: Graph, question: str, limit: int = 10) -> Answer:
    """The facts that answer `question`, best first, found without a model."""
    if not question.strip():
        raise QueryError("the question is empty")
    from tkg.answer.financial import answer_financial  # it imports this module's office words

    financial = answer_financial(graph, question)
    if financial is not None and financial.own_facts:
        note = ("No model is configured: the answer is read from the warehouse's tables (metrics, officer_tenures), "
                "and the facts are the rows it used" + (f"; {'; '.join(financial.notes)}" if financial.notes else "") + ".")
        return Answer(question, financial.answer, financial.plan,
                      [ToolCall(tool, arguments, results) for tool, arguments, results in financial.calls],
                      financial.facts[:max(limit, len(financial.facts))], note)
    reading = read_question(graph, question)
    plan: list[str] = list(financial.plan) if financial else []
    calls: list[ToolCall] = [ToolCall(t, a, r) for t, a, r in financial.calls] if financial else []
    candidates: dict[str, Fact] = {}
    start = reading.period.start if reading.period else None
    end = reading.period.end if reading.period else None
    company = reading.company
    for entity in reading.entities[:3]:
        for predicate in (reading.predicates[:2] or [None]):
            arguments = {"entity": entity.name, "start": start.isoformat() if start else None,
                         "end": end.isoformat() if end else None, "predicate": predicate}
            plan.append(f"facts about {entity.name}" + (f" ({predicate})" if predicate else "")
                        + (f" valid in {reading.period.said}" if reading.period else ""))
            found = graph.factual_qa(entity, start, end, predicate=predicate).facts
            calls.append(ToolCall("factual_qa", arguments, len(found)))
            for fact in found:
                candidates.setdefault(f"{fact.event_id}|{fact.subject}|{fact.object}", fact)
    as_of = end if reading.period else None
    plan.append("statements closest in meaning to the question" + (f" at {company}" if company else ""))
    arguments = {"text": question, "k": 20, "as_of": as_of.isoformat() if as_of else None, "company": company}
    try:
        searched = graph.search(question, k=20, as_of=as_of, company=company)
        calls.append(ToolCall("search", arguments, len(searched)))
        similarity = graph.similarity(question, list({f.event_id for f in [*candidates.values(), *searched]}))
    except QueryError as error:  # e.g. vectors from an embeddings API that is not configured here
        searched, similarity = [], {}
        calls.append(ToolCall("search", arguments, 0, str(error)))
    for fact in searched:
        candidates.setdefault(f"{fact.event_id}|{fact.subject}|{fact.object}", fact)

    entity_ids = {m.canonical_id for m in reading.entities}

    def score(fact: Fact) -> float:
        value = similarity.get(fact.event_id, 0.0)
        value += 2.0 if reading.roles and _role_match(fact, reading.roles) else 0.0
        value += 1.0 if fact.predicate in reading.predicates else 0.0
        value += 0.5 if entity_ids & {fact.subject_id, fact.object_id} or (company and fact.company == company) else 0.0
        return round(value, 4)

    best: dict[tuple, Fact] = {}  # one row per fact: restatements found by both tools count once
    for fact in sorted(candidates.values(), key=lambda f: (-score(f), str(f.event_id))):
        key = (fact.subject_id, fact.predicate, fact.object_id, fact.value) if fact.subject_id else (fact.event_id,)
        best.setdefault(key, Fact(**{**fact.__dict__, "score": score(fact)}))
    facts = list(best.values())[:limit]
    found = ", ".join(m.name for m in reading.entities) or "no known entity"
    note = (f"No model is configured, so no model wrote a summary: these are the facts that answer the question "
            f"best, ranked by retrieval. Read: {found}"
            + (f"; period {reading.period.said} ({start:%Y-%m-%d} to {end:%Y-%m-%d})" if reading.period else "; no period")
            + (f"; {'; '.join(reading.notes)}" if reading.notes else "") + ".")
    return Answer(question, financial.answer if financial else None, plan, calls, facts, note)
