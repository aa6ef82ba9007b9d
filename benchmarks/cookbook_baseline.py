"""A cookbook-style LLM extraction baseline, written for the LLM benchmark (benchmarks/bench_llm.py).

It reproduces the request pattern of the seed design (REFERENCE 1.3-1.8; the cookbook's code in
../shared/seeds/000_*.txt) in code written for this benchmark; it carries none of the seed's
code or prompts. What it keeps from the seed is the *request economy*, the *concurrency*, the
*retry policy* and what a failure costs:

- transcripts one after another, each chunked, extracted and then judged before the next
  starts; a transcript whose extraction raises is lost whole and the next one starts (the
  seed's bulk ingestion catches the error per transcript);
- per transcript, every chunk's statement request at once (`asyncio.gather`, no semaphore, no
  limiter); as soon as a chunk's statements arrive, every statement of that chunk at once: one
  date (validity) request and one triplet request concurrently, then one embedding request
  (`text-embedding-3-large`, 256 dimensions, one text);
- no date request for an ATEMPORAL statement (its range is empty without asking);
- one SDK client with the SDK's default retries (2, which honour Retry-After); statement, date
  and judge calls also go through tenacity `wait_random_exponential(multiplier=1, min=1, max=30)`
  with `stop_after_attempt(3)`; a triplet call tries 3 times with a 1 s pause inside each of
  tenacity's 3 attempts (up to 9 calls); the embedding call has the SDK's retries only;
- the gathers over chunks, over a chunk's statements and over a statement's two requests do not
  return exceptions: the first failure fails the transcript. The requests already started keep
  running without anyone waiting for them, as the seed's would; those still pending when the
  run ends are cancelled and counted;
- invalidation judges one candidate pair per request (1:1). Pairs are grouped by their
  incoming (later) event, the groups run in pools of 10 with a 0.1 s pause between pools and
  exceptions returned per group, and a group's pairs are all in flight at once without
  returned exceptions: one failed pair loses its group's verdicts.

For a fair comparison it uses tkg's chunks (`tkg.ingest.chunking.chunk_transcript` with wordllama),
tkg's prompt templates rendered with ONE statement (or one candidate) per request, and tkg's
structured-output schemas, over the Responses API (`client.responses.parse`): the prompts are
the same on both sides, so the prompts are not what is measured.

Which pairs are judged: the candidate pairs tkg's own invalidation judged in a reference run
(captured from the `JudgeCase`s tkg's judge received), shown to the judge as tkg shows them. A
pair is judged only if both of its statements are in transcripts the baseline kept (matched on
publication date and statement text), after the transcript of its later event.
"""

from __future__ import annotations

import asyncio
import contextvars
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

import openai
from tenacity import AsyncRetrying, stop_after_attempt, wait_random_exponential

from tkg.core.embeddings import Embedder
from tkg.core.models import (
    LABEL_DEFINITIONS,
    PREDICATE_DEFINITIONS,
    Chunk,
    EntityType,
    TemporalType,
    Transcript,
)
from tkg.extract.base import DocumentContext
from tkg.ingest.chunking import chunk_transcript
from tkg.invalidate.judges import EventView, JudgeCase
from tkg.llm.extractor import TEMPLATES, LLMJudge
from tkg.llm.prompts import RenderedPrompt, render
from tkg.llm.wire import JudgeOut, StatementsOut, TripletsOut, ValidityOut

T = TypeVar("T")

MODEL = "gpt-4.1-mini"
EMBEDDING_MODEL = "text-embedding-3-large"
EMBEDDING_DIMENSIONS = 256
TENACITY_ATTEMPTS = 3  # around statement, date, triplet and judge calls
TRIPLET_TRIES_PER_ATTEMPT = 3  # the triplet call's own loop inside each tenacity attempt
TRIPLET_PAUSE_S = 1.0  # between those tries
JUDGE_POOL = 10  # incoming events per pool
JUDGE_POOL_PAUSE_S = 0.1

