"""The query layer: questions over a published `tkg.duckdb`, in plain Python.

It serves `tkg ask`/`facts`/`timeline`, the retrieval agent and library users alike:

    from tkg.answer.query import Graph
    with Graph.open() as graph:
        intel = graph.entity("Intel Corp")
        for fact in graph.factual_qa("Intel", "2017-06-01", "2017-06-30", predicate="HOLDS_ROLE").facts:
            print(fact.subject, fact.object, fact.statement)

The connection is read-only and runs with DuckDB's external access disabled, so no argument can
make it read or write another file; every value reaches SQL as a parameter.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, time, timezone
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
from rapidfuzz import fuzz, process

from tkg.core.embeddings import WordLlamaEmbedder
from tkg.core.models import PREDICATE_DEFINITIONS, Predicate
from tkg.core.names import fold, organisation_key
from tkg.providers import open_embedder
from tkg.resolve.resolution import parse_person, people_match
from tkg.settings import Settings

NEVER = datetime.max.replace(tzinfo=timezone.utc)
EVER = datetime.min.replace(tzinfo=timezone.utc)


class QueryError(ValueError):
    """A question the graph cannot take as asked; the message says what to change."""


class UnknownEntity(QueryError):
    def __init__(self, name: str, suggestions: list[EntityMatch]):
        self.name, self.suggestions = name, suggestions
        hint = f"; did you mean {', '.join(repr(s.name) for s in suggestions[:3])}?" if suggestions else ""
        super().__init__(f"no entity called {name!r} in the graph{hint}")


class AmbiguousEntity(QueryError):
    def __init__(self, name: str, candidates: list[EntityMatch]):
        self.name, self.candidates = name, candidates
        listed = "; ".join(f"{c.name} ({c.type}, {c.canonical_id}, {c.mentions} mentions)" for c in candidates[:5])
        super().__init__(f"{name!r} could mean several entities: {listed}. Name one of them, or pass its id")


def _jsonable(record: Any) -> dict[str, Any]:
    """A dataclass as a dict with dates as ISO strings, for --json output and the agent."""
    return {key: (value.isoformat() if isinstance(value, (date, datetime)) else value) for key, value in asdict(record).items()}


@dataclass(frozen=True)
class EntityMatch:
    """One candidate for a name: how it matched ('id', 'name', 'alias', 'person', 'organisation'
    or 'fuzzy') and a score out of 100."""

    canonical_id: str
    name: str
    type: str
    matched: str
    how: str
    score: float
    mentions: int


@dataclass(frozen=True)
class PredicateChoice:
    """The vocabulary predicate a requested one was mapped to, and how sure the mapping is."""

    asked: str
    predicate: str
    exact: bool
    score: float


@dataclass(frozen=True)
class Fact:
    """A fact with its evidence: the event, its call and the statement that asserts it."""

    event_id: str
    company: str
    call_date: date
    subject: str
    predicate: str
    object: str | None
    value: str | None
    statement: str
    valid_at: datetime | None
    invalid_at: datetime | None
    invalidated_by: str | None = None
    subject_id: str | None = None
    object_id: str | None = None
    restatements: int = 1
    score: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(self)


@dataclass
class FactsAnswer:
    entity: EntityMatch
    facts: list[Fact]
    start: datetime | None
    end: datetime | None
    predicate: PredicateChoice | None = None
    history: bool = False


@dataclass(frozen=True)
class TimelineEntry:
    """One fact over one continuous period, restatements merged."""

    subject: str
    predicate: str
    object: str | None
    value: str | None
    company: str
    began_at: datetime | None
    ended_at: datetime | None
    last_restated_on: date
    restatements: int
    retired_by: str | None
    retired_by_statement: str | None
    first_event_id: str
    first_statement: str

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(self)


@dataclass
class Trend:
    """Facts grouped per company and fiscal quarter, oldest first."""

    topic: str
    groups: dict[tuple[str, str], list[Fact]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic,
                "groups": [{"company": company, "quarter": quarter, "facts": [f.as_dict() for f in facts]}
                           for (company, quarter), facts in self.groups.items()]}


def utc(value: str | date | datetime | None, end_of_day: bool = False) -> datetime | None:
    """A timestamp in UTC: aware values are converted, naive ones and dates are read as UTC.
    A date (or a date-only string) stands for its first moment, or its last with `end_of_day`."""
    if value is None or isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime.combine(value, time.max if end_of_day else time.min)
    else:
        text = str(value).strip()
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise QueryError(f"{text!r} is not a date; write it as YYYY-MM-DD or an ISO timestamp") from None
        if len(text) == 10 and end_of_day:
            moment = datetime.combine(moment.date(), time.max)
    if moment is None:
        return None
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def window(start: Any, end: Any) -> tuple[datetime | None, datetime | None]:
    begin, finish = utc(start), utc(end, end_of_day=True)
    if begin is not None and finish is not None and begin > finish:
        raise QueryError(f"the window starts ({begin:%Y-%m-%d}) after it ends ({finish:%Y-%m-%d}); swap the dates")
    return begin, finish


# Words that point at a predicate, for questions that do not name one.
PREDICATE_CUES = {
    "HOLDS_ROLE": ("who", "ceo", "cfo", "coo", "cto", "president", "chairman", "chief", "officer", "executive", "head", "role",
                   "roles", "title", "position", "works", "ran", "runs", "appointed", "succeeded"),
    "HAS_REVENUE": ("revenue", "revenues", "sales"),
    "TARGETS": ("guidance", "guide", "guided", "expect", "expected", "outlook", "forecast", "target", "targets"),
    "LAUNCHED": ("launch", "launched", "introduce", "introduced", "release", "released"),
    "INVESTS_IN": ("invest", "invested", "investment", "acquire", "acquired", "acquisition"),
    "COLLABORATES_WITH": ("partner", "partners", "partnered", "partnership", "collaborate", "collaborates", "collaboration"),
    "INCREASED": ("increase", "increased", "grew", "growth", "rose", "up"),
    "DECREASED": ("decrease", "decreased", "declined", "decline", "fell", "down"),
}

def closest_predicate(name: str) -> PredicateChoice:
    """The vocabulary predicate closest to `name` ('holds role', 'revenue', 'WORKS_AS')."""
    asked = name.strip()
    key = fold(asked).replace(" ", "_").upper()
    if key in Predicate.__members__:
        return PredicateChoice(asked, key, True, 100.0)
    cued = [predicate for predicate, cues in PREDICATE_CUES.items() if set(fold(asked).split()) & set(cues)]
    if len(cued) == 1:
        return PredicateChoice(asked, cued[0], False, 100.0)
    # compare with the names and with what each predicate means
    choices = {p.value: f"{p.value.replace('_', ' ').lower()} {PREDICATE_DEFINITIONS[p].lower()}" for p in Predicate}
    best = process.extractOne(fold(asked), {p: p.replace("_", " ").lower() for p in choices}, scorer=fuzz.WRatio)
    meaning = process.extractOne(fold(asked), choices, scorer=fuzz.token_set_ratio)
    pick = best if best[1] >= meaning[1] else meaning
    return PredicateChoice(asked, pick[2], False, round(float(pick[1]), 1))


# Facts about an entity: as subject or object, and for a company the offices held at it
# ("CFO of Intel Corporation" is an entity of its own). Parameters $id and $name.
_ABOUT_ENTITY = ("(subject_id = $id OR object_id = $id "
                 "OR (predicate = 'HOLDS_ROLE' AND regexp_extract(object, '^.* of (.*)$', 1) = $name))")
_FACT_COLUMNS = ("event_id, company, call_date, subject, predicate, object, value, statement, valid_at, invalid_at, "
                 "invalidated_by, subject_id, object_id")


class Graph:
    """A read-only view of one published `tkg.duckdb`."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, path: Path):
        self.connection = connection
        self.path = path
        self._aliases: list[tuple[str, str, str, str, int]] | None = None
        self._embedder: Any = None
        self._vectors: dict[str, list[float]] = {}  # a question is searched and ranked with one vector

    @classmethod
    def open(cls, path: str | Path | None = None) -> Graph:
        """The published file at `path`, else the one the settings name (TKG_DUCKDB, TKG_HOME)."""
        path = Path(path) if path is not None else Settings.resolve().warehouse
        if not path.exists():
            raise QueryError(f"{path} does not exist; run `tkg build` first (or point TKG_HOME at a built graph)")
        config = {"enable_external_access": False, "autoinstall_known_extensions": False,
                  "autoload_known_extensions": False, "lock_configuration": True}
        try:
            connection = duckdb.connect(str(path), read_only=True, config=config)
        except duckdb.Error as error:
            raise QueryError(f"cannot open {path} read-only: {error}") from error
        return cls(connection, path)

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.connection.close()

    def rows(self, sql: str, parameters: dict[str, Any] | list[Any] | None = None) -> list[dict[str, Any]]:
        """Rows of a parameterised query, as dicts."""
        cursor = self.connection.execute(sql, parameters or [])
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]

    # --- entities ------------------------------------------------------------------------------

    def _alias_rows(self) -> list[tuple[str, str, str, str, int]]:
        if self._aliases is None:
            self._aliases = self.connection.execute(
                "SELECT a.alias, a.type, a.canonical_id, a.canonical_name, coalesce(c.mention_count, 0) "
                "FROM entity_aliases AS a JOIN canonical_entities AS c USING (canonical_id) "
                "ORDER BY a.canonical_id, a.alias").fetchall()
        return self._aliases

    def find_entity(self, name: str, limit: int = 5) -> list[EntityMatch]:
        """Entities a name may mean, best first: its id, its canonical name, a known alias or
        ticker, the same person ('Bob Swan' = 'Robert H. Swan') or company ('Intel Corp'), then
        fuzzy matches. One match per entity, with the best way it matched."""
        text = " ".join(str(name).split())
        if not text:
            raise QueryError("an entity name is empty; give a person, company, product or metric")
        folded = fold(text)
        rows = self._alias_rows()
        best: dict[str, EntityMatch] = {}

        def offer(row: tuple[str, str, str, str, int], how: str, score: float) -> None:
            alias, kind, canonical_id, canonical_name, mentions = row
            current = best.get(canonical_id)
            if current is None or score > current.score:
                best[canonical_id] = EntityMatch(canonical_id, canonical_name, kind, alias, how, round(score, 1), mentions)

        person = parse_person(text) if len(text.split()) >= 2 else None
        company_key = organisation_key(text)
        for row in rows:
            alias, kind, canonical_id, canonical_name, _ = row
            if text == canonical_id:
                offer(row, "id", 100.0)
            elif folded == fold(canonical_name):
                offer(row, "name", 99.0)
            elif folded == fold(alias):
                offer(row, "alias", 97.0)
            elif kind == "Organization" and company_key and company_key == organisation_key(alias):
                offer(row, "organisation", 95.0)
            elif kind == "Person" and person is not None and (other := parse_person(alias)) is not None \
                    and people_match(person, other):
                offer(row, "person", 93.0)
        if not best:
            folded_aliases = [fold(row[0]) for row in rows]
            for _, score, index in process.extract(folded, folded_aliases, scorer=fuzz.WRatio, score_cutoff=80, limit=25):
                offer(rows[index], "fuzzy", float(score) * 0.9)
        return sorted(best.values(), key=lambda m: (-m.score, -m.mentions, m.canonical_id))[:limit]

    def entity(self, name: str) -> EntityMatch:
        """The one entity a name means, or UnknownEntity / AmbiguousEntity saying why not."""
        matches = self.find_entity(name, limit=8)
        if not matches or matches[0].how == "fuzzy" and matches[0].score < 80:
            raise UnknownEntity(name, matches)
        top = matches[0]
        rivals = [m for m in matches[1:] if m.score == top.score]
        # equally good matches: the much more mentioned one wins, otherwise the name is ambiguous
        if rivals and (top.how == "fuzzy" or any(m.mentions * 3 > top.mentions for m in rivals)):
            raise AmbiguousEntity(name, [top, *rivals])
        return top

    def _entity(self, entity: str | EntityMatch) -> EntityMatch:
        return entity if isinstance(entity, EntityMatch) else self.entity(entity)

    # --- facts ---------------------------------------------------------------------------------

    def factual_qa(self, entity: str | EntityMatch, start: Any = None, end: Any = None, predicate: str | None = None,
                   history: bool = False, limit: int | None = None) -> FactsAnswer:
        """Facts about an entity, as subject or object (for a company, also the offices held at
        it), that were valid at some point inside [start, end]: one row per fact, its latest
        restatement inside the window. Facts that ended inside the window (retired by a newer
        statement, or ended as they said) are left out unless `history` is set."""
        match = self._entity(entity)
        begin, finish = window(start, end)
        choice = closest_predicate(predicate) if predicate else None
        rows = self._facts_rows(match, begin, finish, choice, history)
        facts = [Fact(**row) for row in rows]
        return FactsAnswer(match, facts[:limit] if limit else facts, begin, finish, choice, history)

    def _facts_rows(self, match: EntityMatch, begin: datetime | None, finish: datetime | None,
                    choice: PredicateChoice | None, history: bool) -> list[dict[str, Any]]:
        parameters = {"id": match.canonical_id, "name": match.name, "predicate": choice.predicate if choice else None,
                      "start": begin or EVER, "end": finish or NEVER, "history": history}
        return self.rows(
            f"""
            SELECT {_FACT_COLUMNS},
                   count(*) OVER (PARTITION BY subject_id, predicate, object_id, value) AS restatements
            FROM facts
            WHERE {_ABOUT_ENTITY}
              AND ($predicate IS NULL OR predicate = $predicate)
              AND coalesce(valid_at, call_date::TIMESTAMPTZ) <= $end
              AND (invalid_at IS NULL OR invalid_at > $start)
              AND ($history OR invalid_at IS NULL OR invalid_at > $end)
            QUALIFY row_number() OVER (PARTITION BY subject_id, predicate, object_id, value
                                       ORDER BY call_date DESC, event_id) = 1
            ORDER BY coalesce(valid_at, call_date::TIMESTAMPTZ) DESC, predicate, subject, object
            """,
            parameters,
        )

    def timeline(self, entity: str | EntityMatch, predicate: str | None = None) -> tuple[EntityMatch, list[TimelineEntry], PredicateChoice | None]:
        """The entity's facts, one row per fact and continuous period, oldest first."""
        match = self._entity(entity)
        choice = closest_predicate(predicate) if predicate else None
        rows = self._timeline_rows(match, choice)
        return match, [TimelineEntry(**row) for row in rows], choice

    def _timeline_rows(self, match: EntityMatch, choice: PredicateChoice | None) -> list[dict[str, Any]]:
        return self.rows(
            f"""
            SELECT subject, predicate, object, value, company, began_at, ended_at, last_restated_on, restatements,
                   retired_by, retired_by_statement, first_event_id, first_statement
            FROM fact_history
            WHERE {_ABOUT_ENTITY}
              AND ($predicate IS NULL OR predicate = $predicate)
            ORDER BY began_at, predicate, subject, object
            """,
            {"id": match.canonical_id, "name": match.name, "predicate": choice.predicate if choice else None},
        )

    # --- semantic search and trends ------------------------------------------------------------

    @property
    def embedder(self) -> Any:
        """The model the graph's statement vectors come from (raw.build_info), so questions are
        embedded in the same space: wordllama offline, the configured embeddings API otherwise."""
        if self._embedder is None:
            row = self.connection.execute("SELECT value FROM raw.build_info WHERE key = 'embedder'").fetchone()
            built_with = row[0] if row else None
            local = WordLlamaEmbedder()
            if built_with is None or built_with == local.name:
                self._embedder = local
            else:
                settings = Settings.resolve(home=self.path.parent, embeddings="openai")
                if settings.embedder_name() != built_with:
                    raise QueryError(f"the graph's statements were embedded with {built_with}, but the configured embeddings "
                                     f"are {settings.embedder_name()}; set TKG_EMBEDDING_MODEL/TKG_EMBEDDING_DIMENSIONS to match")
                self._embedder = open_embedder(settings)
        return self._embedder

    def embed(self, text: str) -> list[float]:
        if text in self._vectors:
            return self._vectors[text]
        embedder = self.embedder
        try:
            vector = np.asarray(embedder.embed([text]), dtype=np.float32)[0]
        except Exception as error:  # noqa: BLE001 - an unreachable or unconfigured embeddings API
            raise QueryError(f"cannot embed the question with {getattr(embedder, 'name', 'the embedder')}: {error}") from error
        self._vectors[text] = [float(x) for x in vector]
        return self._vectors[text]

    def company_ticker(self, company: str | None) -> str | None:
        """A ticker for a company given as a ticker or a name ('AMD', 'Intel Corp')."""
        if company is None:
            return None
        from tkg.core.names import company_for_name

        found = company_for_name(company)
        if found is None:
            raise QueryError(f"{company!r} is not a configured company; use a ticker such as INTC or AMD")
        return found.ticker

    def search(self, text: str, k: int = 10, as_of: Any = None, company: str | None = None) -> list[Fact]:
        """The k statements closest in meaning to `text`, each with its first triplet if it has
        one: for questions that name no predicate. `as_of` keeps statements valid then."""
        if not str(text).strip():
            raise QueryError("the search text is empty")
        if not 1 <= int(k) <= 1000:
            raise QueryError(f"k must be between 1 and 1000, got {k}")
        moment = utc(as_of, end_of_day=True)
        return [Fact(**row) for row in self.rows(
            """
            WITH first_triplet AS (
                SELECT * FROM triplets QUALIFY row_number() OVER (PARTITION BY event_id ORDER BY triplet_id) = 1
            )
            SELECT e.event_id, e.company, tr.call_date, coalesce(t.subject, '') AS subject,
                   coalesce(t.predicate, '') AS predicate, t.object, t.value, e.statement, e.valid_at, e.invalid_at,
                   e.invalidated_by, t.subject_id, t.object_id,
                   round(list_cosine_similarity(e.embedding, $vector::FLOAT[]), 4) AS score
            FROM events AS e
            JOIN transcripts AS tr ON tr.transcript_id = e.transcript_id
            LEFT JOIN first_triplet AS t ON t.event_id = e.event_id
            WHERE ($company IS NULL OR e.company = $company)
              AND ($as_of IS NULL OR (coalesce(e.valid_at, tr.call_date::TIMESTAMPTZ) <= $as_of
                                      AND (e.invalid_at IS NULL OR e.invalid_at > $as_of)))
              AND len(e.embedding) = len($vector::FLOAT[])
            ORDER BY score DESC, e.event_id
            LIMIT $k
            """,
            {"vector": self.embed(text), "company": self.company_ticker(company), "as_of": moment, "k": int(k)},
        )]

    def similarity(self, text: str, event_ids: list[str]) -> dict[str, float]:
        """How close each event's statement is to `text` in meaning (cosine, -1..1)."""
        if not event_ids:
            return {}
        rows = self.rows("SELECT event_id, list_cosine_similarity(embedding, $vector::FLOAT[]) AS score FROM raw.events "
                         "WHERE event_id IN (SELECT unnest($ids::VARCHAR[])) AND len(embedding) = len($vector::FLOAT[])",
                         {"vector": self.embed(text), "ids": list(event_ids)})
        return {row["event_id"]: float(row["score"]) for row in rows if row["score"] is not None
                and not math.isnan(row["score"])}

    def trend_analysis(self, question: str, companies: list[str] | None, start: Any, end: Any, topic: str,
                       per_company: int = 40, min_score: float = 0.3) -> Trend:
        """Facts on `topic` grouped per company and fiscal quarter, oldest first, within the
        window. Describing how they changed is left to a model (the agent's answer)."""
        begin, finish = window(start, end)
        tickers = [self.company_ticker(c) for c in companies] if companies else [
            row["company"] for row in self.rows("SELECT DISTINCT company FROM transcripts ORDER BY 1")]
        trend = Trend(topic=topic)
        vector = self.embed(f"{topic} {question}".strip())
        for ticker in tickers:
            rows = self.rows(
                f"""
                SELECT {", ".join(f"f.{c.strip()}" for c in _FACT_COLUMNS.split(","))}, tr.fiscal_quarter,
                       round(list_cosine_similarity(e.embedding, $vector::FLOAT[]), 4) AS score
                FROM facts AS f
                JOIN raw.events AS e USING (event_id)
                JOIN transcripts AS tr ON tr.transcript_id = f.transcript_id
                WHERE f.company = $company AND f.call_date::TIMESTAMPTZ BETWEEN $start AND $end
                  AND len(e.embedding) = len($vector::FLOAT[])
                QUALIFY row_number() OVER (PARTITION BY f.event_id ORDER BY f.triplet_id) = 1
                ORDER BY score DESC LIMIT $limit
                """,
                {"vector": vector, "company": ticker, "start": begin or EVER, "end": finish or NEVER, "limit": per_company},
            )
            for row in sorted((r for r in rows if r["score"] is not None and r["score"] >= min_score),
                              key=lambda r: (r["call_date"], -r["score"])):
                quarter = row.pop("fiscal_quarter") or str(row["call_date"])
                trend.groups.setdefault((ticker, quarter), []).append(Fact(**row))
        return trend

    # --- financial figures (the `metrics` view) ---------------------------------------------------

    def coverage(self, ticker: str) -> tuple[int, date | None, date | None]:
        """How many calls of a company the graph holds, and the first and last call dates."""
        row = self.rows("SELECT count(*) AS calls, min(call_date) AS first, max(call_date) AS last FROM transcripts "
                        "WHERE company = $company", {"company": ticker})[0]
        return int(row["calls"]), row["first"], row["last"]

    def metrics(self, company: str, metric: str | None = None, fiscal_year: int | None = None,
                fiscal_quarter: int | None = None, full_year: bool = False, kind: str | None = None,
                segment: str | None = None, basis: str | None = None, as_of: Any = None) -> list[Figure]:
        """Figures of one company from `metrics`, oldest call first: reported results and guidance
        with their revisions. `full_year` asks for the fiscal year's own figures (no quarter);
        `as_of` keeps the figures valid then (`metrics_as_of`): what had been reported and the
        guidance that stood. Segment NULL is the company total; basis NULL matches any basis."""
        ticker = self.company_ticker(company)
        if metric is not None and metric not in METRIC_NAMES:
            raise QueryError(f"{metric!r} is not a metric; the metrics are {', '.join(METRIC_NAMES)}")
        if kind is not None and kind not in ("reported", "guidance"):
            raise QueryError(f"kind must be 'reported' or 'guidance', got {kind!r}")
        if fiscal_quarter is not None and not 1 <= int(fiscal_quarter) <= 4:
            raise QueryError(f"fiscal_quarter must be 1..4, got {fiscal_quarter}")
        moment = utc(as_of, end_of_day=False)
        source = "metrics_as_of($as_of)" if moment is not None else "metrics"
        parameters = {"company": ticker, "metric": metric, "year": fiscal_year, "quarter": fiscal_quarter,
                      "full_year": bool(full_year), "kind": kind, "segment": segment, "basis": basis}
        if moment is not None:
            parameters["as_of"] = moment
        return [Figure(**row) for row in self.rows(
            f"""
            SELECT company, metric, segment, basis, kind, fiscal_year, fiscal_quarter, value, low, high, unit,
                   amount_text, statement, event_id, call_date, valid_at, invalid_at, invalidated_by, revision,
                   restatements, last_stated_on
            FROM {source}
            WHERE company = $company
              AND ($metric IS NULL OR metric = $metric)
              AND ($year IS NULL OR fiscal_year = $year)
              AND ($quarter IS NULL OR fiscal_quarter = $quarter)
              AND (NOT $full_year OR fiscal_quarter IS NULL)
              AND ($kind IS NULL OR kind = $kind)
              AND segment IS NOT DISTINCT FROM $segment
              AND ($basis IS NULL OR basis IS NULL OR basis = $basis)
            ORDER BY call_date, kind, metric, basis NULLS FIRST, value, event_id
            """, parameters)]

    def office_holders(self, ticker: str, role: str, start: Any = None, end: Any = None) -> list[dict[str, Any]]:
        """Who held an office at a company at some time in [start, end], in order of start: one row
        per person and continuous tenure (`officer_tenures`)."""
        begin, finish = window(start, end)
        return self.rows(
            """
            SELECT person, role, organization, title, started_at, ended_at, first_event_id AS event_id, first_statement AS statement,
                   restatements
            FROM officer_tenures
            WHERE company = $company AND (upper(role) = upper($role) OR upper(title) = upper($role))
              AND coalesce(started_at, '-infinity'::TIMESTAMPTZ) <= $end
              AND (ended_at IS NULL OR ended_at > $start)
            ORDER BY started_at NULLS FIRST, person
            """, {"company": ticker, "role": role, "start": begin or EVER, "end": finish or NEVER})


