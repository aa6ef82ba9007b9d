"""The retrieval agent over real HTTP: `answer_with_model` with the real openai SDK against the
local OpenAI-compatible server, on the bundled sample graph.

The server stands in for the model only: a scripted responder plans, calls tools with arguments
it reads from earlier tool results (as a model would), and answers citing an event id it was
sent. Planning, function calling on both APIs, running the tools, caching and citation
handling are the code under test.
"""

from __future__ import annotations

import json
import logging

import pytest

from fakes.openai_server import (
    FunctionCall,
    OpenAICompatibleServer,
    ParsedRequest,
    tool_outputs,
)
from tkg.answer.agent import answer_with_model
from tkg.answer.query import Graph
from tkg.core.results import StageStats
from tkg.settings import Settings

API_KEY = "sk-test-agent-0123456789-do-not-leak"
QUESTION = "Who was the CFO of Helio Robotics in November 2024?"
TASKS = ["Resolve 'Helio Robotics' to its canonical entity with find_entity",
         "List HOLDS_ROLE facts for that entity valid in 2024-11-01..2024-11-30 and pick the CFO"]
FACTUAL_QA_ARGUMENTS = {"start": "2024-11-01", "end": "2024-11-30", "predicate": "HOLDS_ROLE", "history": None}


class ScriptedModel:
    """Plans two tasks; calls find_entity, then factual_qa for the entity it found; then answers
    with the CFO fact it was sent, citing its event id. Keeps every request it saw."""

    def __init__(self) -> None:
        self.requests: list[ParsedRequest] = []

    def __call__(self, request: ParsedRequest):
        self.requests.append(request)
        if request.schema_name == "PlanOut":
            return {"research_tasks": TASKS}
        outputs = tool_outputs(request)
        if not outputs:
            return FunctionCall("find_entity", {"name": "Helio Robotics"})
        if len(outputs) == 1:
            entity = json.loads(outputs[0][1])["matches"][0]["canonical_id"]
            return FunctionCall("factual_qa", {"entity": entity, **FACTUAL_QA_ARGUMENTS})
        cfo = next(f for f in json.loads(outputs[1][1])["facts"] if f["value"] == "CFO")
        return (f"{cfo['subject']} was CFO of Helio Robotics in November 2024, as stated on the "
                f"{cfo['call_date']} call [{cfo['event_id']}].")

    def agent_requests(self) -> list[ParsedRequest]:
        return [r for r in self.requests if r.schema_name != "PlanOut"]


@pytest.fixture(scope="module")
def server():
    with OpenAICompatibleServer(max_in_flight=8) as running:
        yield running


@pytest.fixture(scope="module")
def graph(sample_home):
    with Graph.open(sample_home / "tkg.duckdb") as opened:
        yield opened


@pytest.fixture
def model(server, monkeypatch):
    for name, value in {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": API_KEY, "TKG_EMBEDDINGS": "wordllama",
                        "TKG_LLM_ATTEMPTS": "2", "TKG_LLM_TIMEOUT": "20"}.items():
        monkeypatch.setenv(name, value)
    scripted = ScriptedModel()
    server.set_responder(scripted)
    server.reset_stats()
    return scripted


