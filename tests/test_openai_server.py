"""The local OpenAI-compatible server, exercised through the real ``openai`` SDK over HTTP."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Literal, Optional

import httpx
import numpy as np
import openai
import pydantic
import pytest
from pydantic import BaseModel

from fakes.openai_server import (
    Fault,
    OpenAICompatibleServer,
    ParsedRequest,
    approx_tokens,
    minimal_instance,
    schema_violation_instance,
)

MODEL = "gpt-4.1-mini"


class Speaker(BaseModel):
    name: str
    role: Literal["executive", "analyst", "operator"]
    company: Optional[str]


class Extraction(BaseModel):
    call_date: date
    speakers: list[Speaker]
    main_speaker: Speaker
    confidence: float


@pytest.fixture
def server():
    with OpenAICompatibleServer() as srv:
        yield srv


@pytest.fixture
def client(server):
    # max_retries=0: tests must see every raw fault, not the SDK's retries.
    with openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0) as c:
        yield c


def test_responses_parse_round_trips_a_responder_dict(server, client):
    seen: list[ParsedRequest] = []

    def responder(req: ParsedRequest) -> dict:
        seen.append(req)
        name = "Jane Doe" if "MARKER-42" in req.input_text else "nobody"
        speaker = {"name": name, "role": "executive", "company": "Acme"}
        return {"call_date": "2024-05-01", "speakers": [speaker], "main_speaker": speaker, "confidence": 0.9}

    server.set_responder(responder)
    resp = client.responses.parse(
        model=MODEL, instructions="Extract speakers.", input="Transcript MARKER-42 ...", text_format=Extraction
    )

    parsed = resp.output_parsed
    assert isinstance(parsed, Extraction)
    assert parsed.main_speaker.name == "Jane Doe" and parsed.call_date == date(2024, 5, 1)
    (req,) = seen
    assert req.endpoint == "responses" and req.model == MODEL and req.format_type == "json_schema"
    assert req.schema_name == "Extraction" and "main_speaker" in req.schema["properties"]
    assert req.input_text == "Extract speakers.\n\nTranscript MARKER-42 ..."
    assert req.messages == (("developer", "Extract speakers."), ("user", "Transcript MARKER-42 ..."))
    assert req.body["text"]["format"]["strict"] is True


def test_default_responder_answers_a_minimal_valid_instance(client):
    resp = client.responses.parse(model=MODEL, input=[{"role": "user", "content": "x"}], text_format=Extraction)
    assert resp.output_parsed == Extraction(
        call_date=date(1970, 1, 1), speakers=[], main_speaker=Speaker(name="", role="executive", company=None),
        confidence=0.0,
    )
    assert resp.output[0].type == "message" and resp.output[0].content[0].type == "output_text"


def test_minimal_instance_walks_refs_unions_and_bounds():
    schema = {
        "$defs": {"Tag": {"type": "object", "properties": {"v": {"enum": ["x", "y"]}}, "required": ["v"]}},
        "type": "object",
        "properties": {
            "tag": {"$ref": "#/$defs/Tag"},
            "maybe": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "either": {"anyOf": [{"type": "integer", "minimum": 3}, {"type": "string"}]},
            "nullable": {"type": ["number", "null"]},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "minItems": 1},
            "flag": {"type": "boolean"},
            "code": {"type": "string", "minLength": 2},
            "optional": {"type": "string"},
        },
        "required": ["tag", "maybe", "either", "nullable", "tags", "flag", "code"],
    }
    assert minimal_instance(schema) == {
        "tag": {"v": "x"}, "maybe": None, "either": 3, "nullable": None, "tags": [{"v": "x"}], "flag": False,
        "code": "aa",
    }
    assert schema_violation_instance(schema) == {
        "maybe": None, "either": 3, "nullable": None, "tags": [{"v": "x"}], "flag": False, "code": "aa",
    }


def test_chat_completions_with_json_schema(server, client):
    seen: list[ParsedRequest] = []
    server.set_responder(lambda req: seen.append(req) or {"answer": "yes", "n": 2})
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["answer", "n"],
        "additionalProperties": False,
    }
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Is it?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "Answer", "schema": schema, "strict": True}},
    )

    assert json.loads(completion.choices[0].message.content) == {"answer": "yes", "n": 2}
    assert completion.choices[0].finish_reason == "stop"
    usage = completion.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert seen[0].endpoint == "chat.completions" and seen[0].schema_name == "Answer" and seen[0].schema == schema
    assert seen[0].input_text == "Be terse.\n\nIs it?"

    # The SDK's own structured-output helper works on this endpoint too.
    server.set_responder(None)
    parsed = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                           response_format=Speaker)
    assert parsed.choices[0].message.parsed == Speaker(name="", role="executive", company=None)


def test_embeddings_are_deterministic_unit_vectors(client):
    texts = ["revenue grew", "margins fell", "revenue grew"]
    # Without encoding_format the SDK asks for base64 and decodes it itself.
    default = client.embeddings.create(model="text-embedding-3-small", input=texts, dimensions=256)
    floats = client.embeddings.create(model="text-embedding-3-small", input=texts, dimensions=256,
                                      encoding_format="float")

    vectors = np.array([d.embedding for d in default.data])
    assert vectors.shape == (3, 256)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(vectors[0], vectors[2]) and not np.allclose(vectors[0], vectors[1])
    assert np.allclose(vectors, np.array([d.embedding for d in floats.data]), atol=1e-7)
    assert [d.index for d in default.data] == [0, 1, 2]
    assert default.usage.prompt_tokens == sum(approx_tokens(t) for t in texts)

    native = client.embeddings.create(model="text-embedding-3-large", input="x", encoding_format="float")
    assert len(native.data[0].embedding) == 3072


def test_embeddings_base64_wire_format(server):
    raw = httpx.post(server.base_url + "/embeddings",
                     json={"model": "m", "input": "abc", "dimensions": 8, "encoding_format": "base64"}).json()
    vector = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert vector.shape == (8,) and abs(np.linalg.norm(vector) - 1) < 1e-5


def test_concurrency_limit_answers_429_with_retry_after(server):
    server.configure(latency_s=0.3, max_in_flight=32, retry_after_s=1)

    async def fire() -> tuple[list, list]:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0) as aclient:
            results = await asyncio.gather(
                *(aclient.responses.create(model=MODEL, input=f"req {i}") for i in range(40)),
                return_exceptions=True,
            )
        ok = [r for r in results if not isinstance(r, Exception)]
        limited = [r for r in results if isinstance(r, openai.RateLimitError)]
        return ok, limited

    start = time.monotonic()
    ok, limited = asyncio.run(fire())
    elapsed = time.monotonic() - start

    assert limited, "expected some requests over the in-flight limit to get 429"
    assert len(ok) + len(limited) == 40 and len(ok) >= 32
    assert elapsed < 3, "latency must overlap across concurrent requests"
    err = limited[0]
    assert err.status_code == 429
    assert err.response.headers["retry-after"] == "1" and err.response.headers["retry-after-ms"] == "1000"
    assert err.body["type"] == "rate_limit_error" and err.body["code"] == "rate_limit_exceeded"
    stats = server.stats()
    assert stats.max_concurrency == 32
    assert stats.status_429_limit == len(limited) and stats.status_429_injected == 0
    assert stats.status_200 == len(ok) and stats.in_flight == 0


def test_scripted_faults(server, client):
    server.queue_faults("429", "500", "garbage", "schema_violation")

    with pytest.raises(openai.RateLimitError) as rate_limited:
        client.responses.create(model=MODEL, input="a")
    assert rate_limited.value.response.headers["retry-after"] == "1"
    assert rate_limited.value.body["code"] == "rate_limit_exceeded"

    with pytest.raises(openai.InternalServerError) as server_error:
        client.responses.create(model=MODEL, input="b")
    assert server_error.value.status_code == 500 and server_error.value.body["type"] == "server_error"

    garbage = client.responses.create(model=MODEL, input="c", text={"format": {"type": "json_object"}})
    with pytest.raises(json.JSONDecodeError):
        json.loads(garbage.output_text)

    with pytest.raises(pydantic.ValidationError, match="call_date"):  # valid JSON, missing a required field
        client.responses.parse(model=MODEL, input="d", text_format=Extraction)

    assert client.responses.parse(model=MODEL, input="e", text_format=Speaker).output_parsed is not None
    stats = server.stats()
    assert (stats.status_429_injected, stats.status_500, stats.garbage, stats.schema_violations) == (1, 1, 1, 1)
    assert stats.status_200 == 3 and stats.requests == {"responses": 5}


def test_timeout_fault_stalls_until_the_client_gives_up(server, client):
    server.queue_faults(Fault("timeout", seconds=30))
    start = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.5).responses.create(model=MODEL, input="slow")
    assert time.monotonic() - start < 5
    assert client.responses.create(model=MODEL, input="fast").output_text == "ok"
    assert server.stats().timeouts == 1
    # The server notices the hang-up and frees the stalled request's slot.
    deadline = time.monotonic() + 10  # waited for, not slept: generous for a loaded machine
    while server.stats().in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.stats().in_flight == 0


def test_content_faults_wait_for_a_generation_request(server, client):
    server.queue_faults("garbage")
    client.embeddings.create(model="text-embedding-3-small", input="x")
    assert server.pending_faults() == [Fault("garbage")]
    assert client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}]) \
        .choices[0].message.content.startswith("Sure!")
    assert server.pending_faults() == []


def test_random_faults_are_reproducible_with_a_seed(server, client):
    def outcomes() -> list[str]:
        seq = []
        for i in range(30):
            try:
                client.responses.create(model=MODEL, input=str(i))
                seq.append("ok")
            except openai.APIStatusError as exc:
                seq.append(str(exc.status_code))
        return seq

    server.configure(p_429=0.3, p_500=0.2, seed=7)
    first = outcomes()
    server.configure(seed=7)
    assert outcomes() == first
    assert {"ok", "429", "500"} <= set(first)
    stats = server.stats()
    assert stats.status_429_injected == 2 * first.count("429") and stats.status_500 == 2 * first.count("500")


def test_token_counts_follow_the_approximation(server, client):
    seen: list[ParsedRequest] = []
    server.set_responder(lambda req: seen.append(req) or {"name": "Al", "role": "analyst", "company": None})
    resp = client.responses.parse(model=MODEL, instructions="Find the analyst.", input="Al asked a question.",
                                  text_format=Speaker)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello there"}])

    req = seen[0]
    schema_json = json.dumps(req.body["text"]["format"], separators=(",", ":"))
    assert req.rendered_prompt == schema_json + "\n\nFind the analyst.\n\nAl asked a question."
    usage = resp.usage
    assert usage.input_tokens == approx_tokens(req.rendered_prompt) > approx_tokens(schema_json) > 0
    assert usage.output_tokens == approx_tokens(resp.output_text) > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0 and usage.output_tokens_details.reasoning_tokens == 0
    assert chat.usage.prompt_tokens == approx_tokens("hello there")
    assert chat.usage.completion_tokens == approx_tokens(chat.choices[0].message.content)

    stats = server.stats()
    assert stats.input_tokens == usage.input_tokens + chat.usage.prompt_tokens
    assert stats.output_tokens == usage.output_tokens + chat.usage.completion_tokens


def test_prompt_caching_reports_shared_prefix_blocks(server, client):
    prefix = "Static system prompt. " * 1000  # 22,000 chars = 5,500 tokens: five full 1024-token blocks
    first = client.responses.create(model=MODEL, instructions=prefix, input="call one")
    second = client.responses.create(model=MODEL, instructions=prefix, input="call two")
    other_model = client.responses.create(model="gpt-4o-mini", instructions=prefix, input="call three")

    assert first.usage.input_tokens_details.cached_tokens == 0
    assert second.usage.input_tokens_details.cached_tokens == 5 * 1024
    assert other_model.usage.input_tokens_details.cached_tokens == 0
    assert server.stats().cached_tokens == 5 * 1024
    server.clear_prompt_cache()
    assert client.responses.create(model=MODEL, instructions=prefix, input="x").usage \
        .input_tokens_details.cached_tokens == 0


def test_stats_endpoint_and_reset(server, client):
    client.responses.create(model=MODEL, input="a")
    client.models.list()
    assert httpx.post(server.base_url + "/responses", content=b"{not json").status_code == 400

    stats = httpx.get(server.url + "/_stats").json()
    assert stats["requests"] == {"responses": 2, "models": 1} and stats["total_requests"] == 3
    assert stats["status_200"] == 1 and stats["status_400"] == 1 and stats["input_tokens"] > 0

    server.reset_stats()
    after = server.stats()
    assert after.requests == {} and after.status_200 == 0 and after.input_tokens == 0 and after.max_concurrency == 0


def test_api_key_never_reaches_logs_or_state(server, caplog):
    secret = "sk-very-secret-key-123"
    caplog.set_level(logging.DEBUG)

    def broken(req: ParsedRequest) -> str:
        raise RuntimeError("boom")  # forces the server to log an error

    server.set_responder(broken)
    with openai.OpenAI(base_url=server.base_url, api_key=secret, max_retries=0) as c:
        with pytest.raises(openai.InternalServerError, match="boom"):
            c.responses.create(model=MODEL, input="x")
    assert "responder failed" in caplog.text and secret not in caplog.text
    assert secret not in repr(vars(server)) and server.stats().responder_errors == 1


def test_runs_as_a_separate_process():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fakes.openai_server", "--port", "0", "--log-level", "warning"],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    try:
        line = proc.stdout.readline()
        base_url = line.strip().rsplit(" ", 1)[-1]
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1"), line
        with openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as c:
            assert "gpt-4.1-mini" in [m.id for m in c.models.list()]
            assert c.responses.parse(model=MODEL, input="x", text_format=Speaker).output_parsed.role == "executive"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_http_control_endpoints_reset_and_configure():
    import httpx

    with OpenAICompatibleServer(latency_s=0.0) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        client.embeddings.create(model="text-embedding-3-small", input=["a"], dimensions=8)
        assert httpx.post(f"{server.url}/_reset").json()["requests"]["embeddings"] == 1
        assert server.stats().total_requests == 0
        changed = httpx.post(f"{server.url}/_configure", json={"p_500": 1.0, "seed": 2}).json()
        assert changed["p_500"] == 1.0
        with pytest.raises(openai.InternalServerError):
            client.embeddings.create(model="text-embedding-3-small", input=["a"], dimensions=8)
        assert httpx.post(f"{server.url}/_configure", json={"nonsense": 1}).status_code == 400


# --------------------------------------------------------------------------- realistic mode and batches


def test_realistic_latency_grows_with_the_tokens_generated():
    from fakes.openai_server import realistic_settings

    def responder(request: ParsedRequest) -> str:
        return "w" * (4 * int(request.input_text.split("=")[1]))  # that many output tokens

    provider = realistic_settings(ttft_s=0.1, output_tokens_per_s=200.0)
    with OpenAICompatibleServer(responder, provider=provider) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
        client.responses.create(model=MODEL, input="n=1")  # connection and first-request costs out of the way
        timings = {}
        for tokens in (10, 200):
            started = time.perf_counter()
            client.responses.create(model=MODEL, input=f"n={tokens}")
            timings[tokens] = time.perf_counter() - started
    assert timings[10] >= 0.1 + 10 / 200 and timings[200] >= 0.1 + 200 / 200
    # the difference is the 190 extra tokens at 200 a second (a loaded machine adds to both)
    assert 0.9 <= timings[200] - timings[10] < 0.95 + 0.4


def test_realistic_budgets_announce_openai_headers_and_answer_429_as_openai_does():
    from fakes.openai_server import realistic_settings

    provider = realistic_settings(rpm=2, tpm=100_000, ttft_s=0.0)
    with OpenAICompatibleServer(provider=provider) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
        first = client.responses.with_raw_response.create(model=MODEL, input="hello")
        headers = first.headers
        assert headers["x-ratelimit-limit-requests"] == "2" and headers["x-ratelimit-remaining-requests"] == "1"
        assert headers["x-ratelimit-limit-tokens"] == "100000"
        assert int(headers["x-ratelimit-remaining-tokens"]) == 100_000 - first.parse().usage.input_tokens
        assert headers["x-ratelimit-reset-requests"].endswith("s") and headers["x-ratelimit-reset-tokens"].endswith("s")
        client.responses.create(model=MODEL, input="hello")
        with pytest.raises(openai.RateLimitError) as caught:
            client.responses.create(model=MODEL, input="hello")
        error = caught.value
        assert error.body["type"] == "requests" and error.body["code"] == "rate_limit_exceeded"
        assert error.body["message"].startswith(f"Rate limit reached for {MODEL} in organization ")
        assert "on requests per min (RPM): Limit 2, Used 2, Requested 1. Please try again in" in error.body["message"]
        wait_ms = int(error.response.headers["retry-after-ms"])
        assert 25_000 <= wait_ms <= 30_000  # half a minute refills one request of two per minute
        assert error.response.headers["x-ratelimit-remaining-requests"] == "0"
        # Embeddings have their own model, so their own budget.
        assert client.embeddings.create(model="text-embedding-3-small", input=["a"], dimensions=4).data
        # A request larger than the whole tokens budget can never pass, and says so.
        server.configure(tpm=50, rpm=1000)
        with pytest.raises(openai.RateLimitError, match="Request too large"):
            client.responses.create(model=MODEL, input="x" * 400)


def test_batch_files_round_trip_with_error_lines_and_scripted_outcomes():
    import io

    def jsonl(*ids: str) -> bytes:
        return "".join(json.dumps({"custom_id": i, "method": "POST", "url": "/v1/responses",
                                   "body": {"model": MODEL, "input": f"say {i}"}}) + "\n" for i in ids).encode()

    with OpenAICompatibleServer(seed=4) as server:
        server.configure(batch_completion_s=0.1, p_batch_line_error=0.5)
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
        upload = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(*map(str, range(20)))), "application/jsonl"),
                                     purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h")
        assert batch.status == "in_progress" and batch.request_counts.total == 20
        time.sleep(0.2)
        done = client.batches.retrieve(batch.id)
        assert done.status == "completed"
        outputs = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
        errors = [json.loads(line) for line in client.files.content(done.error_file_id).text.splitlines()]
        assert sorted(o["custom_id"] for o in outputs + errors) == sorted(map(str, range(20)))
        assert outputs and errors and done.request_counts.failed == len(errors)
        assert all(o["response"]["status_code"] == 200 and o["response"]["body"]["object"] == "response" for o in outputs)
        assert all(e["response"]["status_code"] == 500 for e in errors)

        server.configure(p_batch_line_error=0.0)
        server.queue_batch_outcomes("expired")
        expired = client.batches.create(input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h")
        time.sleep(0.2)
        expired = client.batches.retrieve(expired.id)
        assert expired.status == "expired" and expired.output_file_id is None
        assert all(json.loads(line)["error"]["code"] == "batch_expired"
                   for line in client.files.content(expired.error_file_id).text.splitlines())

        mixed = client.files.create(file=("bad.jsonl", io.BytesIO(jsonl("a", "a")), "application/jsonl"), purpose="batch")
        invalid = client.batches.create(input_file_id=mixed.id, endpoint="/v1/responses", completion_window="24h")
        assert invalid.status == "failed" and "duplicate custom_id" in invalid.errors.data[0].message
        assert server.stats().batches_created == 3 and server.stats().files_uploaded == 2
