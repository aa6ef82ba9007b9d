"""Answering a question with a model: a planner writes research tasks, then a tool-calling agent
runs the query tools (`tkg.answer.query.Graph`) until it can answer, citing the facts by event id.

    from tkg.answer.agent import answer_with_model
    with Graph.open() as graph:
        result = answer_with_model(graph, "Who was Helio Robotics' CFO in November 2024?")
        print(result.answer, [fact.event_id for fact in result.facts])

Everything goes through the process's one `LLMClient` (its retries, limiter and accounting),
with OpenAI function calling over the Responses API or chat completions, as
`LLMSettings.api_mode` says. Every model response is cached by a hash of its full input
(instructions, question, plan, tools and the conversation so far) in the `ResponseCache` beside
the data, so asking the same question of the same graph again makes no request. Tool calls run
in the caller's thread against the read-only graph; a tool error goes back to the model as the
tool's result, for it to correct the call. Nothing here writes the Parquet tree.

`tkg.answer.ask.answer_offline` answers without a model.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Callable

import duckdb
from pydantic import BaseModel

from tkg.answer.ask import Answer, ToolCall
from tkg.answer.query import _FACT_COLUMNS, METRIC_NAMES, EntityMatch, Fact, Graph, QueryError
from tkg.core.models import PREDICATE_DEFINITIONS, Predicate
from tkg.core.results import StageStats
from tkg.llm.cache import ResponseCache, cache_key, normalise
from tkg.llm.client import LLMClient, RequestFailed
from tkg.llm.prompts import RenderedPrompt, render
from tkg.llm.wire import InvalidOutput, load_list
from tkg.providers import llm_client
from tkg.settings import Settings

log = logging.getLogger(__name__)

PLANNER_TEMPLATE = "retrieval_planner.j2"
AGENT_TEMPLATE = "retrieval_agent.j2"
STAGE = "ask"
MAX_FACTS_PER_RESULT = 30  # facts (or matches, or timeline entries) one tool result shows the model
MAX_STATEMENT_CHARS = 300
MAX_SEARCH_K = 50
FACT_KEYS = ("event_id", "company", "call_date", "subject", "predicate", "object", "value", "statement", "valid_at",
             "invalid_at")


# --- the plan -------------------------------------------------------------------------------------


class PlanOut(BaseModel):
    research_tasks: list[str]


def parse_plan(text: str) -> list[str]:
    """The research tasks of a planner answer; tolerates a code fence. InvalidOutput otherwise."""
    return [" ".join(str(task).split()) for task in load_list(text, "research_tasks") if str(task).strip()]


# --- the tools ------------------------------------------------------------------------------------

_PREDICATE_OR_NULL = {"anyOf": [{"type": "string", "enum": [p.value for p in Predicate]}, {"type": "null"}],
                      "description": "a predicate of the vocabulary, or null for all"}
_DATE_OR_NULL = {"type": ["string", "null"], "description": "YYYY-MM-DD (or an ISO timestamp), or null"}


def _parameters(**properties: dict[str, Any]) -> dict[str, Any]:
    """A strict function schema: every property required (nullable ones may be null)."""
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


TOOLS: list[dict[str, Any]] = [
    {"name": "find_entity",
     "description": "Entities a name may mean, best first (canonical id, name, type, how it matched, mentions). "
                    "Use it to learn how the graph spells a person, company, product or metric.",
     "parameters": _parameters(name={"type": "string", "description": "a name, alias, ticker or canonical id"})},
    {"name": "factual_qa",
     "description": "Facts about one entity (as subject or object; for a company also the offices held at it) that "
                    "were valid at some point in [start, end], newest first, each with its event_id and statement. "
                    "Facts that ended inside the window are left out unless history is true.",
     "parameters": _parameters(entity={"type": "string", "description": "a name, alias, ticker or canonical id"},
                               start=_DATE_OR_NULL, end=_DATE_OR_NULL, predicate=_PREDICATE_OR_NULL,
                               history={"type": ["boolean", "null"],
                                        "description": "also facts that ended inside the window (default false)"})},
    {"name": "timeline",
     "description": "An entity's facts over time, oldest first: one entry per fact and continuous period, with when it "
                    "began and ended, how often it was restated and which event retired it.",
     "parameters": _parameters(entity={"type": "string", "description": "a name, alias, ticker or canonical id"},
                               predicate=_PREDICATE_OR_NULL)},
    {"name": "search",
     "description": "The k statements closest in meaning to a text, each with its first triplet: for questions that "
                    "name no entity or predicate. as_of keeps statements valid on that date; company is a ticker or name.",
     "parameters": _parameters(text={"type": "string"},
                               k={"type": ["integer", "null"], "description": f"how many (1-{MAX_SEARCH_K}, default 10)"},
                               as_of=_DATE_OR_NULL,
                               company={"type": ["string", "null"], "description": "a ticker or company name, or null"})},
    {"name": "trend_analysis",
     "description": "Facts on a topic per company and fiscal quarter, oldest first, within [start, end]: for how "
                    "something changed over time or across companies.",
     "parameters": _parameters(question={"type": "string"},
                               companies={"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                                          "description": "tickers or names; null for every company"},
                               start=_DATE_OR_NULL, end=_DATE_OR_NULL,
                               topic={"type": "string", "description": "what to follow, e.g. 'gross margin guidance'"})},
    {"name": "metrics",
     "description": "Financial figures of one company from the metrics table, oldest call first: reported results and "
                    "guidance, each with its value, range, basis, event_id, statement and the revision that retired it. "
                    "fiscal_year and fiscal_quarter are the company's own fiscal calendar, as its calls label quarters "
                    "(quarter null with full_year true: the fiscal year's own figure). as_of keeps what stood on that "
                    "date: the results reported by then and the guidance in force. Use it for every figure question "
                    "(revenue, margins, EPS, guidance and how it changed); it says when the company is not covered.",
     "parameters": _parameters(company={"type": "string", "description": "a ticker or company name"},
                               metric={"anyOf": [{"type": "string", "enum": list(METRIC_NAMES)}, {"type": "null"}],
                                       "description": "segment_revenue for a segment's revenue; null for all"},
                               fiscal_year={"type": ["integer", "null"]},
                               fiscal_quarter={"type": ["integer", "null"], "description": "1-4, or null"},
                               full_year={"type": ["boolean", "null"], "description": "only full-year figures"},
                               kind={"anyOf": [{"type": "string", "enum": ["reported", "guidance"]}, {"type": "null"}]},
                               segment={"type": ["string", "null"], "description": "a reporting segment; null: the company total"},
                               as_of=_DATE_OR_NULL)},
    {"name": "office_holders",
     "description": "Who held an office (CEO, CFO, COO, President, ...) at a company at some time in [start, end], in "
                    "order of start: one entry per person and tenure with its start, end and event_id. For 'who was "
                    "the CFO in June 2017' (start = end = that day) and for office timelines over years.",
     "parameters": _parameters(company={"type": "string", "description": "a ticker or company name"},
                               role={"type": "string", "description": "the office, e.g. CFO"},
                               start=_DATE_OR_NULL, end=_DATE_OR_NULL)},
]
TOOL_NAMES = frozenset(tool["name"] for tool in TOOLS)
RESPONSES_TOOLS = [{"type": "function", "name": t["name"], "description": t["description"], "parameters": t["parameters"],
                    "strict": True} for t in TOOLS]
CHAT_TOOLS = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                "parameters": t["parameters"], "strict": True}} for t in TOOLS]


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, (date, datetime)) else value


def _short(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_STATEMENT_CHARS:
        return text
    return text[: MAX_STATEMENT_CHARS - 1] + "…"


def compact_fact(fact: Fact) -> dict[str, Any]:
    """What the model sees of a fact."""
    shown = {key: _iso(getattr(fact, key)) for key in FACT_KEYS}
    shown["statement"] = _short(shown["statement"])
    return shown


def _entity(match: EntityMatch) -> dict[str, Any]:
    return {"canonical_id": match.canonical_id, "name": match.name, "type": match.type}


def _facts_result(facts: list[Fact], **head: Any) -> dict[str, Any]:
    shown = facts[:MAX_FACTS_PER_RESULT]
    result = {**head, "facts": [compact_fact(f) for f in shown], "total": len(facts)}
    if len(facts) > len(shown):
        result["note"] = f"showing the first {len(shown)} of {len(facts)}; narrow the window or name a predicate"
    return result


@dataclass
class ToolRun:
    """One tool call run against the graph: what goes back to the model, and what it found."""

    output: str
    results: int
    facts: list[Fact] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)  # events a result names without a Fact (timeline)
    error: str | None = None


def _text(arguments: dict[str, Any], name: str, required: bool = False) -> str | None:
    value = arguments.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise QueryError(f"{name} is required")
        return None
    if not isinstance(value, str):
        raise QueryError(f"{name} must be a string, got {type(value).__name__}")
    return value.strip()


def run_tool(graph: Graph, name: str, arguments: dict[str, Any]) -> ToolRun:
    """Run one tool call; a question the graph cannot take comes back as an error result."""
    try:
        if name not in TOOL_NAMES:
            raise QueryError(f"there is no tool {name!r}; the tools are {', '.join(sorted(TOOL_NAMES))}")
        allowed = set(next(t for t in TOOLS if t["name"] == name)["parameters"]["properties"])
        if unexpected := sorted(set(arguments) - allowed):
            raise QueryError(f"{name} takes no argument(s) {', '.join(unexpected)}; it takes {', '.join(sorted(allowed))}")
        return _run(graph, name, arguments)
    except (QueryError, ValueError, TypeError, duckdb.Error) as error:
        message = str(error) if isinstance(error, QueryError) else f"bad arguments ({type(error).__name__}): {error}"
        return ToolRun(f"error: {message}", 0, error=message)


def _run(graph: Graph, name: str, arguments: dict[str, Any]) -> ToolRun:
    if name == "find_entity":
        matches = graph.find_entity(_text(arguments, "name", required=True), limit=8)
        shown = [{**_entity(m), "matched": m.matched, "how": m.how, "score": m.score, "mentions": m.mentions} for m in matches]
        return ToolRun(_json({"matches": shown} if shown else {"matches": [], "note": "no entity matches this name"}),
                       len(matches))
    if name == "factual_qa":
        answer = graph.factual_qa(_text(arguments, "entity", required=True), _text(arguments, "start"),
                                  _text(arguments, "end"), predicate=_text(arguments, "predicate"),
                                  history=bool(arguments.get("history")))
        head: dict[str, Any] = {"entity": _entity(answer.entity), "start": _iso(answer.start), "end": _iso(answer.end)}
        if answer.predicate is not None:
            head["predicate"] = answer.predicate.predicate
            if not answer.predicate.exact:
                head["predicate_note"] = f"{answer.predicate.asked!r} is not in the vocabulary; read as {answer.predicate.predicate}"
        return ToolRun(_json(_facts_result(answer.facts, **head)), len(answer.facts), facts=list(answer.facts))
    if name == "timeline":
        match, entries, choice = graph.timeline(_text(arguments, "entity", required=True), predicate=_text(arguments, "predicate"))
        shown = [{"subject": e.subject, "predicate": e.predicate, "object": e.object, "value": e.value, "company": e.company,
                  "began_at": _iso(e.began_at), "ended_at": _iso(e.ended_at), "last_restated_on": _iso(e.last_restated_on),
                  "restatements": e.restatements, "retired_by_event_id": e.retired_by, "event_id": e.first_event_id,
                  "statement": _short(e.first_statement)} for e in entries[:MAX_FACTS_PER_RESULT]]
        result: dict[str, Any] = {"entity": _entity(match), "entries": shown, "total": len(entries)}
        if choice is not None:
            result["predicate"] = choice.predicate
        if len(entries) > len(shown):
            result["note"] = f"showing the first {len(shown)} of {len(entries)}; name a predicate to narrow it"
        return ToolRun(_json(result), len(entries), event_ids=[e.first_event_id for e in entries])
    if name == "search":
        k = arguments.get("k")
        k = 10 if k is None else int(k)
        if not 1 <= k <= MAX_SEARCH_K:
            raise QueryError(f"k must be between 1 and {MAX_SEARCH_K}, got {k}")
        facts = graph.search(_text(arguments, "text", required=True), k=k, as_of=_text(arguments, "as_of"),
                             company=_text(arguments, "company"))
        return ToolRun(_json(_facts_result(facts)), len(facts), facts=facts)
    if name == "metrics":
        return _metrics_tool(graph, arguments)
    if name == "office_holders":
        return _office_tool(graph, arguments)
    # trend_analysis
    companies = arguments.get("companies")
    if companies is not None and (not isinstance(companies, list) or not all(isinstance(c, str) for c in companies)):
        raise QueryError("companies must be a list of tickers or names, or null")
    trend = graph.trend_analysis(_text(arguments, "question") or "", companies or None, _text(arguments, "start"),
                                 _text(arguments, "end"), _text(arguments, "topic", required=True))
    groups, facts = [], []
    for (company, quarter), group in trend.groups.items():
        room = MAX_FACTS_PER_RESULT - len(facts)
        if room <= 0:
            break
        facts.extend(group[:room])
        groups.append({"company": company, "quarter": quarter, "facts": [compact_fact(f) for f in group[:room]]})
    total = sum(len(group) for group in trend.groups.values())
    result = {"topic": trend.topic, "groups": groups, "total": total}
    if total > len(facts):
        result["note"] = f"showing {len(facts)} of {total} facts; narrow the window or the companies"
    return ToolRun(_json(result), total, facts=facts)


def _integer(arguments: dict[str, Any], name: str) -> int | None:
    value = arguments.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise QueryError(f"{name} must be an integer or null, got {value!r}")
    return value


def _uncovered(graph: Graph, company: str) -> str | None:
    """Why the graph cannot answer for `company`, or None when it holds its calls."""
    ticker = graph.company_ticker(company)
    calls, _, _ = graph.coverage(ticker)
    return None if calls else f"the graph holds no calls of {ticker}: it cannot say (not in the data)"


def _metrics_tool(graph: Graph, arguments: dict[str, Any]) -> ToolRun:
    from tkg.answer.financial import _fact  # a figure shown as a fact with its evidence

    company = _text(arguments, "company", required=True)
    if (reason := _uncovered(graph, company)) is not None:
        return ToolRun(_json({"figures": [], "total": 0, "note": reason}), 0)
    figures = graph.metrics(company, metric=_text(arguments, "metric"), fiscal_year=_integer(arguments, "fiscal_year"),
                            fiscal_quarter=_integer(arguments, "fiscal_quarter"), full_year=bool(arguments.get("full_year")),
                            kind=_text(arguments, "kind"), segment=_text(arguments, "segment"), as_of=_text(arguments, "as_of"))
    shown = [{"metric": f.metric, "segment": f.segment, "basis": f.basis, "kind": f.kind, "period": f.period,
              "amount": f.amount(), "value": f.value, "low": f.low, "high": f.high, "unit": f.unit, "call_date": _iso(f.call_date),
              "event_id": f.event_id, "statement": _short(f.statement), "invalid_at": _iso(f.invalid_at), "revision": f.revision}
             for f in figures[:MAX_FACTS_PER_RESULT]]
    result: dict[str, Any] = {"figures": shown, "total": len(figures)}
    if not figures:
        calls, first, last = graph.coverage(graph.company_ticker(company))
        result["note"] = f"no figure matches; the graph holds {calls} calls of this company, {first} to {last}"
    elif len(figures) > len(shown):
        result["note"] = f"showing the first {len(shown)} of {len(figures)}; name a metric, period or kind"
    name = graph.company_ticker(company)
    return ToolRun(_json(result), len(figures), facts=[_fact(f, name) for f in figures[:MAX_FACTS_PER_RESULT]])


def _office_tool(graph: Graph, arguments: dict[str, Any]) -> ToolRun:
    company = _text(arguments, "company", required=True)
    if (reason := _uncovered(graph, company)) is not None:
        return ToolRun(_json({"holders": [], "total": 0, "note": reason}), 0)
    holders = graph.office_holders(graph.company_ticker(company), _text(arguments, "role", required=True),
                                   _text(arguments, "start"), _text(arguments, "end"))
    shown = [{"person": h["person"], "title": h["title"], "started_at": _iso(h["started_at"]), "ended_at": _iso(h["ended_at"]),
              "event_id": h["event_id"], "statement": _short(h["statement"])} for h in holders[:MAX_FACTS_PER_RESULT]]
    result: dict[str, Any] = {"holders": shown, "total": len(holders)}
    if not holders:
        result["note"] = "no holder of this office is recorded in the window"
    return ToolRun(_json(result), len(holders), event_ids=[h["event_id"] for h in holders])


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


# --- the model ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelCall:
    call_id: str
    name: str
    arguments: str  # JSON text, as the model wrote it

    def as_dict(self) -> dict[str, str]:
        return {"call_id": self.call_id, "name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class Turn:
    """One model response: its text, and the tools it calls (none: this is the answer)."""

    text: str
    calls: tuple[ModelCall, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "calls": [call.as_dict() for call in self.calls]}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Turn:
        return cls(value.get("text") or "", tuple(ModelCall(**call) for call in value.get("calls") or []))


@dataclass
class Exchange:
    """A turn that called tools, and the tool results sent back: the conversation, model-neutral."""

    turn: Turn
    outputs: list[tuple[str, str]]  # (call_id, output)

    def as_dict(self) -> dict[str, Any]:
        return {**self.turn.as_dict(), "outputs": [list(pair) for pair in self.outputs]}


def _responses_input(prompt: RenderedPrompt, history: list[Exchange]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": prompt.input}]
    for exchange in history:
        if exchange.turn.text:
            items.append({"role": "assistant", "content": exchange.turn.text})
        items.extend({"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments}
                     for c in exchange.turn.calls)
        items.extend({"type": "function_call_output", "call_id": call_id, "output": output}
                     for call_id, output in exchange.outputs)
    return items


def _chat_messages(prompt: RenderedPrompt, history: list[Exchange]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": prompt.instructions}, {"role": "user", "content": prompt.input}]
    for exchange in history:
        messages.append({"role": "assistant", "content": exchange.turn.text or None,
                         "tool_calls": [{"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                        for c in exchange.turn.calls]})
        messages.extend({"role": "tool", "tool_call_id": call_id, "content": output} for call_id, output in exchange.outputs)
    return messages


async def _request_turn(client: LLMClient, model: str, prompt: RenderedPrompt, history: list[Exchange],
                        stats: StageStats) -> Turn:
    """One model turn over function calling, through the client's limiter and retries."""
    openai_client, _ = client._ensure()
    settings = client.settings
    extra: dict[str, Any] = {"service_tier": settings.service_tier} if settings.service_tier else {}

    async def call() -> Turn:
        stats.requests += 1
        if settings.api_mode == "chat":
            response = await openai_client.chat.completions.create(
                model=model, temperature=settings.temperature, messages=_chat_messages(prompt, history), tools=CHAT_TOOLS,
                tool_choice="auto", **extra)
            usage = response.usage
            details = getattr(usage, "prompt_tokens_details", None) if usage else None
            tokens = (usage.prompt_tokens, getattr(details, "cached_tokens", 0) or 0, usage.completion_tokens) if usage else (0, 0, 0)
            message = response.choices[0].message
            turn = Turn(message.content or "", tuple(ModelCall(c.id, c.function.name, c.function.arguments or "{}")
                                                     for c in message.tool_calls or [] if getattr(c, "function", None)))
        else:
            response = await openai_client.responses.create(
                model=model, temperature=settings.temperature, instructions=prompt.instructions,
                input=_responses_input(prompt, history), tools=RESPONSES_TOOLS, tool_choice="auto", **extra)
            usage = response.usage
            tokens = (usage.input_tokens, getattr(usage.input_tokens_details, "cached_tokens", 0) or 0,
                      usage.output_tokens) if usage else (0, 0, 0)
            turn = Turn(response.output_text or "", tuple(ModelCall(item.call_id, item.name, item.arguments or "{}")
                                                          for item in response.output if item.type == "function_call"))
        stats.input_tokens += tokens[0]
        stats.cached_input_tokens += tokens[1]
        stats.output_tokens += tokens[2]
        stats.cost_usd += settings.cost_usd(model, *tokens)
        stats.sync_cost_usd += settings.cost_usd(model, *tokens)
        return turn

    return await client._with_retries(STAGE, stats, call)


