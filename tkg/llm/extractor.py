"""The LLM implementations of the extraction interfaces: `LLMExtractor`, `LLMJudge` and
`OpenAIEmbedder`, all through one `LLMClient` and one `ResponseCache`.

Request economy:
- statements: one request per chunk, all chunks of a partition in flight together;
- validity ranges, triplets and figures: `batch_size` statements per request (1 = one per
  statement, as in the original design); cached per statement, so only uncached statements
  are sent (and for figures only statements holding a digit);
- embeddings: one request per `embedding_batch_size` texts, cached per text;
- the judge: one request per primary event covering all its uncached candidates (1:N).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import threading
from collections.abc import Sequence

import numpy as np

from tkg.core import policy
from tkg.core.companies import get_company
from tkg.core.embeddings import normalise_rows
from tkg.core.models import (
    LABEL_DEFINITIONS,
    PREDICATE_DEFINITIONS,
    Chunk,
    EntityType,
    RawExtraction,
    RawFigure,
    RawFigureList,
    RawStatement,
    TemporalValidityRange,
)
from tkg.core.results import Counted, StageStats
from tkg.extract.base import DocumentContext
from tkg.extract.figures import segment_patterns
from tkg.invalidate.judges import EventView, JudgeCase, Verdict
from tkg.llm.cache import ResponseCache, cache_key, normalise
from tkg.llm.client import LLMClient, RequestFailed
from tkg.llm.prompts import TEMPLATES, render, template_sha256
from tkg.llm.settings import LLMSettings
from tkg.llm.wire import (
    FiguresOut,
    InvalidOutput,
    JudgeOut,
    StatementsOut,
    TripletsOut,
    ValidityOut,
    parse_figures,
    parse_statements,
    parse_triplets,
    parse_validity,
    parse_verdicts,
)

log = logging.getLogger(__name__)

_DIGIT = re.compile(r"\d")



def stage_fingerprint(settings: LLMSettings, stage: str) -> str:
    """Hash of the prompt template, model and settings: the code version of an LLM stage."""
    template = template_sha256(TEMPLATES[stage]) if stage in TEMPLATES else ""
    return hashlib.sha256(f"{stage}:{template}:{settings.fingerprint(stage)}".encode()).hexdigest()[:16]


_CLIENTS: dict[str, LLMClient] = {}
_CLIENTS_LOCK = threading.Lock()


def shared_client(settings: LLMSettings, api_key: str | None) -> LLMClient:
    """One client (and loop, and limiter) per process and configuration."""
    identity = json.dumps(settings.describe(), sort_keys=True, default=str) + hashlib.sha256((api_key or "").encode()).hexdigest()
    with _CLIENTS_LOCK:
        if identity not in _CLIENTS:
            _CLIENTS[identity] = LLMClient(settings, api_key)
        return _CLIENTS[identity]


class _Stages(Counted):
    """What the LLM providers share: the client, the cache, and their counters' rows of the
    llm_calls table."""

    def __init__(self, client: LLMClient, cache: ResponseCache) -> None:
        self.client, self.cache, self.settings = client, cache, client.settings

    def settings_fingerprint(self, stage: str) -> str:
        return stage_fingerprint(self.settings, stage)

    def usage_row(self, counter: str, usage: StageStats) -> dict | None:
        summary = usage.summary()
        return {
            "stage": counter, "backend": "openai", "mode": self.client.request_mode(counter),
            "model": self.settings.embedding_model if counter == "embeddings" else self.settings.model(counter),
            **{k: v for k, v in summary.items() if k not in {"dropped_by_reason", "repaired_by_reason"}},
            "dropped_by_reason": json.dumps(summary["dropped_by_reason"], sort_keys=True),
            "repaired_by_reason": json.dumps(summary["repaired_by_reason"], sort_keys=True),
        }


def _batches(items: list, size: int) -> list[list]:
    size = max(1, size)
    return [items[i : i + size] for i in range(0, len(items), size)]


class LLMExtractor(_Stages):
    """`Extractor` over an OpenAI-compatible API."""

    counters = ("statements", "validity", "triplets", "figures")

    name = "openai"

    def _key(self, stage: str, text: str) -> str:
        return cache_key(stage, self.settings.model(stage), template_sha256(TEMPLATES[stage]),
                         self.settings.fingerprint(stage), normalise(text))

    # -- statements ---------------------------------------------------------------------------

    def extract_statements(self, chunks: Sequence[Chunk], context: DocumentContext) -> list[list[RawStatement]]:
        async def run() -> list[list[RawStatement]]:
            return list(await asyncio.gather(*(self._statements_for(chunk, context) for chunk in chunks)))
        return self.client.run(run())

    async def _statements_for(self, chunk: Chunk, context: DocumentContext) -> list[RawStatement]:
        stats = self.stats("statements")
        prompt = render(TEMPLATES["statements"], label_definitions=LABEL_DEFINITIONS, document_type=context.document_type,
                        speaker=chunk.speaker, speaker_title=chunk.speaker_title, chunk_text=chunk.text,
                        **self._context_vars(context))
        key = self._key("statements", prompt.input)
        if (cached := self.cache.get(key)) is not None:
            stats.cache_hits += 1
            return [RawStatement.model_validate(item) for item in cached]
        try:
            statements = await self.client.structured("statements", prompt, StatementsOut,
                                                      lambda text: parse_statements(text, stats), stats)
        except (InvalidOutput, RequestFailed) as error:
            stats.unanswered("chunk_without_usable_answer", error=error)
            log.warning("statements: chunk %s of %s dropped: %s", chunk.chunk_id, chunk.transcript_id, error)
            return []
        self.cache.put(key, "statements", self.settings.model("statements"), [s.model_dump(mode="json") for s in statements])
        return statements

    # -- validity ranges, triplets and figures: batched, cached per statement -------------------

    @staticmethod
    def _context_vars(context: DocumentContext) -> dict[str, object]:
        return {"main_entity": context.main_entity, "ticker": context.ticker,
                "publication_date": context.publication_date.isoformat(), "fiscal_quarter": context.fiscal_quarter or "unknown",
                "quarter_explanation": context.quarter_explanation()}

    def _per_statement(self, stage: str, statements: Sequence[RawStatement], context: DocumentContext, schema, parse,
                       model_type, **template_vars: object) -> dict[int, object]:
        """One answer per statement: cached by statement (and the document context it is read
        in), the misses sent `batch_size` to a request."""
        context_vars = self._context_vars(context)
        context_text = "|".join(str(context_vars[k]) for k in sorted(context_vars)) + f"|{context.fiscal_year_end_month}"
        keys = [self._key(stage, f"{s.statement}|{s.statement_type.value}|{s.temporal_type.value}|{context_text}")
                for s in statements]

        async def batch(indices: list[int]) -> dict[int, object]:
            items = [{"index": local, "statement": statements[i].statement, "statement_type": statements[i].statement_type.value,
                      "temporal_type": statements[i].temporal_type.value} for local, i in enumerate(indices)]
            prompt = render(TEMPLATES[stage], statements=items, **context_vars, **template_vars)
            stats = self.stats(stage)
            parsed = await self.client.structured(stage, prompt, schema,
                                                  lambda text: parse(text, list(range(len(indices))), stats), stats)
            return {indices[local]: found for local, found in parsed.items()}

        return self._batched(stage, keys, batch, model_type)

    def extract_validity(self, statements: Sequence[RawStatement], context: DocumentContext) -> list[TemporalValidityRange | None]:
        results = self._per_statement("validity", statements, context, ValidityOut, parse_validity, TemporalValidityRange)
        return [results.get(i) for i in range(len(statements))]

    def extract_triplets(self, statements: Sequence[RawStatement], context: DocumentContext) -> list[RawExtraction]:
        results = self._per_statement(
            "triplets", statements, context, TripletsOut, parse_triplets, RawExtraction,
            predicate_definitions={p.value: d for p, d in PREDICATE_DEFINITIONS.items()},
            entity_types=[t.value for t in EntityType],
        )
        return [results.get(i) or RawExtraction() for i in range(len(statements))]

    def extract_figures(self, statements: Sequence[RawStatement], context: DocumentContext,
                        scopes: Sequence[str] | None = None) -> list[list[RawFigure]]:
        """The figures of each statement, aligned with `statements`; a statement without an
        answer (counted as unanswered in the stats) has none. The model reads each statement
        alone (they are self-contained by the statement prompt's rules), so `scopes` is unused."""
        # A statement without a digit states no figure: it gets [] here, with no request and no
        # cache entry, which spares the requests for most of a call.
        asked = [index for index, statement in enumerate(statements) if _DIGIT.search(statement.statement)]
        segments = get_company(context.ticker).segments
        patterns = segment_patterns(dict(segments))
        results = self._per_statement(
            "figures", [statements[i] for i in asked], context, FiguresOut,
            lambda text, expected, stats: parse_figures(text, expected, stats, patterns), RawFigureList,
            segments=[{"name": name, "aliases": list(aliases)} for name, aliases in segments],
        )
        figures = {asked[local]: answer.figures for local, answer in results.items()}
        return [figures.get(i, []) for i in range(len(statements))]

    def _batched(self, stage: str, keys: list[str], batch, model_type) -> dict:
        """Cache lookups per statement, then the misses in batches of `batch_size`, all in
        flight together. Statements the answers left out are asked again, batched the same way
        (an answer that covers part of its batch counts in `partial_answers`), and what is
        still missing after that, alone. Every answer is cached the moment it arrives, so a
        killed build repeats only the requests in flight."""
        stats = self.stats(stage)
        model = self.settings.model(stage)
        results: dict[int, object] = {}
        misses = []
        for index, key in enumerate(keys):
            cached = self.cache.get(key)
            if cached is not None:
                stats.cache_hits += 1
                results[index] = model_type.model_validate(cached)
            else:
                misses.append(index)
        errors: list[BaseException] = []

        async def safe(indices: list[int]) -> None:
            try:
                answered = await batch(indices)
            except (InvalidOutput, RequestFailed) as error:
                log.warning("%s: %d statement(s) without a usable answer: %s", stage, len(indices), error)
                errors.append(error)
                return
            if 0 < len(answered) < len(indices):
                stats.partial_answers += 1
            for index, answer in answered.items():
                results[index] = answer
                self.cache.put(keys[index], stage, model, answer.model_dump(mode="json"))

        async def run() -> None:
            size = self.settings.batch_size
            await asyncio.gather(*(safe(group) for group in _batches(misses, size)))
            if size == 1:
                return
            again = _batches([i for i in misses if i not in results], size)
            await asyncio.gather(*(safe(group) for group in again))
            # Last, alone: what a batch of several left out twice (a lone item was just asked alone).
            alone = [i for group in again if len(group) > 1 for i in group if i not in results]
            await asyncio.gather(*(safe([i]) for i in alone))

        if misses:
            self.client.run(run())
        unanswered = sum(1 for index in misses if index not in results)
        if unanswered:
            stats.unanswered(f"{stage}_statement_without_answer", unanswered,
                             errors[-1] if errors else "the answers left these statements out")
        return results


class OpenAIEmbedder(_Stages):
    """`Embedder` over the embeddings API, cached per text, batched per request."""

    counters = ("embeddings",)

    def __init__(self, client: LLMClient, cache: ResponseCache) -> None:
        super().__init__(client, cache)
        self.dimension = self.settings.embedding_dimensions
        self.name = f"{self.settings.embedding_model}-{self.dimension}"

    def embed(self, texts: list[str]) -> np.ndarray:
        stats = self.stats("embeddings")
        keys = [cache_key("embeddings", self.settings.embedding_model, "", self.settings.fingerprint("embeddings"), normalise(t))
                for t in texts]
        vectors: dict[int, list[float]] = {}
        for index, key in enumerate(keys):
            if (cached := self.cache.get(key)) is not None:
                stats.cache_hits += 1
                vectors[index] = cached
        groups = _batches([i for i in range(len(texts)) if i not in vectors], self.settings.embedding_batch_size)

        async def one(group: list[int]) -> None:
            matrix = await self.client.embed([texts[i] for i in group], stats)
            for index, vector in zip(group, matrix):  # cached as each answer arrives
                vectors[index] = vector.tolist()
                self.cache.put(keys[index], "embeddings", self.settings.embedding_model, vectors[index])

        async def run() -> None:
            outcomes = await asyncio.gather(*(one(group) for group in groups), return_exceptions=True)
            failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
            if failures:  # the other batches were cached; the stage cannot finish without these
                lost = sum(len(group) for group, outcome in zip(groups, outcomes) if isinstance(outcome, BaseException))
                stats.unanswered("embedding_without_answer", lost, failures[0])
                raise failures[0]

        if groups:
            self.client.run(run())
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return normalise_rows(np.asarray([vectors[i] for i in range(len(texts))], dtype=np.float32))


class LLMJudge(_Stages):
    """`Judge` over an OpenAI-compatible API: one request per primary event for all its
    uncached candidates, each verdict with a reason, cached per (primary, candidate) pair."""

    counters = ("judge",)

    def __init__(self, client: LLMClient, cache: ResponseCache) -> None:
        super().__init__(client, cache)
        self.name = f"llm:{self.settings.model('judge')}"

    @staticmethod
    def _view(event: EventView, index: int | None = None) -> dict:
        return {"index": index, "statement": event.statement, "statement_type": event.statement_type,
                "temporal_type": event.temporal_type,
                "valid_at": event.valid_at.isoformat() if event.valid_at else None,
                "invalid_at": event.invalid_at.isoformat() if event.invalid_at else None,
                "triplets": [t.__dict__ for t in event.triplets]}

    def _pair_key(self, primary: EventView, candidate: EventView) -> str:
        text = repr((self._view(primary), self._view(candidate)))
        return cache_key("judge", self.settings.model("judge"), template_sha256(TEMPLATES["judge"]), self.settings.fingerprint("judge"), text)

    def judge(self, cases: Sequence[JudgeCase]) -> list[list[Verdict]]:
        stats = self.stats("judge")
        answers: list[list[Verdict | None]] = [[None] * len(case.candidates) for case in cases]
        pending: list[tuple[int, list[int]]] = []
        for case_index, case in enumerate(cases):
            missing = []
            for candidate_index, candidate in enumerate(case.candidates):
                cached = self.cache.get(self._pair_key(case.primary, candidate))
                if cached is not None:
                    stats.cache_hits += 1
                    answers[case_index][candidate_index] = Verdict(bool(cached["invalidates"]), cached["reason"])
                else:
                    missing.append(candidate_index)
            if missing:
                pending.append((case_index, missing))

        last_error: list[BaseException] = []

        async def ask(case_index: int, candidate_indices: list[int]) -> None:
            case = cases[case_index]
            prompt = render(TEMPLATES["judge"], primary=self._view(case.primary), single_valued=policy.POLICY.describe_single_valued(),
                            candidates=[self._view(case.candidates[c], local) for local, c in enumerate(candidate_indices)])
            try:
                verdicts = await self.client.structured("judge", prompt, JudgeOut,
                                                        lambda text: parse_verdicts(text, len(candidate_indices), stats), stats)
            except (InvalidOutput, RequestFailed) as error:
                log.warning("judge: event %s: no usable verdicts: %s", case.primary.event_id, error)
                last_error[:] = [error]
                verdicts = {}
            for local, candidate_index in enumerate(candidate_indices):
                if local not in verdicts:
                    continue
                invalidates, reason = verdicts[local]
                answers[case_index][candidate_index] = Verdict(invalidates, reason)
                self.cache.put(self._pair_key(case.primary, case.candidates[candidate_index]), "judge",
                               self.settings.model("judge"), {"invalidates": invalidates, "reason": reason})

        async def run() -> None:
            await asyncio.gather(*(ask(case_index, indices) for case_index, indices in pending))

        if pending:
            self.client.run(run())
        result = []
        for case_answers in answers:
            row = []
            for verdict in case_answers:
                if verdict is None:
                    stats.unanswered("pair_without_verdict", error=last_error[0] if last_error else None)
                    verdict = Verdict(False, "no verdict from the judge; left valid (counted as dropped)")
                row.append(verdict)
            result.append(row)
        return result

