"""Transport to OpenAI or an OpenAI-compatible server.

One `LLMClient` per process owns an event loop in a background thread. Every stage submits
its requests to that loop, so one adaptive limiter bounds the requests in flight across all
stages and threads, and no stage ever calls `asyncio.run` inside someone else's loop.

- Rate limits are the real constraint: on a 429 the limiter lowers the allowed concurrency,
  the request waits the provider's Retry-After, and the limit grows back one slot at a time.
- Structured outputs use the JSON schemas the SDK derives from the pydantic models in
  `tkg.llm.wire` (strict mode); answers are parsed by our lenient parsers, which repair
  near-misses instead of throwing whole answers away.
- 5xx, timeouts and connection errors retry with exponential backoff and jitter (tenacity).
- An answer that cannot be used is re-asked once with the reason; then the caller drops the
  item and counts it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

import numpy as np
import openai
from openai.lib._parsing._completions import type_to_response_format_param
from openai.lib._parsing._responses import type_to_text_format_param
from pydantic import BaseModel
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from tkg.core.results import StageStats
from tkg.llm.prompts import RenderedPrompt
from tkg.llm.settings import LLMSettings
from tkg.llm.ratelimits import AdaptiveLimiter, RateLimitPacer, estimate_tokens, retry_after_s, stamp_sent_request
from tkg.llm.wire import InvalidOutput, RequestFailed

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRYABLE = (openai.RateLimitError, openai.InternalServerError, openai.APITimeoutError, openai.APIConnectionError)


@dataclass
class Answered:
    """What a request function returns when it read the answer's headers: the value, the
    headers (for the pacer) and the output tokens generated."""

    value: Any
    headers: Mapping[str, str] | None
    output_tokens: int | None = None


__all__ = ["AdaptiveLimiter", "Answered", "LLMClient", "RequestFailed"]


@lru_cache(maxsize=32)
def _response_formats(schema: type[BaseModel]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The strict JSON-schema formats the SDK's `parse` helpers build from a pydantic model,
    for the Responses API and for chat completions; built once per schema, not per request."""
    return type_to_text_format_param(schema), type_to_response_format_param(schema)


@lru_cache(maxsize=32)
def _format_tokens(schema: type[BaseModel]) -> int:
    """Tokens the structured-output format adds to a prompt (the provider counts the schema)."""
    return estimate_tokens(json.dumps(_response_formats(schema)[0], separators=(",", ":")))


# Output tokens expected of a stage's request before any answer has said (a statements answer
# runs to a few hundred tokens); afterwards the stage's running mean.
DEFAULT_EXPECTED_OUTPUT = 512