class _Session:
    """The client, cache and counters one question uses."""

    def __init__(self, client: LLMClient, cache: ResponseCache, stats: StageStats) -> None:
        self.client, self.cache, self.stats, self.settings = client, cache, stats, client.settings
        self.model = os.environ.get("TKG_MODEL_ASK") or self.settings.model(STAGE)

    def plan(self, question: str, data_range: str) -> list[str]:
        prompt = render(PLANNER_TEMPLATE, tools=[{"name": t["name"], "description": t["description"]} for t in TOOLS],
                        predicates=[p.value for p in Predicate], data_range=data_range, question=question)
        model = self.settings.model("planner")
        key = cache_key("planner", model, prompt.template_sha256, self.settings.fingerprint("planner"),
                        normalise(f"{prompt.instructions}\x1f{prompt.input}"))
        return list(self._cached(key, "planner", model,
                                 lambda: self.client.run(self.client.structured("planner", prompt, PlanOut, parse_plan, self.stats))))

    def turn(self, prompt: RenderedPrompt, history: list[Exchange]) -> Turn:
        """The model's next turn: from the cache when this exact input was answered before."""
        full_input = _json({"instructions": prompt.instructions, "input": prompt.input, "tools": TOOLS,
                            "history": [exchange.as_dict() for exchange in history]})
        key = cache_key(STAGE, self.model, prompt.template_sha256, self.settings.fingerprint(STAGE), normalise(full_input))
        return Turn.from_dict(self._cached(
            key, STAGE, self.model,
            lambda: self.client.run(_request_turn(self.client, self.model, prompt, history, self.stats)).as_dict()))

    def _cached(self, key: str, stage: str, model: str, ask: Callable[[], Any]) -> Any:
        """The cached answer for `key`, or `ask()`'s, stored before it is returned."""
        if (cached := self.cache.get(key)) is not None:
            self.stats.cache_hits += 1
            return cached
        answer = ask()
        self.cache.put(key, stage, model, answer)
        return answer


