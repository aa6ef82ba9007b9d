"""Scripted answers to Graphiti's structured outputs, shaped like a real model's, for the
side-by-side benchmark (benchmarks/bench_graphiti.py).

`GraphitiResponder` reads each Graphiti prompt the way a model would (the current message, the
previous messages, the entity list, the facts to compare) and answers with what tkg's offline
rules find in that text, so Graphiti gets the entities, facts, duplicates and contradictions a
model would give it and does all the work those cause:

- **Entities** of a message: the speaker first (Graphiti's prompt asks for it), the speaker's
  organisation, the company the call is about when a fact names it, the subjects and objects of
  the offline extractor's triplets, and proper nouns of the message's statements (products,
  partners, customers), at most `MAX_PROPER_NOUNS_PER_STATEMENT` per statement.
- **Facts** (edges): the speaker's offices from the message header ('Lisa Su is CEO of ...'),
  one edge per offline triplet with the statement as the fact, and for statements without a
  triplet an edge from the company (or the speaker) to each proper noun the statement names.
  Validity dates are the offline extractor's (`valid_at` null for ATEMPORAL statements, as the
  prompt asks when no time is stated).
- **Node duplicates**: an entity is a duplicate of a candidate with the same normalised name
  (`tkg.core.names.organisation_key`, or the name without middle initials: 'Lisa T. Su' = 'Lisa Su')
  or of the same configured company ('AMD' and 'Advanced Micro Devices, Inc.').
- **Edge duplicates and contradictions**: a candidate is a duplicate when it states the same
  triplets (or the same text); it is contradicted when an earlier call said it and tkg's
  `RuleJudge` says the new fact retires it (a newer, different holder of a functional office; a
  newer, different value for the same metric and period). Both sides of the benchmark are
  judged by the same rules.
- **Summaries**: the entity's existing summary plus the current message's sentences naming it.

`BenchResponder` serves both sides from one provider process: tkg's schemas go to
`PipelineResponder`, Graphiti's to `GraphitiResponder`, and it keeps a per-schema tally
(requests, tokens, first and last answer time) that the benchmark reads and resets with two
control requests (`schema_name` `ResponderTally` / `ResponderReset`).
"""

from __future__ import annotations

import ast
import json
import re
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache

import numpy as np

from fakes.openai_server import ParsedRequest, approx_tokens
from tkg.core.companies import Company, load_companies
from tkg.core.embeddings import WordLlamaEmbedder
from tkg.core.models import Chunk, RawStatement, StatementType, TemporalType
from tkg.core.names import company_for_name, organisation_key
from tkg.core.roles import parse_offices
from tkg.extract.base import DocumentContext, split_sentences
from tkg.extract.offline import OfflineExtractor
from tkg.invalidate.judges import EventView, RuleJudge, TripletView

GRAPHITI_SCHEMAS = frozenset({"ExtractedEntities", "ExtractedEdges", "CombinedExtraction", "EdgeTimestamps",
                              "BatchEdgeTimestamps", "EdgeDuplicate", "NodeResolutions", "SummarizedEntities"})
TKG_BATCH_SCHEMAS = frozenset({"ValidityOut", "TripletsOut", "FiguresOut"})
MAX_PROPER_NOUNS_PER_STATEMENT = 3
MAX_FACTS_PER_MESSAGE = 30
MAX_SUMMARY_CHARS = 1000  # graphiti_core.utils.text_utils.MAX_SUMMARY_CHARS