@pytest.mark.parametrize("api_mode", ["responses", "chat"])
def test_plans_calls_tools_and_cites_what_it_was_sent(graph, server, model, tmp_path, api_mode, caplog):
    caplog.set_level(logging.DEBUG)
    stats = StageStats()
    result = answer_with_model(graph, QUESTION, Settings.resolve(home=tmp_path, api_mode=api_mode), stats=stats)

    # the plan, and the trace of tool calls with the arguments the model gave
    assert result.plan == TASKS
    assert [(call.tool, call.arguments) for call in result.tool_calls] == [
        ("find_entity", {"name": "Helio Robotics"}),
        ("factual_qa", {"entity": "cmp_HLIO", **FACTUAL_QA_ARGUMENTS})]
    assert all(call.results > 0 and call.error is None for call in result.tool_calls)

    # what went over the wire: one planner request, then three turns on the chosen API, each
    # sending back every earlier call and its result
    expected_endpoint = "chat.completions" if api_mode == "chat" else "responses"
    assert server.stats().requests == {expected_endpoint: 4} and stats.requests == 4
    first, second, third = model.agent_requests()
    assert {tool.get("name") or tool["function"]["name"] for tool in first.body["tools"]} == {
        "find_entity", "factual_qa", "timeline", "search", "trend_analysis", "metrics", "office_holders"}
    assert "[" in first.messages[0][1] and "event" in first.messages[0][1]  # the agent prompt asks for citations
    assert all(step in first.input_text for step in TASKS) and QUESTION in first.input_text
    assert tool_outputs(first) == []
    (found,) = [json.loads(output) for _, output in tool_outputs(second)]
    assert found["matches"][0] == {"canonical_id": "cmp_HLIO", "name": "Helio Robotics, Inc.", "type": "Organization",
                                   "matched": "Helio Robotics", "how": "alias", "score": 97.0,
                                   "mentions": found["matches"][0]["mentions"]}
    outputs = tool_outputs(third)
    assert [json.loads(output) for _, output in outputs][0] == found
    facts_sent = json.loads(outputs[1][1])
    assert facts_sent["entity"]["canonical_id"] == "cmp_HLIO" and facts_sent["predicate"] == "HOLDS_ROLE"
    assert facts_sent["start"].startswith("2024-11-01") and facts_sent["end"].startswith("2024-11-30")
    assert facts_sent["total"] == len(facts_sent["facts"]) == result.tool_calls[1].results
    assert {f["predicate"] for f in facts_sent["facts"]} == {"HOLDS_ROLE"}
    assert set(facts_sent["facts"][0]) == {"event_id", "company", "call_date", "subject", "predicate", "object", "value",
                                           "statement", "valid_at", "invalid_at"}
    # the calls the server sees echoed back carry the arguments it made them with
    if api_mode == "chat":
        echoed = [json.loads(c["function"]["arguments"]) for m in third.body["messages"] for c in m.get("tool_calls") or []]
        assert [m["tool_call_id"] for m in third.body["messages"] if m["role"] == "tool"] == [
            c["id"] for m in third.body["messages"] for c in m.get("tool_calls") or []]
    else:
        echoed = [json.loads(i["arguments"]) for i in third.body["input"] if i.get("type") == "function_call"]
    assert echoed == [{"name": "Helio Robotics"}, {"entity": "cmp_HLIO", **FACTUAL_QA_ARGUMENTS}]

    # the answer, and the facts it cites first
    cfo = next(f for f in facts_sent["facts"] if f["value"] == "CFO")
    assert result.answer.endswith(f"[{cfo['event_id']}].") and result.note == ""
    cited = result.facts[0]
    assert cited.event_id == cfo["event_id"] and (cited.subject, cited.value) == ("Marcus J. Ortega", "CFO")
    assert graph.rows("SELECT count(*) AS n FROM facts WHERE event_id = $id AND predicate = 'HOLDS_ROLE'",
                      {"id": cited.event_id})[0]["n"] >= 1
    assert len(result.facts) == len(facts_sent["facts"]) <= 10
    assert {f.event_id for f in result.facts} == {f["event_id"] for f in facts_sent["facts"]}
    assert result.as_dict()["facts"][0]["event_id"] == cited.event_id

    # no secret anywhere: logs, the cache beside the data, the answer
    assert API_KEY not in caplog.text
    assert all(API_KEY.encode() not in path.read_bytes() for path in (tmp_path / "cache").iterdir())
    assert API_KEY not in json.dumps(result.as_dict(), default=str)


def test_an_identical_question_replays_from_the_cache(graph, server, model, tmp_path):
    settings = Settings.resolve(home=tmp_path)
    first = answer_with_model(graph, QUESTION, settings)
    assert server.stats().total_requests == 4
    server.reset_stats()
    stats = StageStats()
    again = answer_with_model(graph, QUESTION, settings, stats=stats)
    assert server.stats().total_requests == 0 and stats.requests == 0 and stats.cache_hits == 4
    assert again == first


def test_a_step_cap_ends_with_a_clear_message(graph, server, model, tmp_path):
    result = answer_with_model(graph, QUESTION, Settings.resolve(home=tmp_path), max_steps=1)
    assert result.answer is None and result.note == "stopped after 1 step without an answer"
    assert result.plan == TASKS and [call.tool for call in result.tool_calls] == ["find_entity"]
    assert server.stats().total_requests == 2  # the plan and one turn
    # what was retrieved stays available
    capped = answer_with_model(graph, QUESTION, Settings.resolve(home=tmp_path), max_steps=2)
    assert capped.answer is None and capped.note == "stopped after 2 steps without an answer"
    assert capped.facts and all(fact.predicate == "HOLDS_ROLE" for fact in capped.facts)