# The stage of the request the current task is making, so the HTTP hook can count the SDK's
# own retries per stage (they happen inside one SDK call and are otherwise invisible).
_STAGE: contextvars.ContextVar[str] = contextvars.ContextVar("baseline_stage", default="unknown")


class StageFailed(RuntimeError):
    """A call that still failed after every retry the seed allows; it fails its transcript (or judge group)."""

    def __init__(self, stage: str, error: BaseException) -> None:
        super().__init__(f"{stage}: {type(error).__name__}: {error}")
        self.stage = stage


@dataclass
class BaselineStats:
    """Client-side accounting of one baseline run (the provider's own counts live in the server)."""

    sdk_calls: Counter = field(default_factory=Counter)  # by stage; one call = up to 1 + 2 HTTP requests
    http_requests: Counter = field(default_factory=Counter)  # by stage, every HTTP response seen
    http_errors: Counter = field(default_factory=Counter)  # by "stage status"
    errors: Counter = field(default_factory=Counter)  # exceptions the SDK raised, by type
    failed_calls: Counter = field(default_factory=Counter)  # by stage, after every retry
    date_requests_skipped_atemporal: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    embedding_tokens: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    chunks: int = 0
    statements_extracted: int = 0
    transcripts_lost: list[dict] = field(default_factory=list)  # date, failing stage, statements lost
    statements_lost: int = 0  # the statements of lost transcripts (the reference run's count)
    events_built: int = 0
    judge_pairs_planned: int = 0
    judge_pairs_skipped: int = 0  # a statement of the pair is in a lost transcript
    judge_pairs_judged: int = 0
    judge_groups_lost: int = 0
    judge_pairs_lost: int = 0  # every pair of a lost group
    orphan_tasks_cancelled: int = 0  # requests of failed transcripts still running when the run ended
    transcript_seconds: list[float] = field(default_factory=list)
    chunking_seconds: float = 0.0

    def summary(self) -> dict:
        lat = sorted(self.latencies_ms)
        return {
            "sdk_calls_by_stage": dict(self.sdk_calls),
            "http_requests_by_stage": dict(self.http_requests),
            "http_errors_by_stage": dict(self.http_errors),
            "errors": dict(self.errors),
            "failed_calls_by_stage": dict(self.failed_calls),
            "date_requests_skipped_atemporal": self.date_requests_skipped_atemporal,
            "input_tokens": self.input_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "output_tokens": self.output_tokens,
            "embedding_tokens": self.embedding_tokens,
            "call_latency_p50_ms": round(statistics.median(lat), 1) if lat else None,
            "call_latency_p95_ms": round(lat[int(0.95 * (len(lat) - 1))], 1) if lat else None,
            "chunks": self.chunks,
            "statements_extracted": self.statements_extracted,
            "transcripts_lost": self.transcripts_lost,
            "statements_lost": self.statements_lost,
            "events_built": self.events_built,
            "judge_pairs_planned": self.judge_pairs_planned,
            "judge_pairs_skipped_statement_lost": self.judge_pairs_skipped,
            "judge_pairs_judged": self.judge_pairs_judged,
            "judge_groups_lost": self.judge_groups_lost,
            "judge_pairs_lost": self.judge_pairs_lost,
            "orphan_tasks_cancelled": self.orphan_tasks_cancelled,
            "transcript_seconds": [round(s, 2) for s in self.transcript_seconds],
            "chunking_seconds": round(self.chunking_seconds, 2),
        }


@dataclass(frozen=True)
class BaselineTranscript:
    transcript: Transcript
    context: DocumentContext


def _event_key(publication: datetime, statement: str) -> tuple[str, str]:
    return publication.date().isoformat(), " ".join(statement.split())


def judge_pairs(cases: Iterable[JudgeCase]) -> list[tuple[EventView, EventView]]:
    """(primary, candidate) pairs, one per verdict tkg asked for."""
    return [(case.primary, candidate) for case in cases for candidate in case.candidates]


