"""The explorer's web application (Starlette): one GET route per view, each a plain URL.

Every value from the URL reaches DuckDB as a parameter; dates are parsed before any query;
an unknown id or a malformed value is a 4xx page saying what to change, never a traceback.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import date, datetime, time, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tkg.answer.query import _ABOUT_ENTITY, EntityMatch, QueryError
from tkg.explore import svg
from tkg.explore.published import NotPublished, Published

HERE = Path(__file__).parent
log = logging.getLogger("tkg.explore")
MAX_PARAMETER = 200  # longer query values are refused: no name, id or date is that long

# The page loads nothing from anywhere else: the stylesheet is served from this package.
SECURITY_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'",
                    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


class BadRequest(Exception):
    """A malformed parameter: 400 with the message."""


class NotFound(Exception):
    """An id the graph does not hold: 404 with the message."""


templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True),
                        trim_blocks=True, lstrip_blocks=True)


def url(path: str, **query: Any) -> str:
    kept = {key: value for key, value in query.items() if value not in (None, "")}
    return path + ("?" + urlencode(kept) if kept else "")


templates.globals["url"] = url


def amount(value: float | None, unit: str | None) -> str:
    """1200000000, 'USD' -> '$1.20B'; 41.5, 'percent' -> '41.5%'."""
    if value is None:
        return "—"
    if unit == "percent":
        return f"{value:g}%"
    prefix = "$" if (unit or "").startswith("USD") else ""
    suffix = "" if prefix or not unit else f" {unit}"
    if unit == "USD/share":
        return f"${value:,.2f}/share"
    for scale, letter in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale:
            return f"{prefix}{value / scale:.2f}{letter}{suffix}"
    return f"{prefix}{value:g}{suffix}"


templates.filters["amount"] = amount
templates.filters["day"] = lambda value: "" if value is None else (value.strftime("%Y-%m-%d") if hasattr(value, "strftime") else str(value))


def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    html = templates.get_template(template).render(request=request, **context)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


# --- parameters ----------------------------------------------------------------------------------


def parameter(request: Request, name: str) -> str | None:
    value = request.query_params.get(name)
    if value is None:
        return None
    if len(value) > MAX_PARAMETER:
        raise BadRequest(f"the {name!r} parameter is {len(value)} characters long; at most {MAX_PARAMETER} are read")
    if any(ord(ch) < 32 for ch in value):
        raise BadRequest(f"the {name!r} parameter holds control characters; give plain text")
    return value.strip()


def path_id(request: Request, name: str) -> str:
    value = request.path_params[name]
    if len(value) > MAX_PARAMETER or any(ord(ch) < 32 for ch in value):
        raise BadRequest(f"{name} {value[:40]!r}… is not an id of this graph")
    return value


def as_of_parameter(request: Request) -> date | None:
    text = parameter(request, "as_of")
    if not text:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise BadRequest(f"as_of {text!r} is not a date; write it as YYYY-MM-DD, e.g. as_of=2024-06-30") from None


def int_parameter(request: Request, name: str) -> int | None:
    text = parameter(request, name)
    if not text:
        return None
    if not text.lstrip("-").isdigit() or len(text) > 6:
        raise BadRequest(f"{name} {text!r} is not a whole number")
    return int(text)


def end_of(day: date) -> datetime:
    """What was believed on a day: everything stated up to its last moment (UTC)."""
    return datetime.combine(day, time.max, tzinfo=timezone.utc)


# --- views ---------------------------------------------------------------------------------------


_opened = threading.local()  # the cursors a request opened, closed when it ends


@dataclass
class Views:
    published: Published

    def graph(self):
        graph = self.published.graph()
        _opened.graphs.append(graph)
        return graph

    def last_call(self, graph) -> date | None:
        return graph.connection.execute("SELECT max(call_date) FROM transcripts").fetchone()[0]

    def index(self, request: Request) -> Response:
        graph = self.graph()
        companies = graph.rows(
            "SELECT company, any_value(company_name) AS name, count(*) AS calls, min(call_date) AS first, "
            "max(call_date) AS last FROM transcripts GROUP BY company ORDER BY company")
        counts = graph.rows("SELECT (SELECT count(*) FROM facts) AS facts, (SELECT count(*) FROM canonical_entities "
                            "WHERE merged_into IS NULL) AS entities, (SELECT count(*) FROM metrics) AS figures")[0]
        return page(request, "index.html", companies=companies, counts=counts, path=self.published.path)

    def search(self, request: Request) -> Response:
        query = parameter(request, "q") or ""
        if not query:
            return page(request, "search.html", query="", matches=[], message="Type a name: a person, a company, an office "
                        "or a metric.")
        graph = self.graph()
        matches = graph.find_entity(query, limit=25)
        companies = {row["company"] for row in graph.rows("SELECT DISTINCT company FROM transcripts")}
        rows = [{"match": m, "ticker": _ticker(m.canonical_id, companies)} for m in matches]
        return page(request, "search.html", query=query, matches=rows,
                    message=None if rows else f"Nothing in the graph is called {query!r}.")

    def _entity(self, graph, canonical_id: str) -> EntityMatch:
        rows = graph.rows("SELECT canonical_id, name, type, merged_into, mention_count FROM canonical_entities "
                          "WHERE canonical_id = $id", {"id": canonical_id})
        if not rows:
            raise NotFound(f"no entity with id {canonical_id!r} in this graph; search for it by name")
        row = rows[0]
        return EntityMatch(row["canonical_id"], row["name"], row["type"], row["name"], "id", 100.0, row["mention_count"] or 0)

    def _merged(self, graph, canonical_id: str) -> str | None:
        row = graph.connection.execute("SELECT merged_into FROM canonical_entities WHERE canonical_id = ?",
                                       [canonical_id]).fetchone()
        return row[0] if row else None

    def entity(self, request: Request) -> Response:
        canonical_id = path_id(request, "canonical_id")
        as_of = as_of_parameter(request)
        graph = self.graph()
        merged = self._merged(graph, canonical_id)
        if merged:
            return RedirectResponse(url(f"/entity/{merged}", as_of=as_of), status_code=303)
        match = self._entity(graph, canonical_id)
        last = self.last_call(graph)
        day = as_of or last or date.today()
        moment = end_of(day)
        periods = graph.rows(
            f"""
            SELECT subject, subject_id, predicate, object, object_id, value, company, began_at, ended_at,
                   last_restated_on, restatements, retired_by, retired_by_statement, first_event_id, first_statement,
                   fact_id, split_part(fact_id, '-', 1) AS fact_key
            FROM fact_history
            WHERE {_ABOUT_ENTITY}
            ORDER BY predicate, began_at, subject, object
            """, {"id": match.canonical_id, "name": match.name})
        believed = graph.rows(
            f"""
            SELECT event_id, company, call_date, subject, subject_id, predicate, object, object_id, value, statement,
                   valid_at, invalid_at, md5(concat_ws('|', subject_id, predicate, object_id, coalesce(value, ''))) AS fact_key
            FROM facts_as_of($moment)
            WHERE {_ABOUT_ENTITY}
            QUALIFY row_number() OVER (PARTITION BY subject_id, predicate, object_id, value ORDER BY call_date DESC, event_id) = 1
            ORDER BY predicate, subject, object
            """, {"id": match.canonical_id, "name": match.name, "moment": moment})
        held_keys = {row["fact_key"] for row in believed}
        bars = []
        for row in periods:
            start = svg.moment(row["began_at"])
            end = svg.moment(row["ended_at"])
            held = row["fact_key"] in held_keys and start <= moment and (end is None or end > moment)
            css = "held" if held else ("later" if start > moment else "past")
            label = _fact_label(row, match)
            bars.append(svg.Bar(
                label=label, start=start, end=end, href=f"/statement/{row['first_event_id']}",
                title=f"{label}\n{row['began_at']:%Y-%m-%d} → {row['ended_at']:%Y-%m-%d}" if row["ended_at"] else
                f"{label}\nsince {row['began_at']:%Y-%m-%d}, still holds",
                css=css, retired_href=f"/statement/{row['retired_by']}" if row["retired_by"] else None,
                retired_title=f"retired by: {row['retired_by_statement']}" if row["retired_by"] else None,
                fact_id=row["fact_id"]))
        chart = svg.timeline(bars, moment, svg.moment(last) if last else moment)
        companies = {r["company"] for r in graph.rows("SELECT DISTINCT company FROM transcripts")}
        return page(request, "entity.html", entity=match, as_of=day, as_of_given=as_of, chart=chart, periods=periods,
                    believed=believed, held=sum(1 for b in bars if b.css == "held"), ticker=_ticker(match.canonical_id, companies))

    def statement(self, request: Request) -> Response:
        event_id = path_id(request, "event_id")
        graph = self.graph()
        rows = graph.rows(
            """
            SELECT e.event_id, e.statement, e.statement_type, e.temporal_type, e.valid_at, e.invalid_at, e.created_at,
                   e.expired_at, e.invalidated_by, e.asserted_invalid_at, e.company, e.transcript_id,
                   c.speaker, c.speaker_title, c.speaker_organization, c.section, c.text AS chunk_text,
                   t.call_date, t.title, t.fiscal_quarter, t.company_name, r.statement AS retired_by_statement
            FROM events AS e
            LEFT JOIN chunks AS c ON c.chunk_id = e.chunk_id
            LEFT JOIN transcripts AS t ON t.transcript_id = e.transcript_id
            LEFT JOIN events AS r ON r.event_id = e.invalidated_by
            WHERE e.event_id = $id
            """, {"id": event_id})
        if not rows:
            raise NotFound(f"no statement with id {event_id!r} in this graph")
        triplets = graph.rows("SELECT subject, subject_id, predicate, object, object_id, value FROM facts "
                              "WHERE event_id = $id ORDER BY triplet_id", {"id": event_id})
        retired = graph.rows("SELECT event_id, statement, call_date FROM events AS e JOIN transcripts USING (transcript_id) "
                             "WHERE e.invalidated_by = $id ORDER BY call_date, event_id", {"id": event_id})
        return page(request, "statement.html", s=rows[0], triplets=triplets, retired=retired)

    def call(self, request: Request) -> Response:
        transcript_id = path_id(request, "transcript_id")
        graph = self.graph()
        rows = graph.rows("SELECT transcript_id, company, company_name, call_date, title, fiscal_quarter, participants "
                          "FROM transcripts WHERE transcript_id = $id", {"id": transcript_id})
        if not rows:
            raise NotFound(f"no call with id {transcript_id!r} in this graph")
        statements = graph.rows(
            "SELECT e.event_id, e.statement, e.statement_type, e.invalidated_by, c.speaker, c.section "
            "FROM events AS e LEFT JOIN chunks AS c ON c.chunk_id = e.chunk_id WHERE e.transcript_id = $id "
            "ORDER BY c.chunk_index, e.event_id", {"id": transcript_id})
        return page(request, "call.html", call=rows[0], statements=statements)

    def _company(self, graph, ticker: str) -> dict[str, Any]:
        # The registry's legal name (the one offices are held at) when the graph has the company's entity.
        rows = graph.rows("SELECT t.company, coalesce(any_value(c.name), any_value(t.company_name)) AS name "
                          "FROM transcripts AS t LEFT JOIN canonical_entities AS c ON c.canonical_id = 'cmp_' || t.company "
                          "WHERE t.company = $t GROUP BY t.company", {"t": ticker})
        if not rows:
            raise NotFound(f"no calls of a company {ticker!r} in this graph; the index lists the companies it holds")
        return rows[0]

    def company(self, request: Request) -> Response:
        ticker = path_id(request, "ticker").upper()
        as_of = as_of_parameter(request)
        graph = self.graph()
        company = self._company(graph, ticker)
        canonical_id = f"cmp_{ticker}"
        last = self.last_call(graph)
        tenures = graph.rows(
            """
            SELECT person, person_id, role, title, started_at, ended_at, ended_by, ended_by_statement, first_event_id
            FROM officer_tenures
            WHERE company = $t AND (organization = $name
                                    OR organization IN (SELECT alias FROM entity_aliases WHERE canonical_id = $cid))
            ORDER BY role, started_at, person
            """, {"t": ticker, "name": company["name"], "cid": canonical_id})
        moment = end_of(as_of or last or date.today())
        bars = []
        for row in tenures:
            start, end = svg.moment(row["started_at"]), svg.moment(row["ended_at"])
            held = start <= moment and (end is None or end > moment)
            label = f"{row['role']}: {row['person']}"
            bars.append(svg.Bar(label=label, start=start, end=end, href=f"/entity/{row['person_id']}",
                                title=f"{label} from {row['started_at']:%Y-%m-%d}",
                                css="held" if held else ("later" if start > moment else "past"),
                                retired_href=f"/statement/{row['ended_by']}" if row["ended_by"] else None,
                                retired_title=f"ended by: {row['ended_by_statement']}" if row["ended_by"] else None))
        officers = svg.timeline(bars, moment, svg.moment(last) if last else moment)
        calls = graph.rows(
            "SELECT t.transcript_id, t.call_date, t.fiscal_quarter, t.title, count(e.event_id) AS statements "
            "FROM transcripts AS t LEFT JOIN events AS e USING (transcript_id) WHERE t.company = $t "
            "GROUP BY ALL ORDER BY t.call_date", {"t": ticker})
        chains = [dict(chain, chart=svg.steps(
            [(svg.moment(step["valid_at"]) or svg.moment(step["call_date"]), step["value"],
              f"{step['call_date']}: {amount(step['value'], step['unit'])}") for step in chain["steps"]],
            chain["actual"]["value"] if chain["actual"] else None,
            lambda value, unit=chain["unit"]: amount(value, unit))) for chain in guidance_chains(graph, ticker)]
        return page(request, "company.html", company=company, ticker=ticker, canonical_id=canonical_id, officers=officers,
                    tenures=tenures, calls=calls, chains=chains, as_of=as_of or last)

    def guidance(self, request: Request) -> Response:
        ticker = path_id(request, "ticker").upper()
        graph = self.graph()
        company = self._company(graph, ticker)
        metric = parameter(request, "metric")
        if not metric:
            raise BadRequest("name the metric: ?metric=revenue&year=2024 (the company page links every chain)")
        key = {"metric": metric, "segment": parameter(request, "segment") or None, "basis": parameter(request, "basis") or None,
               "year": int_parameter(request, "year"), "quarter": int_parameter(request, "quarter")}
        chains = [c for c in guidance_chains(graph, ticker) if all(c[k] == v for k, v in key.items())]
        if not chains:
            raise NotFound(f"no guidance chain for {metric!r} of {ticker} with those parameters; the company page lists them")
        chain = chains[0]
        chart = svg.steps([(svg.moment(s["valid_at"]) or svg.moment(s["call_date"]), s["value"],
                            f"{s['call_date']}: {amount(s['value'], s['unit'])}") for s in chain["steps"]],
                          chain["actual"]["value"] if chain["actual"] else None,
                          lambda value: amount(value, chain["unit"]))
        return page(request, "guidance.html", company=company, ticker=ticker, chain=chain, chart=chart)

    def subgraph(self, request: Request) -> Response:
        canonical_id = path_id(request, "canonical_id")
        as_of = as_of_parameter(request)
        graph = self.graph()
        merged = self._merged(graph, canonical_id)
        if merged:
            return RedirectResponse(url(f"/subgraph/{merged}", as_of=as_of), status_code=303)
        match = self._entity(graph, canonical_id)
        day = as_of or self.last_call(graph) or date.today()
        moment = end_of(day)
        facts = graph.rows(
            f"""
            SELECT f.subject, f.subject_id, f.predicate, f.object, f.object_id, f.value, f.event_id,
                   s.type AS subject_type, o.type AS object_type
            FROM facts_as_of($moment) AS f
            LEFT JOIN canonical_entities AS s ON s.canonical_id = f.subject_id
            LEFT JOIN canonical_entities AS o ON o.canonical_id = f.object_id
            WHERE {_ABOUT_ENTITY}  -- canonical_entities has none of its columns: they are the fact's
            QUALIFY row_number() OVER (PARTITION BY f.subject_id, f.predicate, f.object_id, f.value
                                       ORDER BY f.call_date DESC, f.event_id) = 1
            ORDER BY f.predicate, f.subject, f.object
            LIMIT 60
            """, {"id": match.canonical_id, "name": match.name, "moment": moment})
        center = svg.Node(match.canonical_id, match.name, match.type, None)
        nodes: dict[str, svg.Node] = {}
        edges = []
        office_suffix = f" of {match.name}"

        def add(node_id: str | None, name: str | None, kind: str | None) -> None:
            if node_id and node_id != match.canonical_id and node_id not in nodes and name:
                nodes[node_id] = svg.Node(node_id, name, kind or "Entity", url(f"/subgraph/{node_id}", as_of=day.isoformat()))

        for row in facts:
            value = f" = {row['value']}" if row["value"] else ""
            if row["predicate"] == "HOLDS_ROLE" and row["subject_id"] != match.canonical_id \
                    and (row["object"] or "").endswith(office_suffix):
                # an office at this entity: its holder, linked straight to it, labelled with the office
                add(row["subject_id"], row["subject"], row["subject_type"])
                edges.append(svg.Edge(match.canonical_id, row["subject_id"], row["object"][: -len(office_suffix)]))
                continue
            add(row["subject_id"], row["subject"], row["subject_type"])
            add(row["object_id"], row["object"], row["object_type"])
            other = row["object_id"] if row["subject_id"] == match.canonical_id else row["subject_id"]
            if other:
                edges.append(svg.Edge(match.canonical_id, other, row["predicate"] + value))
        figures = []
        companies = {r["company"] for r in graph.rows("SELECT DISTINCT company FROM transcripts")}
        ticker = _ticker(match.canonical_id, companies)
        if ticker:
            figures = graph.rows(
                """
                SELECT metric, segment, basis, kind, fiscal_year, fiscal_quarter, value, unit, event_id, call_date
                FROM metrics_as_of($moment) WHERE company = $t
                QUALIFY row_number() OVER (PARTITION BY metric, segment, basis, kind, fiscal_year, fiscal_quarter
                                           ORDER BY call_date DESC, figure_id) = 1
                ORDER BY call_date DESC, metric LIMIT 12
                """, {"moment": moment, "t": ticker})
            for figure in figures:
                key = f"figure:{figure['event_id']}:{figure['metric']}:{figure['kind']}"
                label = f"{figure['metric']} {_period(figure['fiscal_year'], figure['fiscal_quarter'])}: " \
                        f"{amount(figure['value'], figure['unit'])}"
                nodes[key] = svg.Node(key, label, "figure", f"/statement/{figure['event_id']}")
                edges.append(svg.Edge(match.canonical_id, key, figure["kind"]))
        chart = svg.subgraph(center, list(nodes.values()), edges)
        return page(request, "subgraph.html", entity=match, as_of=day, chart=chart, facts=facts, figures=figures,
                    ticker=ticker)


def guidance_chains(graph, ticker: str) -> list[dict[str, Any]]:
    """Each guided figure of a company (metric, segment, basis, fiscal period) as the sequence of
    values the calls gave, oldest first, with the reported actual for the same period."""
    rows = graph.rows(
        """
        SELECT metric, segment, basis, kind, fiscal_year AS year, fiscal_quarter AS quarter, value, low, high, unit,
               statement, event_id, call_date, valid_at, invalid_at, invalidated_by, revision, figure_id
        FROM metrics WHERE company = $t
        ORDER BY metric, segment NULLS FIRST, basis NULLS FIRST, year, quarter NULLS FIRST, call_date, figure_id
        """, {"t": ticker})
    chains: dict[tuple, dict[str, Any]] = {}
    actuals: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        key = (row["metric"], row["segment"], row["basis"], row["year"], row["quarter"])
        if row["kind"] == "guidance":
            chain = chains.setdefault(key, {"metric": key[0], "segment": key[1], "basis": key[2], "year": key[3],
                                            "quarter": key[4], "unit": row["unit"], "steps": [], "actual": None,
                                            "period": _period(key[3], key[4])})
            chain["steps"].append(row)
        elif row["kind"] == "reported":
            actuals[key] = row  # the latest report of the period (rows are in call order)
    for key, chain in chains.items():
        chain["actual"] = actuals.get(key)
        chain["href"] = url(f"/company/{ticker}/guidance", metric=chain["metric"], segment=chain["segment"],
                            basis=chain["basis"], year=chain["year"], quarter=chain["quarter"])
    return sorted(chains.values(), key=lambda c: (-len(c["steps"]), c["metric"], c["year"] or 0, c["quarter"] or 0))


def _period(year: int | None, quarter: int | None) -> str:
    if year is None:
        return "period not stated"
    return f"Q{quarter} FY{year}" if quarter else f"FY{year}"


def _ticker(canonical_id: str, companies: set[str]) -> str | None:
    """The ticker of a registry company's entity (cmp_TICKER), when the graph holds its calls."""
    ticker = canonical_id[4:] if canonical_id.startswith("cmp_") else None
    return ticker if ticker in companies else None