_HEADER = re.compile(r"^(?P<speaker>[^():\n]{1,80}?)(?: \((?P<about>[^)\n]*)\))?: (?P<body>.*)$", re.DOTALL)
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})?")
# Capitalised phrases ('Radeon Instinct', 'Microsoft', 'EPYC'); the words below start sentences
# or name periods, and are not entities.
_PROPER = re.compile(r"\b[A-Z][\w&+.-]*[A-Za-z0-9+](?:\s+(?:[A-Z0-9][\w&+.-]*[A-Za-z0-9+]|&))*")
_NOT_ENTITIES = frozenset("""
I I'm I've I'd I'll We We're We've Our Us You Your They Their It It's Its This That These Those There Here The A An And But Or So
If In On At For With As Of To From By Also Then Now Yes No Well Thank Thanks Okay OK Good Great Sure Hi Hello Let Let's What
When Where Which Who Why How Just First Second Third Finally Overall Again Operator Q1 Q2 Q3 Q4 FY GAAP Non-GAAP
January February March April May June July August September October November December Monday Tuesday Wednesday
Thursday Friday Saturday Sunday Quarter Year Fiscal Company Question Questions Analyst Okay CEO CFO COO CTO EPS
President Vice Chief Executive Officer Financial Corporate Senior Participants Treasurer Director Chairman
""".split())
_RELATION_CUES = (
    (re.compile(r"\b(?:launch|introduc|unveil|releas)", re.I), "LAUNCHED"),
    (re.compile(r"\bship", re.I), "SHIPS"),
    (re.compile(r"\b(?:partner|collaborat|work(?:ing|ed)? (?:closely )?with)", re.I), "PARTNERS_WITH"),
    (re.compile(r"\b(?:customer|adopt|deploy|select|chose)", re.I), "HAS_CUSTOMER"),
    (re.compile(r"\b(?:grew|growth|increas|rose|up \d|record)", re.I), "REPORTED_GROWTH_IN"),
    (re.compile(r"\b(?:declin|decreas|fell|down \d|lower)", re.I), "REPORTED_DECLINE_IN"),
    (re.compile(r"\b(?:expect|will|plan|intend|on track|guid)", re.I), "PLANS_FOR"),
    (re.compile(r"\b(?:invest(?:s|ed|ing|ment)?\b|acquir|acquisition)", re.I), "INVESTS_IN"),
    (re.compile(r"\b(?:compet|versus|vs\.?)\b", re.I), "COMPETES_WITH"),
)


def _between(text: str, start_tag: str, end_tag: str) -> str | None:
    start = text.find(start_tag)
    if start < 0:
        return None
    end = text.find(end_tag, start + len(start_tag))
    return text[start + len(start_tag): end if end >= 0 else len(text)].strip("\n")


def _json_between(text: str, start_tag: str, end_tag: str):
    block = _between(text, start_tag, end_tag)
    if block is None or not block.strip():
        return None
    try:
        return json.loads(block)
    except ValueError:
        return ast.literal_eval(block)  # dedupe_edges renders Python lists


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if value else None


def _name_key(name: str) -> str:
    return " ".join(name.lower().split())


def _entity_key(name: str) -> str:
    """A name without middle initials: 'Lisa T. Su' and 'Lisa Su' are one person."""
    return _name_key(re.sub(r"(?<=\w)\s+[A-Z]\.(?=\s+\w)", "", name))


def _views(triplets) -> tuple[TripletView, ...]:
    """tkg's triplets as the judge sees them, with entity keys standing in for canonical ids."""
    return tuple(TripletView(subject=t.subject_name, subject_id=_entity_key(t.subject_name), predicate=t.predicate.value,
                             object=t.object_name, object_id=_entity_key(t.object_name) if t.object_id is not None else None,
                             value=t.value) for t in triplets)


@lru_cache(maxsize=1)
def _company_names() -> tuple[re.Pattern, dict[str, Company]]:
    """One pattern for every configured company's name, aliases and ticker."""
    by_name: dict[str, Company] = {}
    for company in load_companies().values():
        for name in (company.name, company.ticker, *company.aliases):
            by_name.setdefault(name.lower(), company)
    names = sorted(by_name, key=len, reverse=True)
    return re.compile(r"\b(?:" + "|".join(re.escape(n) for n in names) + r")\b", re.IGNORECASE), by_name