def test_tool_errors_go_back_to_the_model(graph, server, model, tmp_path):
    seen: list[ParsedRequest] = []

    def responder(request: ParsedRequest):
        seen.append(request)
        if request.schema_name == "PlanOut":
            return {"research_tasks": ["Look up Widget Corp"]}
        if not tool_outputs(request):
            return [FunctionCall("factual_qa", {"entity": "Helio Robotics", "start": "late 2024", "end": None,
                                                "predicate": None, "history": None}),
                    FunctionCall("timeline", {"entity": "Nonexistent Widgets Corp", "predicate": None}),
                    FunctionCall("search", '{"text": "margins", "k": 5000, "as_of": null, "company": null}'),
                    FunctionCall("find_entity", '{"name": ')]
        return "The graph holds nothing that answers this."

    server.set_responder(responder)
    result = answer_with_model(graph, "What about Widget Corp?", Settings.resolve(home=tmp_path))
    assert result.answer == "The graph holds nothing that answers this." and result.facts == []
    errors = [call.error for call in result.tool_calls]
    assert [call.results for call in result.tool_calls] == [0, 0, 0, 0] and all(errors)
    sent = [output for _, output in tool_outputs(seen[-1])]
    assert sent == [f"error: {error}" for error in errors]
    assert "'late 2024' is not a date" in sent[0]
    assert "no entity called 'Nonexistent Widgets Corp'" in sent[1]
    assert "k must be between 1 and 50" in sent[2]
    assert "not valid JSON" in sent[3] and result.tool_calls[3].arguments == {"_raw": '{"name": '}


METRICS_ARGUMENTS = {"company": "Helio Robotics", "metric": "revenue", "fiscal_year": 2024, "fiscal_quarter": None,
                     "full_year": True, "kind": "guidance", "segment": None, "as_of": None}


@pytest.mark.parametrize("api_mode", ["responses", "chat"])
def test_the_agent_reads_metrics_and_offices_and_cites_the_rows(graph, server, model, tmp_path, api_mode):
    """Issue 25: the model gets the figures and offices tools; what it cites comes back first."""
    seen: list[ParsedRequest] = []

    def responder(request: ParsedRequest):
        seen.append(request)
        if request.schema_name == "PlanOut":
            return {"research_tasks": ["Read Helio's FY2024 revenue guidance and its revisions from metrics"]}
        outputs = tool_outputs(request)
        if not outputs:
            return [FunctionCall("metrics", METRICS_ARGUMENTS),
                    FunctionCall("office_holders", {"company": "HLIO", "role": "CFO", "start": "2024-01-01", "end": "2024-12-31"}),
                    FunctionCall("metrics", {**METRICS_ARGUMENTS, "company": "Amazon"})]
        figures = json.loads(outputs[0][1])["figures"]
        last = figures[-1]
        return f"Helio guided FY2024 revenue to {last['amount']} on {last['call_date']} [{last['event_id']}]."

    server.set_responder(responder)
    result = answer_with_model(graph, "How did Helio's FY2024 revenue guidance change?", Settings.resolve(home=tmp_path,
                                                                                                        api_mode=api_mode))
    assert [(call.tool, call.results, call.error) for call in result.tool_calls] == [
        ("metrics", 2, None), ("office_holders", 2, None), ("metrics", 0, None)]
    figures, holders, amazon = (json.loads(output) for _, output in tool_outputs(seen[-1]))
    # the chain, oldest first, the first value retired by the raise and restated once before it
    assert [(f["amount"], f["invalid_at"] is not None) for f in figures["figures"]] == [("$1.2 billion", True), ("$1.35 billion", False)]
    assert "revised from" in figures["figures"][0]["revision"]
    assert [h["person"] for h in holders["holders"]] == ["Dana Whitfield", "Marcus J. Ortega"]
    assert amazon["total"] == 0 and "not in the data" in amazon["note"]
    assert result.answer == f"Helio guided FY2024 revenue to $1.35 billion on 2024-08-06 [{figures['figures'][1]['event_id']}]."
    cited = result.facts[0]
    assert (cited.event_id, cited.predicate, cited.value) == (figures["figures"][1]["event_id"], "guidance revenue", "$1.35 billion")