class CookbookBaseline:
    """Runs the seed's request pattern against an OpenAI-compatible endpoint."""

    def __init__(self, base_url: str, api_key: str, chunk_embedder: Embedder,
                 expected_per_chunk: dict[str, int] | None = None) -> None:
        self.base_url, self.api_key = base_url, api_key
        self.chunk_embedder = chunk_embedder
        self.expected_per_chunk = expected_per_chunk or {}
        self.stats = BaselineStats()

    # -- transport ----------------------------------------------------------------------------

    async def _count_response(self, response) -> None:
        stage = _STAGE.get()
        self.stats.http_requests[stage] += 1
        if response.status_code != 200:
            self.stats.http_errors[f"{stage} {response.status_code}"] += 1

    async def _sdk_call(self, stage: str, call: Callable[[], Awaitable[T]]) -> T:
        """One SDK call (the SDK retries inside it); counted, timed, errors counted by type."""
        _STAGE.set(stage)
        self.stats.sdk_calls[stage] += 1
        started = time.perf_counter()
        try:
            result = await call()
        except Exception as error:
            self.stats.errors[type(error).__name__] += 1
            raise
        self.stats.latencies_ms.append((time.perf_counter() - started) * 1000)
        return result

    async def _with_tenacity(self, stage: str, call: Callable[[], Awaitable[T]]) -> T:
        """tenacity wait_random_exponential(1..30) x 3 attempts around `call`; any error retries."""
        try:
            async for attempt in AsyncRetrying(wait=wait_random_exponential(multiplier=1, min=1, max=30),
                                               stop=stop_after_attempt(TENACITY_ATTEMPTS), reraise=True):
                with attempt:
                    return await call()
        except Exception as error:
            self.stats.failed_calls[stage] += 1
            raise StageFailed(stage, error) from error
        raise AssertionError("unreachable")

    def _parse_call(self, client: openai.AsyncOpenAI, stage: str, prompt: RenderedPrompt, schema):
        async def call():
            response = await client.responses.parse(model=MODEL, temperature=0, instructions=prompt.instructions,
                                                    input=prompt.input, text_format=schema)
            usage = response.usage
            if usage is not None:
                self.stats.input_tokens += usage.input_tokens
                self.stats.cached_input_tokens += getattr(usage.input_tokens_details, "cached_tokens", 0) or 0
                self.stats.output_tokens += usage.output_tokens
            if response.output_parsed is None:
                raise ValueError("no parsed output")
            return response.output_parsed

        return lambda: self._sdk_call(stage, call)

    # -- prompts (tkg's templates, one item per request) ----------------------------------------

    @staticmethod
    def statements_prompt(chunk: Chunk, context: DocumentContext) -> RenderedPrompt:
        return render(
            TEMPLATES["statements"], label_definitions=LABEL_DEFINITIONS, main_entity=context.main_entity,
            ticker=context.ticker, document_type=context.document_type,
            publication_date=context.publication_date.date().isoformat(), quarter_explanation=context.quarter_explanation(),
            fiscal_quarter=context.fiscal_quarter or "unknown", speaker=chunk.speaker, speaker_title=chunk.speaker_title,
            chunk_text=chunk.text,
        )

    @staticmethod
    def _item(statement) -> list[dict]:
        return [{"index": 0, "statement": statement.statement, "statement_type": statement.statement_type.value,
                 "temporal_type": statement.temporal_type.value}]

    @classmethod
    def validity_prompt(cls, statement, context: DocumentContext) -> RenderedPrompt:
        return render(TEMPLATES["validity"], main_entity=context.main_entity, ticker=context.ticker,
                      publication_date=context.publication_date.isoformat(), fiscal_quarter=context.fiscal_quarter or "unknown",
                      quarter_explanation=context.quarter_explanation(), statements=cls._item(statement))

    @classmethod
    def triplets_prompt(cls, statement, context: DocumentContext) -> RenderedPrompt:
        return render(TEMPLATES["triplets"], predicate_definitions={p.value: d for p, d in PREDICATE_DEFINITIONS.items()},
                      entity_types=[t.value for t in EntityType], main_entity=context.main_entity, ticker=context.ticker,
                      publication_date=context.publication_date.date().isoformat(),
                      fiscal_quarter=context.fiscal_quarter or "unknown", quarter_explanation=context.quarter_explanation(),
                      statements=cls._item(statement))

    @staticmethod
    def judge_prompt(primary: EventView, candidate: EventView) -> RenderedPrompt:
        return render(TEMPLATES["judge"], primary=LLMJudge._view(primary), candidates=[LLMJudge._view(candidate, 0)])

    # -- one request kind each ------------------------------------------------------------------

    async def _statements(self, client, chunk: Chunk, context: DocumentContext):
        call = self._parse_call(client, "statements", self.statements_prompt(chunk, context), StatementsOut)
        return await self._with_tenacity("statements", call)

    async def _validity(self, client, statement, context: DocumentContext):
        if statement.temporal_type == TemporalType.ATEMPORAL:  # the range is empty; nothing to ask
            self.stats.date_requests_skipped_atemporal += 1
            return None
        call = self._parse_call(client, "validity", self.validity_prompt(statement, context), ValidityOut)
        return await self._with_tenacity("validity", call)

    async def _triplets(self, client, statement, context: DocumentContext):
        call = self._parse_call(client, "triplets", self.triplets_prompt(statement, context), TripletsOut)

        async def tries_with_pause():
            for attempt in range(TRIPLET_TRIES_PER_ATTEMPT):
                try:
                    return await call()
                except Exception:
                    if attempt == TRIPLET_TRIES_PER_ATTEMPT - 1:
                        raise
                    await asyncio.sleep(TRIPLET_PAUSE_S)
            raise AssertionError("unreachable")

        return await self._with_tenacity("triplets", tries_with_pause)

    async def _embed(self, client, text: str) -> list[float]:
        async def call():
            response = await client.embeddings.create(model=EMBEDDING_MODEL, dimensions=EMBEDDING_DIMENSIONS, input=text)
            self.stats.embedding_tokens += response.usage.prompt_tokens if response.usage else 0
            return response.data[0].embedding

        try:
            return await self._sdk_call("embeddings", call)  # the SDK's own retries only
        except Exception as error:
            self.stats.failed_calls["embeddings"] += 1
            raise StageFailed("embeddings", error) from error

    async def _judge_call(self, client, primary: EventView, candidate: EventView):
        call = self._parse_call(client, "judge", self.judge_prompt(primary, candidate), JudgeOut)
        return await self._with_tenacity("judge", call)

    # -- the flow ---------------------------------------------------------------------------------

    async def _statement(self, client, statement, context: DocumentContext) -> tuple[str, str]:
        await asyncio.gather(self._validity(client, statement, context), self._triplets(client, statement, context))
        await self._embed(client, statement.statement)
        return _event_key(context.publication_date, statement.statement)

    async def _chunk(self, client, chunk: Chunk, context: DocumentContext) -> list[tuple[str, str]]:
        answer = await self._statements(client, chunk, context)
        statements = [s for s in answer.statements if s.statement.strip()]
        self.stats.statements_extracted += len(statements)
        if not statements:
            return []
        return list(await asyncio.gather(*(self._statement(client, s, context) for s in statements)))

    async def _extract(self, client, chunks: Sequence[Chunk], context: DocumentContext) -> list[tuple[str, str]]:
        """Every chunk at once; the first failure anywhere fails the transcript."""
        per_chunk = await asyncio.gather(*(self._chunk(client, chunk, context) for chunk in chunks))
        return [key for keys in per_chunk for key in keys]

    async def _judge_group(self, client, group: Sequence[tuple[EventView, EventView]]) -> None:
        await asyncio.gather(*(self._judge_call(client, primary, candidate) for primary, candidate in group))

    async def _judge(self, client, pairs: Sequence[tuple[EventView, EventView]], known: set) -> None:
        by_incoming: dict[str, list[tuple[EventView, EventView]]] = defaultdict(list)
        for primary, candidate in pairs:
            if (_event_key(primary.created_at, primary.statement) not in known
                    or _event_key(candidate.created_at, candidate.statement) not in known):
                self.stats.judge_pairs_skipped += 1
                continue
            incoming = candidate if candidate.created_at >= primary.created_at else primary
            by_incoming[incoming.event_id].append((primary, candidate))
        groups = list(by_incoming.values())
        for start in range(0, len(groups), JUDGE_POOL):
            pool = groups[start : start + JUDGE_POOL]
            outcomes = await asyncio.gather(*(self._judge_group(client, group) for group in pool), return_exceptions=True)
            for group, outcome in zip(pool, outcomes):
                if isinstance(outcome, BaseException):
                    self.stats.judge_groups_lost += 1
                    self.stats.judge_pairs_lost += len(group)
                else:
                    self.stats.judge_pairs_judged += len(group)
            if start + JUDGE_POOL < len(groups):
                await asyncio.sleep(JUDGE_POOL_PAUSE_S)

    def _lose_transcript(self, item: BaselineTranscript, chunks: Sequence[Chunk], error: BaseException) -> None:
        # Count what the reference run got from these chunks: the baseline may have stopped before
        # extracting them all.
        lost = sum(self.expected_per_chunk.get(chunk.chunk_id, 0) for chunk in chunks)
        self.stats.statements_lost += lost
        self.stats.transcripts_lost.append({"date": item.context.publication_date.date().isoformat(),
                                            "stage": getattr(error, "stage", type(error).__name__),
                                            "statements_lost": lost})

    async def run(self, transcripts: Sequence[BaselineTranscript], pairs: Sequence[tuple[EventView, EventView]] = ()) -> BaselineStats:
        """Transcripts one after another: chunk, extract, then judge the pairs whose later event is in it."""
        self.stats.judge_pairs_planned = len(pairs)
        by_day: dict[str, list[tuple[EventView, EventView]]] = defaultdict(list)
        for primary, candidate in pairs:
            later = max(primary.created_at, candidate.created_at)
            by_day[later.date().isoformat()].append((primary, candidate))
        kept: set = set()
        # A plain client as the seed makes it (default retries); the hook only counts responses.
        http_client = openai.DefaultAsyncHttpxClient(event_hooks={"response": [self._count_response]})
        async with openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, http_client=http_client) as client:
            for item in transcripts:
                started = time.perf_counter()
                chunks = chunk_transcript(item.transcript, self.chunk_embedder)
                self.stats.chunking_seconds += time.perf_counter() - started
                self.stats.chunks += len(chunks)
                day_pairs = by_day.pop(item.context.publication_date.date().isoformat(), [])
                try:
                    keys = await self._extract(client, chunks, item.context)
                except Exception as error:  # noqa: BLE001 - the seed skips a transcript on any error
                    self._lose_transcript(item, chunks, error)
                    self.stats.judge_pairs_skipped += len(day_pairs)
                else:
                    self.stats.events_built += len(keys)
                    await self._judge(client, day_pairs, kept | set(keys))
                    kept.update(keys)
                self.stats.transcript_seconds.append(time.perf_counter() - started)
            # Requests of failed transcripts nobody waits for; the seed's would run on in the notebook.
            orphans = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            self.stats.orphan_tasks_cancelled = len(orphans)
            for task in orphans:
                task.cancel()
            await asyncio.gather(*orphans, return_exceptions=True)
        # pairs whose later event is in no transcript of this run (e.g. --limit) are not judged
        self.stats.judge_pairs_skipped += sum(len(v) for v in by_day.values())
        return self.stats