def companies_in(text: str) -> list[Company]:
    """Configured companies a text names, in order of first mention."""
    pattern, by_name = _company_names()
    found: list[Company] = []
    for match in pattern.finditer(text):
        company = by_name[match[0].lower()]
        if company not in found:
            found.append(company)
    return found


def call_context(company: Company, when: datetime) -> DocumentContext:
    """The document context of `company`'s call held at `when`: it reports the last fiscal quarter
    that ended before the call."""
    year, quarter = when.year + 1, 4
    while True:
        start, end = company.fiscal_period(quarter, year)
        if end < when.date():
            break
        year, quarter = (year, quarter - 1) if quarter > 1 else (year - 1, 4)
    return DocumentContext(
        ticker=company.ticker, main_entity=company.name,
        short_name=company.aliases[0] if company.aliases else company.name,
        document_type="Earnings Call Transcript", publication_date=when, fiscal_quarter=f"Q{quarter} {year}",
        fiscal_period_start=start, fiscal_period_end=end, fiscal_year_end_month=company.fiscal_year_end_month)


@dataclass(frozen=True)
class Fact:
    source: str
    target: str
    relation: str
    fact: str
    valid_at: datetime | None
    invalid_at: datetime | None
    triplets: tuple[TripletView, ...] = ()


@dataclass
class Reading:
    """What a model takes from one message: its entities and its facts."""

    entities: list[str] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)


@dataclass
class _FactRecord:
    """A fact this responder wrote: its triplets, the dates its first reading gave it, the
    earliest and latest of those dates, and when it was first and last said."""

    triplets: tuple[TripletView, ...]
    valid_at: datetime | None
    invalid_at: datetime | None
    first_valid_at: datetime | None
    last_valid_at: datetime | None
    first_said: datetime
    last_said: datetime