class LLMClient:
    """Async OpenAI client on a private loop, with limiter, retries, re-ask and accounting."""

    def __init__(self, settings: LLMSettings, api_key: str | None) -> None:
        if not api_key and not settings.base_url:
            raise ValueError("the openai backend needs OPENAI_API_KEY, or OPENAI_BASE_URL for a local server; "
                             "set one, or TKG_LLM=offline")
        self.settings = settings
        self._api_key = api_key or "not-needed-for-a-local-server"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tkg-llm-loop", daemon=True)
        self._thread.start()
        self._client: openai.AsyncOpenAI | None = None
        self._pacer: RateLimitPacer | None = None
        self._expected_output: dict[str, float] = {}
        self.batches = None  # a BatchRunner in batch mode (tkg.llm.batch), set by whoever knows the home

    def __repr__(self) -> str:  # never show the key
        return f"LLMClient(base_url={self.settings.base_url!r}, api_mode={self.settings.api_mode!r})"

    def run(self, coroutine: Awaitable[T]) -> T:
        """Run a coroutine on the client's loop from any thread and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _ensure(self) -> tuple[openai.AsyncOpenAI, RateLimitPacer]:
        if self._client is None:
            # The request hook stamps when each request really goes out, for the pacer's accounts.
            http_client = openai.DefaultAsyncHttpxClient(event_hooks={"request": [stamp_sent_request]})
            self._client = openai.AsyncOpenAI(api_key=self._api_key, base_url=self.settings.base_url,
                                              timeout=self.settings.timeout_s, max_retries=0, http_client=http_client)
            self._pacer = RateLimitPacer(self.settings.max_in_flight, self.settings.paced_max_in_flight)
        return self._client, self._pacer

    @property
    def pacer(self) -> RateLimitPacer:
        return self._ensure()[1]

    def expected_output(self, stage: str) -> int:
        """Output tokens a request of `stage` is expected to generate: the running mean of its answers."""
        return round(self._expected_output.get(stage, DEFAULT_EXPECTED_OUTPUT))

    def _observe_output(self, stage: str, tokens: int) -> None:
        previous = self._expected_output.get(stage)
        self._expected_output[stage] = float(tokens) if previous is None else 0.8 * previous + 0.2 * tokens

    async def _with_retries(self, stage: str, stats: StageStats, call: Callable[[], Awaitable[T | Answered]], *,
                            model: str | None = None, input_tokens: int = 0) -> T:
        """`call` with retries, paced by the provider's budgets for `model` (the stage's model
        unless given); `input_tokens` is the request's estimated prompt size. A `call` that
        returns `Answered` hands the pacer the answer's headers and output tokens."""
        _, pacer = self._ensure()
        model = model or self.settings.model(stage)

        def wait(state: RetryCallState) -> float:
            error = state.outcome.exception() if state.outcome else None
            response = getattr(error, "response", None) if isinstance(error, openai.RateLimitError) else None
            hinted = retry_after_s(getattr(response, "headers", None))
            return hinted if hinted is not None else wait_exponential_jitter(initial=0.5, max=30)(state)

        def before_sleep(state: RetryCallState) -> None:
            stats.retries += 1
            error = state.outcome.exception()
            log.info("stage %s: retrying after %s (attempt %d)", stage, type(error).__name__, state.attempt_number)

        try:
            async for attempt in AsyncRetrying(retry=retry_if_exception(lambda e: isinstance(e, RETRYABLE)),
                                               wait=wait, stop=stop_after_attempt(self.settings.max_attempts),
                                               before_sleep=before_sleep, reraise=True):
                with attempt:
                    ticket = await pacer.acquire(model, input_tokens, self.expected_output(stage))
                    started = time.perf_counter()
                    try:
                        result = await call()
                    except openai.RateLimitError as error:
                        stats.rate_limited += 1
                        await pacer.release(ticket, error.response.headers, rate_limited=True)
                        raise
                    except openai.APIStatusError as error:
                        await pacer.release(ticket, error.response.headers)
                        raise
                    except BaseException:
                        await pacer.release(ticket, None, answered=False)
                        raise
                    headers, output_tokens = None, None
                    if isinstance(result, Answered):
                        result, headers, output_tokens = result.value, result.headers, result.output_tokens
                    if output_tokens is not None:
                        self._observe_output(stage, output_tokens)
                    await pacer.release(ticket, headers, output_tokens=output_tokens)
                    stats.latencies_ms.append((time.perf_counter() - started) * 1000)
                    return result
        except RETRYABLE as error:
            raise RequestFailed(f"{type(error).__name__} after {self.settings.max_attempts} attempts") from error
        except openai.APIStatusError as error:  # 4xx other than 429: a bad request will not get better
            raise RequestFailed(f"HTTP {error.status_code}: {error.message}") from error
        raise AssertionError("unreachable")

    def request_mode(self, stage: str) -> str:
        """How `stage`'s requests go: 'batch' through the Batch API (batch mode, a runner set, and
        not embeddings, which stay synchronous), else 'sync'."""
        batched = self.settings.llm_mode == "batch" and self.batches is not None and stage != "embeddings"
        return "batch" if batched else "sync"

    def request_body(self, stage: str, prompt: RenderedPrompt, schema: type[BaseModel]) -> dict[str, Any]:
        """The JSON body of a structured request for `stage`, as the synchronous call and a
        Batch API line both send it."""
        text_format, chat_format = _response_formats(schema)
        body: dict[str, Any] = {"model": self.settings.model(stage), "temperature": self.settings.temperature}
        if self.settings.service_tier and self.settings.llm_mode != "batch":  # a batch has its own price
            body["service_tier"] = self.settings.service_tier
        if self.settings.api_mode == "chat":
            body["response_format"] = chat_format
            body["messages"] = [{"role": "system", "content": prompt.instructions}, {"role": "user", "content": prompt.input}]
        else:
            body.update(text={"format": text_format}, instructions=prompt.instructions, input=prompt.input)
        return body

    def read_answer(self, response: Any, model: str, stats: StageStats, *, batch: bool = False) -> tuple[str, int]:
        """(text, output tokens) of a Responses or chat answer; its tokens and cost go into `stats`
        (at the Batch API's price when `batch`)."""
        usage = response.usage
        if self.settings.api_mode == "chat":
            details = getattr(usage, "prompt_tokens_details", None) if usage else None
            tokens = (usage.prompt_tokens, getattr(details, "cached_tokens", 0) or 0, usage.completion_tokens) if usage else (0, 0, 0)
            text = response.choices[0].message.content or ""
        else:
            tokens = (usage.input_tokens, getattr(usage.input_tokens_details, "cached_tokens", 0) or 0,
                      usage.output_tokens) if usage else (0, 0, 0)
            text = response.output_text or ""
        stats.input_tokens += tokens[0]
        stats.cached_input_tokens += tokens[1]
        stats.output_tokens += tokens[2]
        stats.cost_usd += self.settings.cost_usd(model, *tokens, batch=batch)
        stats.sync_cost_usd += self.settings.cost_usd(model, *tokens)
        return text, tokens[2]

    async def _complete(self, stage: str, prompt: RenderedPrompt, schema: type[BaseModel], stats: StageStats) -> str:
        """The answer's text; its tokens and cost go into `stats`."""
        client, _ = self._ensure()
        body = self.request_body(stage, prompt, schema)
        if self.request_mode(stage) == "batch":
            return await self.batches.complete(stage, body, stats)

        async def call() -> Answered:
            stats.requests += 1
            if self.settings.api_mode == "chat":
                raw = await client.chat.completions.with_raw_response.create(**body)
            else:
                raw = await client.responses.with_raw_response.create(**body)
            text, output_tokens = self.read_answer(raw.parse(), body["model"], stats)
            return Answered(text, raw.headers, output_tokens)

        estimate = estimate_tokens(prompt.instructions, prompt.input) + _format_tokens(schema)
        return await self._with_retries(stage, stats, call, model=body["model"], input_tokens=estimate)

    async def structured(self, stage: str, prompt: RenderedPrompt, schema: type[BaseModel],
                         parse: Callable[[str], T], stats: StageStats) -> T:
        """Request, parse with `parse`; on InvalidOutput re-ask once with the reason.

        Raises InvalidOutput (still unusable) or RequestFailed (transport gave up)."""
        try:
            return parse(await self._complete(stage, prompt, schema, stats))
        except InvalidOutput as error:
            stats.reasks += 1
            log.info("stage %s: re-asking once: %s", stage, error)
            retry = RenderedPrompt(prompt.instructions, f"{prompt.input}\n\nYour previous answer could not be used: {error}. "
                                   "Answer again with JSON that matches the schema exactly.", prompt.template_sha256)
            return parse(await self._complete(stage, retry, schema, stats))

    async def embed(self, texts: list[str], stats: StageStats) -> np.ndarray:
        client, _ = self._ensure()
        model = self.settings.embedding_model

        async def call() -> Answered:
            stats.requests += 1
            raw = await client.embeddings.with_raw_response.create(model=model, input=texts,
                                                                   dimensions=self.settings.embedding_dimensions)
            response = raw.parse()
            tokens = response.usage.prompt_tokens if response.usage else 0
            stats.input_tokens += tokens
            stats.cost_usd += self.settings.cost_usd(model, tokens, 0, 0)
            stats.sync_cost_usd += self.settings.cost_usd(model, tokens, 0, 0)
            vectors = np.asarray([item.embedding for item in sorted(response.data, key=lambda d: d.index)], dtype=np.float32)
            return Answered(vectors, raw.headers, 0)

        return await self._with_retries("embeddings", stats, call, model=model, input_tokens=estimate_tokens(*texts))

    def close(self) -> None:
        async def shutdown() -> None:
            if self._client is not None:
                await self._client.close()
        try:
            self.run(shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