def _fact_label(row: dict[str, Any], match: EntityMatch) -> str:
    """A fact as seen from the entity: the other end (or the subject, for an office at a company)."""
    predicate = row["predicate"]
    value = f" = {row['value']}" if row["value"] else ""
    if row["subject_id"] == match.canonical_id:
        return f"{predicate} {row['object'] or ''}{value}".strip()
    suffix = f" of {match.name}"
    if predicate == "HOLDS_ROLE" and (row["object"] or "").endswith(suffix):  # an office at this company
        return f"{row['subject']}: {row['object'][: -len(suffix)]}"
    return f"{row['subject']} {predicate} {row['object'] or ''}{value}".strip()


# --- errors and the application -------------------------------------------------------------------


def create_app(warehouse: Path, build_hint: str | None = None) -> Starlette:
    views = Views(Published(warehouse, build_hint))

    def wrap(handler):
        def endpoint(request: Request) -> Response:
            # Starlette runs each call of a plain function in a worker thread: the request's
            # cursors are that thread's until it returns.
            _opened.graphs = []
            try:
                return handler(request)
            except BadRequest as error:
                return page(request, "error.html", 400, title="Bad request", message=str(error))
            except NotFound as error:
                return page(request, "error.html", 404, title="Not found", message=str(error))
            except QueryError as error:
                return page(request, "error.html", 400, title="Cannot answer that", message=str(error))
            except NotPublished as error:
                return page(request, "error.html", 503, title="No graph to show", message=str(error))
            finally:
                for graph in _opened.graphs:
                    graph.close()
                _opened.graphs = []
        return endpoint

    routes = [
        Route("/", wrap(views.index)),
        Route("/search", wrap(views.search)),
        Route("/entity/{canonical_id}", wrap(views.entity)),
        Route("/subgraph/{canonical_id}", wrap(views.subgraph)),
        Route("/statement/{event_id}", wrap(views.statement)),
        Route("/call/{transcript_id}", wrap(views.call)),
        Route("/company/{ticker}", wrap(views.company)),
        Route("/company/{ticker}/guidance", wrap(views.guidance)),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]

    async def not_found(request: Request, exc: HTTPException) -> Response:
        return page(request, "error.html", exc.status_code, title="Not found" if exc.status_code == 404 else "Error",
                    message=f"there is no page at {request.url.path[:80]}" if exc.status_code == 404 else str(exc.detail))

    async def failure(request: Request, exc: Exception) -> Response:
        log.error("explore: %s failed: %s: %s", request.url.path[:80], type(exc).__name__, exc)
        return page(request, "error.html", 500, title="Something went wrong",
                    message="this page could not be drawn; the server log names the error")

    return Starlette(routes=routes, exception_handlers={HTTPException: not_found, Exception: failure})