class GraphitiResponder:
    """Answers Graphiti 0.31's schemas by name; thread-safe. See the module docstring."""

    def __init__(self, embedder: WordLlamaEmbedder | None = None) -> None:
        self.rules = OfflineExtractor()
        self.judge = RuleJudge()
        self.embedder = embedder or WordLlamaEmbedder()
        self.decisions: Counter = Counter()  # merges, contradictions, ... as answered
        self._readings: dict[str, Reading] = {}
        self._facts: dict[str, _FactRecord] = {}
        self._last_when: datetime | None = None
        self._lock = threading.RLock()

    def __call__(self, request: ParsedRequest) -> dict:
        handler = {
            "ExtractedEntities": self.entities, "ExtractedEdges": self.edges, "CombinedExtraction": self.combined,
            "EdgeTimestamps": self.timestamps, "BatchEdgeTimestamps": self.batch_timestamps,
            "EdgeDuplicate": self.edge_duplicates, "NodeResolutions": self.node_duplicates,
            "SummarizedEntities": self.summaries,
        }.get(request.schema_name or "")
        if handler is None:
            raise ValueError(f"no scripted Graphiti answer for schema {request.schema_name!r}")
        return handler(request.input_text)

    def embed(self, texts: list[str], dimensions: int) -> np.ndarray:
        """wordllama's vectors, zero-padded to the size asked for: cosines are wordllama's."""
        vectors = self.embedder.embed(texts)
        if dimensions <= vectors.shape[1]:
            return vectors[:, :dimensions]
        return np.pad(vectors, ((0, 0), (0, dimensions - vectors.shape[1])))

    # -- reading a message ------------------------------------------------------------------------

    def read(self, message: str, context_text: str = "", when: datetime | None = None) -> Reading:
        """The entities and facts of one message ('Speaker (title, organisation): text'). The
        first reading of a message is kept, so node and edge extraction agree on names."""
        with self._lock:
            if message in self._readings:
                return self._readings[message]
            if when is not None:
                self._last_when = when
            when = when or self._last_when or datetime(2020, 1, 1, tzinfo=timezone.utc)
        reading = self._read(message, context_text, when)
        with self._lock:
            reading = self._readings.setdefault(message, reading)
            for fact in reading.facts:
                record = self._facts.get(fact.fact)
                if record is None:
                    self._facts[fact.fact] = _FactRecord(fact.triplets, fact.valid_at, fact.invalid_at, fact.valid_at,
                                                         fact.valid_at, when, when)
                    continue
                record.first_said, record.last_said = min(record.first_said, when), max(record.last_said, when)
                if fact.valid_at is not None:
                    record.first_valid_at = min(filter(None, (record.first_valid_at, fact.valid_at)))
                    record.last_valid_at = max(filter(None, (record.last_valid_at, fact.valid_at)))
        return reading

    def _read(self, message: str, context_text: str, when: datetime) -> Reading:
        header = _HEADER.match(message.strip())
        speaker, about, body = (header["speaker"].strip(), header["about"], header["body"]) if header else ("", None, message)
        title, organization = _split_about(about)
        own = company_for_name(organization) if organization else None
        mentioned = companies_in(body) or companies_in(context_text)
        company = own or (mentioned[0] if mentioned else None)
        reading = Reading()
        entities: dict[str, str] = {}

        def entity(name: str) -> str:
            return entities.setdefault(_name_key(name), name)

        if speaker:
            entity(speaker)
        if organization:
            entity(own.name if own else organization)
        context = call_context(company, when) if company else None
        for office in parse_offices(title, organization) if speaker and organization else []:
            org = own.name if own else (office.organization or organization)
            qualifier = f"{office.qualifier.lower()} " if office.qualifier else ""
            statement = RawStatement(statement=f"{speaker} is {qualifier}{office.role} {'of' if own else 'at'} {org.rstrip('.')}.",
                                     statement_type=StatementType.FACT, temporal_type=TemporalType.DYNAMIC)
            reading.facts.append(self._fact(speaker, entity(org), "HOLDS_ROLE", statement, context, when))
        if context is None or speaker == "Operator":
            reading.entities = list(entities.values())
            return reading
        chunk = Chunk(chunk_id="c", transcript_id="t", company=context.ticker, chunk_index=0, kind="speech", section="s",
                      speaker=speaker or None, start=0, end=len(body), text=body)
        statements = self.rules.extract_statements([chunk], context)[0]
        extractions = self.rules.extract_triplets(statements, context)
        ranges = self.rules.extract_validity(statements, context)
        for statement, extraction, validity in zip(statements, extractions, ranges):
            if len(reading.facts) >= MAX_FACTS_PER_MESSAGE:
                break
            views = _views(extraction.triplets)
            linked = {speaker, context.short_name, context.main_entity}
            for view in views:
                if view.object_id is None or _name_key(view.subject) == _name_key(view.object):
                    continue
                reading.facts.append(Fact(entity(view.subject), entity(view.object), view.predicate, statement.statement,
                                          validity.valid_at if validity else None, validity.invalid_at if validity else None,
                                          views))
                linked.update((view.subject, view.object))
            # other names the statement mentions ('... together with Dell and Lenovo')
            names = [name for name in self._proper_nouns(statement.statement, linked)
                     if not any(_name_key(name) in _name_key(known) for known in linked)]
            if not names:
                continue
            about_company = context.short_name in statement.statement or context.main_entity in statement.statement
            source = entity(context.main_entity) if about_company else speaker
            relation = next((name for pattern, name in _RELATION_CUES if pattern.search(statement.statement)), "MENTIONS")
            for name in names:
                reading.facts.append(Fact(source, entity(name), relation, statement.statement,
                                          validity.valid_at if validity else None, validity.invalid_at if validity else None))
        used = {_name_key(f.source) for f in reading.facts} | {_name_key(f.target) for f in reading.facts}
        # the speaker always comes first; other entities only when a fact uses them
        reading.entities = [name for key, name in entities.items() if key in used or name == speaker]
        return reading

    def _fact(self, source: str, target: str, relation: str, statement: RawStatement, context: DocumentContext | None,
              when: datetime) -> Fact:
        views: tuple[TripletView, ...] = ()
        if context is not None:
            views = _views(self.rules.extract_triplets([statement], context)[0].triplets)
        return Fact(source, target, relation, statement.statement, when, None, views)

    @staticmethod
    def _proper_nouns(sentence: str, exclude: set[str]) -> list[str]:
        excluded = {_name_key(name) for name in exclude if name}
        found: list[str] = []
        for match in _PROPER.finditer(sentence):
            words = match[0].split()
            if match.start() == 0 and not re.search(r"[A-Z0-9].*[A-Z0-9]", words[0]):
                words = words[1:]  # a capital that only starts the sentence ('Looking', 'Additionally')
            while words and words[0].rstrip("'s") in _NOT_ENTITIES:
                words = words[1:]
            while words and (words[-1] in _NOT_ENTITIES or words[-1] == "&"):
                words = words[:-1]
            name = " ".join(words).removesuffix("'s").rstrip(".")
            if len(name) < 2 or name in _NOT_ENTITIES or _name_key(name) in excluded or re.fullmatch(r"[\d.,%$]+", name):
                continue
            if _name_key(name) not in {_name_key(n) for n in found}:
                found.append(name)
            if len(found) >= MAX_PROPER_NOUNS_PER_STATEMENT:
                break
        return found

    def _message_and_time(self, text: str, current: tuple[str, str], previous: tuple[str, str]) -> tuple[str, str, datetime | None]:
        message = _between(text, *current) or ""
        previous_text = _between(text, *previous) or ""
        times = [t for t in (_parse_time(m) for m in _ISO.findall(previous_text)) if t]
        reference = _between(text, "<REFERENCE_TIME>", "</REFERENCE_TIME>")
        when = _parse_time(reference.split("#")[0]) if reference else None
        return message, previous_text, when or (max(times) if times else None)

    # -- extraction -------------------------------------------------------------------------------

    def entities(self, text: str) -> dict:
        message, previous, when = self._message_and_time(text, ("<CURRENT MESSAGE>", "</CURRENT MESSAGE>"),
                                                         ("<PREVIOUS MESSAGES>", "</PREVIOUS MESSAGES>"))
        reading = self.read(message, previous, when)
        return {"extracted_entities": [{"name": name, "entity_type_id": 0, "episode_indices": [0]} for name in reading.entities]}

    def edges(self, text: str) -> dict:
        message, previous, when = self._message_and_time(text, ("<CURRENT_MESSAGE>", "</CURRENT_MESSAGE>"),
                                                         ("<PREVIOUS_MESSAGES>", "</PREVIOUS_MESSAGES>"))
        reading = self.read(message, previous, when)
        listed = {_name_key(node["name"]) for node in _json_between(text, "<ENTITIES>", "</ENTITIES>") or []}
        return {"edges": [{"source_entity_name": f.source, "target_entity_name": f.target, "relation_type": f.relation,
                           "fact": f.fact, "valid_at": _iso(f.valid_at), "invalid_at": _iso(f.invalid_at),
                           "episode_indices": [0]}
                          for f in reading.facts if _name_key(f.source) in listed and _name_key(f.target) in listed]}

    def combined(self, text: str) -> dict:
        message, previous, when = self._message_and_time(text, ("<CURRENT MESSAGES>", "</CURRENT MESSAGES>"),
                                                         ("<PREVIOUS MESSAGES>", "</PREVIOUS MESSAGES>"))
        reading = self.read(message, previous, when)
        return {"extracted_entities": [{"name": name, "entity_type_id": 0} for name in reading.entities],
                "edges": [{"source_entity_name": f.source, "target_entity_name": f.target, "relation_type": f.relation,
                           "fact": f.fact, "episode_indices": [0]} for f in reading.facts]}

    def _dates(self, fact: str, reference: datetime | None) -> dict:
        with self._lock:
            record = self._facts.get(fact)
        if record is None:  # a fact this responder did not write: it holds from when it was said
            return {"valid_at": _iso(reference), "invalid_at": None}
        return {"valid_at": _iso(record.valid_at), "invalid_at": _iso(record.invalid_at)}

    def timestamps(self, text: str) -> dict:
        fact = (_between(text, "<FACT>", "</FACT>") or "").strip()
        reference = _parse_time((_between(text, "<REFERENCE TIME>", "</REFERENCE TIME>") or "").strip())
        return self._dates(fact, reference)

    def batch_timestamps(self, text: str) -> dict:
        facts = _json_between(text, "<FACTS>", "</FACTS>") or []
        return {"timestamps": [self._dates(item["fact"], _parse_time(item.get("reference_time"))) for item in facts]}

    # -- resolution -------------------------------------------------------------------------------

    def node_duplicates(self, text: str) -> dict:
        extracted = _json_between(text, "<ENTITIES>", "</ENTITIES>") or []
        existing = _json_between(text, "<EXISTING ENTITIES>", "</EXISTING ENTITIES>") or []
        resolutions = []
        for node in extracted:
            match = next((candidate for candidate in existing if _same_entity(node["name"], candidate["name"])), None)
            self.decisions["node_merged" if match else "node_new"] += 1
            resolutions.append({"id": node["id"], "name": node["name"],
                                "duplicate_candidate_id": match["candidate_id"] if match else -1})
        return {"entity_resolutions": resolutions}

    def edge_duplicates(self, text: str) -> dict:
        existing = _json_between(text, "<EXISTING FACTS>", "</EXISTING FACTS>") or []
        candidates = _json_between(text, "<FACT INVALIDATION CANDIDATES>", "</FACT INVALIDATION CANDIDATES>") or []
        new_fact = (_between(text, "<NEW FACT>", "</NEW FACT>") or "").strip()
        with self._lock:
            new = self._facts.get(new_fact)
            records = {item["fact"]: self._facts.get(item["fact"]) for item in [*existing, *candidates]}
        duplicates = [item["idx"] for item in existing
                      if _name_key(item["fact"]) == _name_key(new_fact)
                      or (new and new.triplets and (old := records[item["fact"]]) and _keys(old.triplets) == _keys(new.triplets))]
        contradicted = []
        if new is not None and new.triplets:
            secondary = _event(new.triplets, new.last_valid_at)
            for item in [*existing, *candidates]:
                old = records[item["fact"]]
                # only what an earlier call said: figures of one call that disagree are different measures
                if (old is not None and old.triplets and old.first_said.date() < new.last_said.date()
                        and self.judge._verdict(_event(old.triplets, old.first_valid_at), secondary).invalidates):
                    contradicted.append(item["idx"])
        self.decisions["edge_duplicate"] += bool(duplicates)
        self.decisions["edge_contradicts"] += len(contradicted)
        self.decisions["edge_judged"] += 1
        return {"duplicate_facts": duplicates[:1], "contradicted_facts": contradicted}

    def summaries(self, text: str) -> dict:
        entities = _json_between(text, "<ENTITIES>", "</ENTITIES>") or []
        messages = _between(text, "<MESSAGES>", "</MESSAGES>") or _between(text, "<EPISODES>", "</EPISODES>") or ""
        current = messages.rsplit("\n", 1)[-1]
        try:
            current = json.loads(current)
        except ValueError:
            pass
        sentences = [current[s:e] for s, e in split_sentences(current)] if isinstance(current, str) else []
        out = []
        for node in entities:
            name = node["name"]
            said = [s for s in sentences if name.lower() in s.lower()]
            if not said and not node.get("summary"):
                continue
            summary = " ".join([node.get("summary") or "", *said]).strip()
            out.append({"name": name, "summary": summary[: MAX_SUMMARY_CHARS - 1]})
        return {"summaries": out}


