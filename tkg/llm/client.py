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
import logging
import threading
import time
from collections.abc import Awaitable, Callable
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
from tkg.llm.wire import InvalidOutput

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRYABLE = (openai.RateLimitError, openai.InternalServerError, openai.APITimeoutError, openai.APIConnectionError)


class RequestFailed(RuntimeError):
    """A request that still failed after all retries; the caller drops the item and counts it."""


class AdaptiveLimiter:
    """At most `limit` requests in flight (AIMD). A 429 cuts the limit by a quarter (at most
    twice a second, so one burst counts once); every `limit / 4` successes in a row add a slot
    back, up to `maximum`. The request that got the 429 waits the provider's Retry-After
    before it is retried; the others carry on at the lower limit."""

    def __init__(self, maximum: int) -> None:
        self.maximum = max(1, maximum)
        self.limit = self.maximum
        self.in_flight = 0
        self._condition = asyncio.Condition()
        self._successes = 0
        self._last_cut = 0.0

    async def acquire(self) -> None:
        async with self._condition:
            await self._condition.wait_for(lambda: self.in_flight < self.limit)
            self.in_flight += 1

    async def release(self, rate_limited: bool = False) -> None:
        async with self._condition:
            self.in_flight -= 1
            now = time.monotonic()
            if rate_limited:
                self._successes = 0
                if now - self._last_cut > 0.5:
                    self.limit = max(1, (self.limit * 3) // 4)
                    self._last_cut = now
            else:
                self._successes += 1
                if self._successes >= max(1, self.limit // 4) and self.limit < self.maximum:
                    self.limit += 1
                    self._successes = 0
            self._condition.notify_all()


def _retry_after(error: BaseException) -> float | None:
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None) or {}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value:
            try:
                return max(0.0, float(value) * scale)
            except ValueError:
                continue
    return None


@lru_cache(maxsize=32)
def _response_formats(schema: type[BaseModel]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The strict JSON-schema formats the SDK's `parse` helpers build from a pydantic model,
    for the Responses API and for chat completions; built once per schema, not per request."""
    return type_to_text_format_param(schema), type_to_response_format_param(schema)


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
        self._limiter: AdaptiveLimiter | None = None

    def __repr__(self) -> str:  # never show the key
        return f"LLMClient(base_url={self.settings.base_url!r}, api_mode={self.settings.api_mode!r})"

    def run(self, coroutine: Awaitable[T]) -> T:
        """Run a coroutine on the client's loop from any thread and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _ensure(self) -> tuple[openai.AsyncOpenAI, AdaptiveLimiter]:
        if self._client is None:
            self._client = openai.AsyncOpenAI(api_key=self._api_key, base_url=self.settings.base_url,
                                              timeout=self.settings.timeout_s, max_retries=0)
            self._limiter = AdaptiveLimiter(self.settings.max_in_flight)
        return self._client, self._limiter

    async def _with_retries(self, stage: str, stats: StageStats, call: Callable[[], Awaitable[T]]) -> T:
        _, limiter = self._ensure()

        def wait(state: RetryCallState) -> float:
            error = state.outcome.exception() if state.outcome else None
            hinted = _retry_after(error) if isinstance(error, openai.RateLimitError) else None
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
                    await limiter.acquire()
                    started = time.perf_counter()
                    try:
                        result = await call()
                    except openai.RateLimitError:
                        stats.rate_limited += 1
                        await limiter.release(rate_limited=True)
                        raise
                    except BaseException:
                        await limiter.release()
                        raise
                    await limiter.release()
                    stats.latencies_ms.append((time.perf_counter() - started) * 1000)
                    return result
        except RETRYABLE as error:
            raise RequestFailed(f"{type(error).__name__} after {self.settings.max_attempts} attempts") from error
        except openai.APIStatusError as error:  # 4xx other than 429: a bad request will not get better
            raise RequestFailed(f"HTTP {error.status_code}: {error.message}") from error
        raise AssertionError("unreachable")

    async def _complete(self, stage: str, prompt: RenderedPrompt, schema: type[BaseModel], stats: StageStats) -> str:
        """The answer's text; its tokens and cost go into `stats`."""
        client, _ = self._ensure()
        model = self.settings.model(stage)
        extra: dict[str, Any] = {}
        if self.settings.service_tier:
            extra["service_tier"] = self.settings.service_tier

        text_format, chat_format = _response_formats(schema)

        async def call() -> str:
            stats.requests += 1
            if self.settings.api_mode == "chat":
                response = await client.chat.completions.create(
                    model=model, temperature=self.settings.temperature, response_format=chat_format,
                    messages=[{"role": "system", "content": prompt.instructions}, {"role": "user", "content": prompt.input}],
                    **extra)
                usage = response.usage
                details = getattr(usage, "prompt_tokens_details", None) if usage else None
                tokens = (usage.prompt_tokens, getattr(details, "cached_tokens", 0) or 0, usage.completion_tokens) if usage else (0, 0, 0)
                text = response.choices[0].message.content or ""
            else:
                response = await client.responses.create(
                    model=model, temperature=self.settings.temperature, text={"format": text_format},
                    instructions=prompt.instructions, input=prompt.input, **extra)
                usage = response.usage
                tokens = (usage.input_tokens, getattr(usage.input_tokens_details, "cached_tokens", 0) or 0,
                          usage.output_tokens) if usage else (0, 0, 0)
                text = response.output_text or ""
            stats.input_tokens += tokens[0]
            stats.cached_input_tokens += tokens[1]
            stats.output_tokens += tokens[2]
            stats.cost_usd += self.settings.cost_usd(model, *tokens)
            return text

        return await self._with_retries(stage, stats, call)

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

        async def call() -> np.ndarray:
            stats.requests += 1
            response = await client.embeddings.create(model=model, input=texts, dimensions=self.settings.embedding_dimensions)
            tokens = response.usage.prompt_tokens if response.usage else 0
            stats.input_tokens += tokens
            stats.cost_usd += self.settings.cost_usd(model, tokens, 0, 0)
            return np.asarray([item.embedding for item in sorted(response.data, key=lambda d: d.index)], dtype=np.float32)

        return await self._with_retries("embeddings", stats, call)

    def close(self) -> None:
        async def shutdown() -> None:
            if self._client is not None:
                await self._client.close()
        try:
            self.run(shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
