"""Answering a question offline: read the entities, dates and fiscal periods it names, run the
query tools, and rank the facts that answer it. No model writes a summary; the facts are the
answer, best first, each with its evidence. `tkg.answer.agent` does the same with a model."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tkg.answer.query import PREDICATE_CUES, EntityMatch, Fact, Graph, QueryError
from tkg.answer.financial import answer_financial
from tkg.answer.questions import ROLES, Period, read_period
from tkg.core.names import company_for_name, fold

STOPWORDS = frozenset("what who whom which when where how did does do was were is are the a an of in on at as to for by "
                      "and or its it their about report reported say said expect".split())


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