def _split_about(about: str | None) -> tuple[str | None, str | None]:
    """'President and CEO, Advanced Micro Devices, Inc.' -> (title, organisation): the organisation
    is the longest comma-separated tail that is a configured company, else the last part."""
    if not about:
        return None, None
    parts = [p.strip() for p in about.split(",")]
    for cut in range(1, len(parts)):
        tail = ", ".join(parts[cut:])
        if company_for_name(tail):
            return ", ".join(parts[:cut]) or None, tail
    if len(parts) == 1:
        return parts[0], None
    return ", ".join(parts[:-1]), parts[-1]


def _keys(triplets: tuple[TripletView, ...]) -> set[tuple]:
    return {(t.subject_id, t.predicate, t.object_id, t.value) for t in triplets}


def _same_entity(name: str, other: str) -> bool:
    if organisation_key(name) == organisation_key(other) or _entity_key(name) == _entity_key(other):
        return True
    company, other_company = company_for_name(name), company_for_name(other)
    return company is not None and company == other_company


def _event(triplets: tuple[TripletView, ...], valid_at: datetime | None) -> EventView:
    return EventView(event_id="x", statement="", statement_type="FACT", temporal_type="DYNAMIC", valid_at=valid_at,
                     invalid_at=None, created_at=valid_at or datetime.now(timezone.utc), triplets=triplets)