# --- citations ------------------------------------------------------------------------------------

_BRACKETS = re.compile(r"\[([^\[\]\n]{1,400})\]")
_ID = re.compile(r"^[0-9A-Za-z_\-]{8,64}$")


def cited_event_ids(text: str | None) -> list[str]:
    """Event ids cited in square brackets, in order of first citation: "[a1b2...]", "[a1.., b2..]"."""
    found: list[str] = []
    for group in _BRACKETS.findall(text or ""):
        for token in re.split(r"[,;\s]+", group.strip()):
            token = token.strip("`'\"")
            if token.lower().startswith("event_id:") or token.lower().startswith("event:"):
                token = token.split(":", 1)[1]
            if _ID.match(token) and token not in found:
                found.append(token)
    return found


def _facts_by_event(graph: Graph, event_ids: list[str]) -> dict[str, list[Fact]]:
    """The facts of each event (events without a triplet as one fact with an empty triplet)."""
    if not event_ids:
        return {}
    rows = graph.rows(f"SELECT {_FACT_COLUMNS} FROM facts WHERE event_id IN (SELECT unnest($ids::VARCHAR[])) "
                      "ORDER BY event_id, subject, predicate, object", {"ids": event_ids})
    found: dict[str, list[Fact]] = {}
    for row in rows:
        found.setdefault(row["event_id"], []).append(Fact(**row))
    missing = [event_id for event_id in event_ids if event_id not in found]
    if missing:
        for row in graph.rows(
                "SELECT e.event_id, e.company, tr.call_date, '' AS subject, '' AS predicate, NULL AS object, NULL AS value, "
                "e.statement, e.valid_at, e.invalid_at, e.invalidated_by, NULL AS subject_id, NULL AS object_id "
                "FROM events AS e JOIN transcripts AS tr ON tr.transcript_id = e.transcript_id "
                "WHERE e.event_id IN (SELECT unnest($ids::VARCHAR[]))", {"ids": missing}):
            found.setdefault(row["event_id"], []).append(Fact(**row))
    return found