METRIC_NAMES = ("revenue", "segment_revenue", "gross_margin", "operating_margin", "operating_income", "operating_expenses",
                "net_income", "eps", "capex", "free_cash_flow", "revenue_growth")


@dataclass(frozen=True)
class Figure:
    """One row of `metrics`: a reported or guided figure with its evidence and revision."""

    company: str
    metric: str
    segment: str | None
    basis: str | None
    kind: str
    fiscal_year: int
    fiscal_quarter: int | None
    value: float
    low: float | None
    high: float | None
    unit: str
    amount_text: str | None
    statement: str
    event_id: str
    call_date: date
    valid_at: datetime | None
    invalid_at: datetime | None
    invalidated_by: str | None
    revision: str | None
    restatements: int = 1  # calls that stated this same guidance, the first included
    last_stated_on: date | None = None

    @property
    def period(self) -> str:
        return f"Q{self.fiscal_quarter} FY{self.fiscal_year}" if self.fiscal_quarter else f"FY{self.fiscal_year}"

    def amount(self) -> str:
        """'$50.6 billion', '$31.1 billion to $31.4 billion', '46%', '$0.75 to $0.77 per share'."""
        def one(number: float) -> str:
            if self.unit == "percent":
                return f"{number:g}%"
            sign, number = ("-" if number < 0 else ""), abs(number)
            symbol = "$" if self.unit.startswith("USD") else ""
            suffix = "" if symbol else f" {self.unit.split('/')[0]}"
            for scale, word in ((1e12, "trillion"), (1e9, "billion"), (1e6, "million")):
                if number >= scale:
                    return f"{sign}{symbol}{number / scale:.4g} {word}{suffix}"
            return f"{sign}{symbol}{number:.2f}{suffix}" if self.unit.endswith("/share") else f"{sign}{symbol}{number:g}{suffix}"
        text = f"{one(self.low)} to {one(self.high)}" if self.low is not None and self.high is not None else one(self.value)
        return text + (" per share" if self.unit.endswith("/share") else "")

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(self)