class BenchResponder:
    """tkg's schemas to `PipelineResponder`, Graphiti's to `GraphitiResponder`, with a per-schema
    tally of what the provider answered (see the module docstring)."""

    def __init__(self) -> None:
        from fakes.responders import PipelineResponder

        self.pipeline = PipelineResponder()
        self.graphiti = GraphitiResponder(self.pipeline.embedder)
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.tally: dict[str, Counter] = defaultdict(Counter)
        self.first_answer: float | None = None
        self.last_answer: float | None = None
        self.missing_items = 0
        self.graphiti.decisions.clear()

    def _note(self, key: str, input_tokens: int, output_tokens: int, items: int = 0) -> None:
        now = time.time()
        with self._lock:
            row = self.tally[key]
            row["requests"] += 1
            row["input_tokens"] += input_tokens
            row["output_tokens"] += output_tokens
            row["items"] += items
            self.first_answer = now if self.first_answer is None else min(self.first_answer, now)
            self.last_answer = now if self.last_answer is None else max(self.last_answer, now)

    def __call__(self, request: ParsedRequest) -> dict:
        name = request.schema_name or ""
        if name == "ResponderTally":
            with self._lock:
                return {"by_schema": {k: dict(v) for k, v in self.tally.items()}, "first_answer": self.first_answer,
                        "last_answer": self.last_answer, "missing_items": self.missing_items,
                        "graphiti_decisions": dict(self.graphiti.decisions)}
        if name == "ResponderReset":
            with self._lock:
                self._reset()
            return {"ok": True}
        answer = self.graphiti(request) if name in GRAPHITI_SCHEMAS else self.pipeline(request)
        items = 0
        if name in TKG_BATCH_SCHEMAS:  # every numbered statement asked for must be answered
            listed = request.input_text.rsplit("\nStatements:", 1)[-1]  # after the worked example
            asked = {int(i) for i in re.findall(r"^- \[(\d+)\]", listed, re.MULTILINE)}
            answered = {item["index"] for item in answer.get("items", [])}
            items = len(answered)
            with self._lock:
                self.missing_items += len(asked - answered)
        self._note(name, approx_tokens(request.rendered_prompt), approx_tokens(json.dumps(answer, ensure_ascii=False)), items)
        return answer

    def embed(self, texts: list[str], dimensions: int):
        self._note("embeddings", sum(approx_tokens(t) for t in texts), 0, len(texts))
        vectors = self.pipeline.embed(texts, dimensions)  # tkg's and the baseline's size: as in bench_llm
        return vectors if vectors is not None else self.graphiti.embed(texts, dimensions)