def _select_facts(graph: Graph, answer: str | None, retrieved: list[Fact | str], limit: int) -> tuple[list[Fact], list[str]]:
    """The cited facts first (in order of citation), then the other retrieved ones, one row per
    fact, at most `limit`; and the cited ids the graph does not hold."""
    cited = cited_event_ids(answer)
    by_event: dict[str, list[Fact]] = {}
    for item in retrieved:
        if isinstance(item, Fact):
            by_event.setdefault(item.event_id, []).append(item)
    wanted = [i for i in cited if i not in by_event]
    wanted += [i for i in retrieved if isinstance(i, str) and i not in by_event and i not in wanted][:limit]
    for event_id, facts in _facts_by_event(graph, wanted).items():
        by_event.setdefault(event_id, facts)
    unknown = [event_id for event_id in cited if event_id not in by_event]
    ordered: list[Fact] = [fact for event_id in cited for fact in by_event.get(event_id, [])]
    for item in retrieved:
        ordered.extend([item] if isinstance(item, Fact) else by_event.get(item, []))
    chosen: dict[tuple, Fact] = {}
    for fact in ordered:
        chosen.setdefault((fact.event_id, fact.subject, fact.predicate, fact.object, fact.value), fact)
        if len(chosen) >= limit:
            break
    return list(chosen.values()), unknown


