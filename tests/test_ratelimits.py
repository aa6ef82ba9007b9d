"""Pacing by OpenAI's rate-limit headers, over real HTTP against the fake server's realistic mode."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import openai
import pytest
from pydantic import BaseModel

from fakes.openai_server import OpenAICompatibleServer, ParsedRequest, realistic_settings
from tkg.core.results import StageStats
from tkg.llm.client import LLMClient
from tkg.llm.prompts import RenderedPrompt
from tkg.llm.ratelimits import RateLimitPacer, estimate_tokens, parse_duration, read_limits, stamp_sent_request
from tkg.llm.settings import LLMSettings

MODEL = "gpt-4.1-mini"


class Answer(BaseModel):
    text: str


def sized_responder(request: ParsedRequest) -> dict:
    """Answers with as many output tokens as the prompt asks for (`WANT=n`)."""
    wanted = int(request.input_text.split("WANT=")[1].split()[0])
    return {"text": "x" * (4 * wanted)}


def fire(client: LLMClient, sizes: list[tuple[int, int]], stats: StageStats) -> float:
    """Send one request per (input tokens, output tokens) all at once; the wall time."""
    async def one(input_tokens: int, output_tokens: int) -> None:
        prompt = RenderedPrompt("Answer briefly.", "y" * (4 * input_tokens) + f" WANT={output_tokens} ", "test")
        await client._complete("statements", prompt, Answer, stats)

    async def all_of_them() -> None:
        await asyncio.gather(*(one(i, o) for i, o in sizes))

    started = time.perf_counter()
    client.run(all_of_them())
    return time.perf_counter() - started


def test_reset_durations_and_malformed_headers():
    assert parse_duration("20ms") == pytest.approx(0.02)
    assert parse_duration("1.5s") == pytest.approx(1.5)
    assert parse_duration("6m0s") == pytest.approx(360)
    assert parse_duration("1h2m3s") == pytest.approx(3723)
    assert parse_duration("soon") is None and parse_duration("5x") is None
    good = {"x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "10", "x-ratelimit-reset-tokens": "59s"}
    assert read_limits(good)["tokens"].remaining == 10
    # A third-party server's nonsense is not trusted: the kind is left out.
    assert read_limits({**good, "x-ratelimit-remaining-tokens": "lots"}) == {}
    assert read_limits({**good, "x-ratelimit-remaining-tokens": "2000"}) == {}  # more than the limit
    assert read_limits({**good, "x-ratelimit-reset-tokens": ""}) == {}


def test_paced_requests_spend_the_token_budget_without_429s():
    """Tokens worth about 1.15 minutes of the TPM budget: the first minute's worth goes at once
    (the budget starts full), the rest as it refills; no request collides with the limit, and
    concurrency rises past the fallback window to what the budget allows. (The overflow past one
    minute's budget is what the test waits for, so it is kept small: the pacing is the same.)"""
    tpm, rpm = 30_000, 1_000
    rng = random.Random(7)
    sizes = [(rng.randint(150, 450), rng.randint(10, 80)) for _ in range(85)]
    provider = realistic_settings(rpm=rpm, tpm=tpm, ttft_s=0.2, output_tokens_per_s=400.0)
    with OpenAICompatibleServer(sized_responder, provider=provider) as server:
        client = LLMClient(LLMSettings(base_url=server.base_url, max_in_flight=4, max_attempts=6), "sk-test")
        try:
            stats = StageStats()
            wall = fire(client, sizes, stats)
            served = server.stats()
            assert client.pacer.announces(MODEL) is True
        finally:
            client.close()
    tokens = served.input_tokens + served.output_tokens
    assert tokens > 1.1 * tpm  # the budget binds: more than 6 s of refill to wait for
    assert served.status_200 == len(sizes)
    assert served.status_429 <= 0.01 * served.total_requests, served
    # It waited for the budget to refill rather than colliding (how close it comes to the bound is
    # a speed figure: benchmarks/bench_llm.py measures it, a loaded machine only makes this slower).
    assert wall >= 0.8 * max((tokens - tpm) / tpm, (len(sizes) - rpm) / rpm) * 60, wall
    assert served.max_concurrency > 4  # not held to the fallback window


def test_requests_per_minute_budget_is_waited_for_not_collided_with():
    rpm = 120  # two a second
    sizes = [(50, 5)] * 130  # the first 120 at once, then 10 at two a second
    provider = realistic_settings(rpm=rpm, tpm=1_000_000, ttft_s=0.05)
    with OpenAICompatibleServer(sized_responder, provider=provider) as server:
        client = LLMClient(LLMSettings(base_url=server.base_url, max_in_flight=8), "sk-test")
        try:
            wall = fire(client, sizes, StageStats())
            served = server.stats()
        finally:
            client.close()
    assert served.status_200 == len(sizes) and served.status_429 <= 1
    assert wall >= (len(sizes) - rpm) / (rpm / 60) * 0.8, wall  # the last 10 waited for the minute's budget to refill


def test_a_429_pauses_for_retry_after_and_keeps_the_throughput():
    """Another client spends the same budget behind tkg's back: the 429 that follows pauses the
    model until the provider's retry-after, then pacing carries on at the full rate."""
    tpm = 20_000
    provider = realistic_settings(rpm=10_000, tpm=tpm, ttft_s=0.05)
    with OpenAICompatibleServer(sized_responder, provider=provider) as server:
        client = LLMClient(LLMSettings(base_url=server.base_url, max_in_flight=4, max_attempts=8), "sk-test")
        try:
            fire(client, [(100, 5)] * 4, StageStats())  # learn the budgets
            # The other client: most of the remaining budget, unseen by tkg.
            other = openai.OpenAI(base_url=server.base_url, api_key="other", max_retries=0)
            other.responses.create(model=MODEL, input="z" * 4 * 15_000 + " WANT=1 ")
            stats = StageStats()
            # About 4,600 tokens are left and the burst spends 6,400: the overflow, and so the
            # wait, is kept small (the refill while the burst goes out is far less than it).
            fire(client, [(1_600, 5)] * 4, stats)
            # The burst sent on the stale budget collides; after the pause every one of them
            # gets through on its first retry, and nothing is lost.
            assert stats.rate_limited >= 1 and stats.requests == 4 + stats.rate_limited
            assert stats.retries == stats.rate_limited and not stats.dropped_total
            assert client.pacer._models[MODEL].reserve > 0.02  # the estimate was widened
        finally:
            client.close()


def test_a_server_without_rate_limit_headers_keeps_the_adaptive_window():
    """The slots model sends no x-ratelimit-* headers, like many OpenAI-compatible servers: the
    client stays on the adaptive window, which a 429 shrinks, and loses nothing."""
    with OpenAICompatibleServer(sized_responder, latency_s=0.05, max_in_flight=3, retry_after_s=0.05) as server:
        # 6 callers on 3 slots: a request can meet a full server many times running before the
        # window shrinks; enough attempts that none is lost to bad luck (the point is the window)
        client = LLMClient(LLMSettings(base_url=server.base_url, max_in_flight=6, max_attempts=40), "sk-test")
        try:
            stats = StageStats()
            fire(client, [(50, 5)] * 40, stats)
            served = server.stats()
            assert client.pacer.announces(MODEL) is False
        finally:
            client.close()
    assert served.status_200 == 40 and served.status_429 == stats.rate_limited > 0


def test_a_request_the_provider_admits_late_is_not_spent_twice():
    """Requests reach the provider in another order than the client sent them (a new connection
    against a kept-alive one, a provider working through a queue). Here request A goes out
    first but is admitted only after B has been answered: B's headers do not include A, so the
    copy of the budget must still count A, or the next burst spends A's tokens again and
    collides (what made bench_llm's statements stage meet 429s on a busy machine)."""
    tpm = 12_000  # 200 tokens a second: the refill during the scenario is small beside A
    provider = realistic_settings(rpm=10_000, tpm=tpm, ttft_s=0.05, output_tokens_per_s=1_000.0)

    async def scenario(base_url: str) -> list[int]:
        pacer = RateLimitPacer(fallback_max_in_flight=4)
        held = asyncio.Event()

        async def send(input_tokens: int, output_tokens: int, hold: bool = False) -> int:
            text = "y" * (4 * input_tokens) + f" WANT={output_tokens} "
            body = json.dumps({"model": MODEL, "input": text}).encode()
            ticket = await pacer.acquire(MODEL, estimate_tokens(text), output_tokens)

            async def slowly():  # the request is on its way, but the provider has not got all of it
                yield body[:20]
                await held.wait()
                yield body[20:]

            response = await http.post("/responses", content=slowly() if hold else body,
                                       headers={"content-type": "application/json"})
            await pacer.release(ticket, response.headers, rate_limited=response.status_code == 429,
                                output_tokens=response.json()["usage"]["output_tokens"] if response.status_code == 200 else None)
            return response.status_code

        async with httpx.AsyncClient(base_url=base_url, timeout=60,
                                     event_hooks={"request": [stamp_sent_request]}) as http:
            statuses = [await send(50, 5)]  # learn the budgets
            a = asyncio.ensure_future(send(6_000, 1_500, hold=True))  # out first, admitted last
            await asyncio.sleep(0.3)
            statuses.append(await send(50, 5))  # answered while A is still on its way
            held.set()
            await asyncio.sleep(0.2)  # A is admitted: its 7,500 tokens are gone from the budget
            statuses += await asyncio.gather(*(send(1_000, 5) for _ in range(5)))
            statuses.append(await a)
        return statuses

    with OpenAICompatibleServer(sized_responder, provider=provider) as server:
        statuses = asyncio.run(scenario(server.base_url))
        served = server.stats()
    assert statuses.count(200) == len(statuses) == 8, statuses
    assert served.status_429 == 0, served
