"""A cookbook-style LLM extraction baseline, written for the LLM benchmark (benchmarks/bench_llm.py).

It follows the request pattern of the original design (REFERENCE 1.3-1.5 and 1.8, peers notes
4.2.4 and 4.2.6) in code written for this benchmark; it is not the seed's code and carries none
of the seed's prompts. What it keeps from the design is the *request economy* and the
*concurrency and retry policy*:

- transcripts are processed one after another;
- per transcript, every chunk's statement request is in flight at once (`asyncio.gather`, no
  semaphore, no limiter); as soon as a chunk's statements arrive, every statement of that chunk
  starts at once: one date (validity) request and one triplet request concurrently, then one
  embedding request (`text-embedding-3-large`, 256 dimensions, one text per request);
- a date request is sent for every statement, ATEMPORAL ones included, as the design does;
- every request goes through tenacity `wait_random_exponential(min=1, max=30)` with
  `stop_after_attempt(3)`, and the openai SDK's own retries are off (`max_retries=0`); Retry-After
  is not looked at;
- a statement whose date, triplet or embedding request still fails after three attempts is lost
  (counted); a chunk whose statement request fails loses all its statements (counted);
- invalidation judges one candidate pair per request (1:1). Pairs are grouped by their incoming
  event (the later one), the incoming events are processed in pools of 10 with a 0.1 s pause
  between pools, and the pairs of one incoming event are all in flight at once, as the design's
  invalidation agent does. A pair whose request fails is lost (counted).

For a fair token comparison it uses tkg's chunks (`tkg.chunking.chunk_transcript` with
wordllama), tkg's prompt templates rendered with ONE statement (or one candidate) per request,
and tkg's structured-output schemas, over the Responses API (`client.responses.parse`).

Which pairs are judged: the candidate pairs tkg's own invalidation judged in a reference run
(`tkg.invalidation.select_candidates` via `tkg.invalidation.invalidate`, captured from the
`JudgeCase`s tkg's judge received), shown to the judge as tkg shows them (statement, types,
validity range and canonical triplets). A pair is judged by the baseline only if both of its
statements survived the baseline's own extraction (matched on publication date and statement
text), and it is judged after the transcript of its later event.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import openai
from tenacity import AsyncRetrying, stop_after_attempt, wait_random_exponential

from tkg.chunking import chunk_transcript
from tkg.embeddings import Embedder
from tkg.extraction.base import DocumentContext
from tkg.invalidation import EventView, JudgeCase
from tkg.llm.extractor import TEMPLATES, LLMJudge
from tkg.llm.wire import JudgeOut, StatementsOut, TripletsOut, ValidityOut
from tkg.models import (
    LABEL_DEFINITIONS,
    PREDICATE_DEFINITIONS,
    Chunk,
    EntityType,
    Transcript,
)
from tkg.prompts import RenderedPrompt, render

MODEL = "gpt-4.1-mini"
EMBEDDING_MODEL = "text-embedding-3-large"
EMBEDDING_DIMENSIONS = 256
JUDGE_POOL = 10  # incoming events per pool
JUDGE_POOL_PAUSE_S = 0.1


@dataclass
class BaselineStats:
    """Client-side accounting of one baseline run (the provider's own counts live in the server)."""

    attempts: Counter = field(default_factory=Counter)  # by stage
    successes: Counter = field(default_factory=Counter)  # by stage
    errors: Counter = field(default_factory=Counter)  # by exception type
    failed_requests: Counter = field(default_factory=Counter)  # by stage, after 3 attempts
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    embedding_tokens: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    chunks: int = 0
    chunks_lost: int = 0
    statements_lost_in_lost_chunks: int = 0  # estimated from the reference run (see `expected_per_chunk`)
    statements_extracted: int = 0
    statements_lost: int = 0  # a date, triplet or embedding request failed for good
    events_built: int = 0
    judge_pairs_planned: int = 0
    judge_pairs_skipped: int = 0  # a statement of the pair was lost by the baseline
    judge_pairs_judged: int = 0
    judge_pairs_lost: int = 0
    transcript_seconds: list[float] = field(default_factory=list)
    chunking_seconds: float = 0.0

    @property
    def statements_lost_total(self) -> int:
        return self.statements_lost + self.statements_lost_in_lost_chunks

    def summary(self) -> dict:
        lat = sorted(self.latencies_ms)
        return {
            "requests_attempted": sum(self.attempts.values()),
            "requests_by_stage": dict(self.attempts),
            "successes_by_stage": dict(self.successes),
            "errors": dict(self.errors),
            "failed_requests_by_stage": dict(self.failed_requests),
            "input_tokens": self.input_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "output_tokens": self.output_tokens,
            "embedding_tokens": self.embedding_tokens,
            "latency_p50_ms": round(statistics.median(lat), 1) if lat else None,
            "latency_p95_ms": round(lat[int(0.95 * (len(lat) - 1))], 1) if lat else None,
            "chunks": self.chunks,
            "chunks_lost": self.chunks_lost,
            "statements_extracted": self.statements_extracted,
            "statements_lost_failed_requests": self.statements_lost,
            "statements_lost_in_lost_chunks_estimated": self.statements_lost_in_lost_chunks,
            "statements_lost": self.statements_lost_total,
            "events_built": self.events_built,
            "judge_pairs_planned": self.judge_pairs_planned,
            "judge_pairs_skipped_statement_lost": self.judge_pairs_skipped,
            "judge_pairs_judged": self.judge_pairs_judged,
            "judge_pairs_lost": self.judge_pairs_lost,
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
    """Runs the cookbook request pattern against an OpenAI-compatible endpoint."""

    def __init__(self, base_url: str, api_key: str, chunk_embedder: Embedder,
                 expected_per_chunk: dict[str, int] | None = None) -> None:
        self.base_url, self.api_key = base_url, api_key
        self.chunk_embedder = chunk_embedder
        self.expected_per_chunk = expected_per_chunk or {}
        self.stats = BaselineStats()

    # -- transport ----------------------------------------------------------------------------

    async def _retrying(self, stage: str, call):
        """tenacity wait_random_exponential(1, 30) x 3 attempts around one request; any error retries."""
        async for attempt in AsyncRetrying(wait=wait_random_exponential(min=1, max=30), stop=stop_after_attempt(3),
                                           reraise=True):
            with attempt:
                self.stats.attempts[stage] += 1
                started = time.perf_counter()
                try:
                    result = await call()
                except Exception as error:
                    self.stats.errors[type(error).__name__] += 1
                    raise
                self.stats.latencies_ms.append((time.perf_counter() - started) * 1000)
                self.stats.successes[stage] += 1
                return result
        raise AssertionError("unreachable")

    async def _parse(self, client: openai.AsyncOpenAI, stage: str, prompt: RenderedPrompt, schema):
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

        try:
            return await self._retrying(stage, call)
        except Exception:
            self.stats.failed_requests[stage] += 1
            raise

    async def _embed(self, client: openai.AsyncOpenAI, text: str) -> list[float]:
        async def call():
            response = await client.embeddings.create(model=EMBEDDING_MODEL, dimensions=EMBEDDING_DIMENSIONS, input=[text])
            self.stats.embedding_tokens += response.usage.prompt_tokens if response.usage else 0
            return response.data[0].embedding

        try:
            return await self._retrying("embeddings", call)
        except Exception:
            self.stats.failed_requests["embeddings"] += 1
            raise

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

    # -- the flow ---------------------------------------------------------------------------------

    async def _statement(self, client, statement, context: DocumentContext, kept: set) -> bool:
        try:
            await asyncio.gather(self._parse(client, "validity", self.validity_prompt(statement, context), ValidityOut),
                                 self._parse(client, "triplets", self.triplets_prompt(statement, context), TripletsOut))
            await self._embed(client, statement.statement)
        except Exception:
            self.stats.statements_lost += 1
            return False
        self.stats.events_built += 1
        kept.add(_event_key(context.publication_date, statement.statement))
        return True

    async def _chunk(self, client, chunk: Chunk, context: DocumentContext, kept: set) -> None:
        try:
            answer = await self._parse(client, "statements", self.statements_prompt(chunk, context), StatementsOut)
        except Exception:
            self.stats.chunks_lost += 1
            self.stats.statements_lost_in_lost_chunks += self.expected_per_chunk.get(chunk.chunk_id, 0)
            return
        statements = [s for s in answer.statements if s.statement.strip()]
        self.stats.statements_extracted += len(statements)
        await asyncio.gather(*(self._statement(client, s, context, kept) for s in statements))

    async def _judge_pair(self, client, primary: EventView, candidate: EventView) -> None:
        try:
            await self._parse(client, "judge", self.judge_prompt(primary, candidate), JudgeOut)
        except Exception:
            self.stats.judge_pairs_lost += 1
            return
        self.stats.judge_pairs_judged += 1

    async def _judge(self, client, pairs: Sequence[tuple[EventView, EventView]], kept: set) -> None:
        by_incoming: dict[str, list[tuple[EventView, EventView]]] = defaultdict(list)
        for primary, candidate in pairs:
            if (_event_key(primary.created_at, primary.statement) not in kept
                    or _event_key(candidate.created_at, candidate.statement) not in kept):
                self.stats.judge_pairs_skipped += 1
                continue
            incoming = candidate if candidate.created_at >= primary.created_at else primary
            by_incoming[incoming.event_id].append((primary, candidate))
        groups = list(by_incoming.values())
        for start in range(0, len(groups), JUDGE_POOL):
            pool = groups[start : start + JUDGE_POOL]
            await asyncio.gather(*(asyncio.gather(*(self._judge_pair(client, p, c) for p, c in group)) for group in pool))
            if start + JUDGE_POOL < len(groups):
                await asyncio.sleep(JUDGE_POOL_PAUSE_S)

    async def run(self, transcripts: Sequence[BaselineTranscript], pairs: Sequence[tuple[EventView, EventView]] = ()) -> BaselineStats:
        """Transcripts one after another: chunk, extract, then judge the pairs whose later event is in it."""
        self.stats.judge_pairs_planned = len(pairs)
        by_day: dict[str, list[tuple[EventView, EventView]]] = defaultdict(list)
        for primary, candidate in pairs:
            later = max(primary.created_at, candidate.created_at)
            by_day[later.date().isoformat()].append((primary, candidate))
        kept: set = set()
        async with openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0) as client:
            for item in transcripts:
                started = time.perf_counter()
                chunks = chunk_transcript(item.transcript, self.chunk_embedder)
                self.stats.chunking_seconds += time.perf_counter() - started
                self.stats.chunks += len(chunks)
                await asyncio.gather(*(self._chunk(client, chunk, item.context, kept) for chunk in chunks))
                await self._judge(client, by_day.pop(item.context.publication_date.date().isoformat(), []), kept)
                self.stats.transcript_seconds.append(time.perf_counter() - started)
        # pairs whose later event is in no transcript of this run (e.g. --limit) are not judged
        self.stats.judge_pairs_skipped += sum(len(v) for v in by_day.values())
        return self.stats