# --- the agent ------------------------------------------------------------------------------------


def _data_range(graph: Graph) -> str:
    row = graph.connection.execute("SELECT min(call_date), max(call_date) FROM transcripts").fetchone()
    return f"{row[0]} to {row[1]}" if row and row[0] else "no calls yet"


def _arguments(text: str) -> tuple[dict[str, Any], str | None]:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as error:
        return {"_raw": text}, f"the arguments are not valid JSON ({error.msg} at position {error.pos})"
    if not isinstance(value, dict):
        return {"_raw": text}, "the arguments must be a JSON object"
    return value, None


def answer_with_model(graph: Graph, question: str, settings: Settings | None = None, max_steps: int = 8, limit: int = 10,
                      *, stats: StageStats | None = None) -> Answer:
    """Plan, call tools until the model answers, and return its answer with the facts it cites
    first. A model turn is a step; after `max_steps` turns without an answer it stops, with
    `answer=None` and the reason in `note`. Requests, cache hits and tokens are counted into
    `stats` (the "ask" stage) when given. The settings' cache (under its home, by default the
    graph's folder) replays answered inputs."""
    if not question or not question.strip():
        raise QueryError("the question is empty")
    if max_steps < 1:
        raise QueryError(f"max_steps must be at least 1, got {max_steps}")
    client, cache = llm_client(settings or Settings.resolve(home=graph.path.parent))
    stats = stats if stats is not None else StageStats()
    session = _Session(client, cache, stats)
    notes: list[str] = []
    data_range = _data_range(graph)

    try:
        plan = session.plan(question, data_range)
    except (InvalidOutput, RequestFailed) as error:
        plan = []
        notes.append(f"the planner gave no usable plan ({error}); the agent planned for itself")
        log.warning("ask: planner failed: %s", error)

    prompt = render(AGENT_TEMPLATE, predicates=[{"name": p.value, "definition": d} for p, d in PREDICATE_DEFINITIONS.items()],
                    data_range=data_range, question=question, plan=plan)
    history: list[Exchange] = []
    calls: list[ToolCall] = []
    retrieved: list[Fact | str] = []
    answer: str | None = None
    for step in range(1, max_steps + 1):
        try:
            turn = session.turn(prompt, history)
        except RequestFailed as error:
            notes.append(f"the model request failed at step {step}: {error}")
            log.warning("ask: model request failed at step %d: %s", step, error)
            break
        if not turn.calls:
            answer = turn.text.strip() or None
            if answer is None:
                notes.append("the model returned an empty answer")
            break
        outputs = []
        for call in turn.calls:
            arguments, error = _arguments(call.arguments)
            run = ToolRun(f"error: {error}", 0, error=error) if error else run_tool(graph, call.name, arguments)
            log.debug("ask: step %d: %s(%s) -> %d result(s)%s", step, call.name, call.arguments, run.results,
                      f", error: {run.error}" if run.error else "")
            calls.append(ToolCall(call.name, arguments, run.results, run.error))
            retrieved.extend(run.facts)
            retrieved.extend(run.event_ids)
            outputs.append((call.call_id, run.output))
        history.append(Exchange(turn, outputs))
    else:
        notes.append(f"stopped after {max_steps} step{'s' if max_steps != 1 else ''} without an answer")

    facts, unknown = _select_facts(graph, answer, retrieved, limit)
    if unknown:
        notes.append(f"the answer cites event id(s) the graph does not hold: {', '.join(unknown)}")
    log.info("ask: %d request(s), %d from cache, %d input tokens (%d cached), %d output tokens, $%.4f; %d tool call(s)",
             stats.requests, stats.cache_hits, stats.input_tokens, stats.cached_input_tokens, stats.output_tokens,
             stats.cost_usd, len(calls))
    return Answer(question, answer, plan, calls, facts, "; ".join(notes))
