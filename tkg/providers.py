"""The models tkg runs with, behind small interfaces, bundled in one object the phases receive.

- an `Extractor` (tkg.extract.base): the offline rules, or prompts against an OpenAI-compatible
  server (tkg.llm.extractor.LLMExtractor);
- a `Judge` (tkg.invalidate.judges): the rule judge, or the LLM judge;
- an `Embedder` (tkg.core.embeddings) for statements and entity descriptions: wordllama, or the
  embeddings API; chunking always embeds with the local wordllama model.

`open_providers(settings)` makes them from the settings; `fingerprints(settings)` says what
shapes each stage's output without starting a client (the stages' code versions); reads
(tkg.answer) get their client from `llm_client(settings)`. Every provider keeps usage counters
(tkg.core.results.Counted) that the stage runner reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tkg.core import policy
from tkg.core.embeddings import Embedder, WordLlamaEmbedder, wordllama_name
from tkg.core.policy import vocabulary_fingerprint
from tkg.core.results import StageStats
from tkg.extract.base import Extractor
from tkg.extract.offline import OfflineExtractor
from tkg.ingest.chunking import ChunkingSettings
from tkg.invalidate.judges import Judge, RuleJudge
from tkg.settings import Settings


@dataclass
class Providers:
    extractor: Extractor
    judge: Judge
    embedder: Embedder  # statements and entity descriptions
    chunk_embedder: Embedder = field(default_factory=WordLlamaEmbedder)  # sentence windows, always local
    chunking: ChunkingSettings = field(default_factory=ChunkingSettings)

    def _owner(self, counter: str) -> Any:
        for provider in (self.extractor, self.embedder, self.judge):
            if counter in provider.counters:
                return provider
        return None

    def stats(self, counter: str) -> StageStats | None:
        """The usage counter `counter` (None when no provider keeps it, e.g. local embeddings)."""
        owner = self._owner(counter)
        return owner.stats(counter) if owner is not None else None

    def usage_row(self, counter: str, usage: StageStats) -> dict[str, Any] | None:
        """A row of `llm_calls` for `usage` of `counter`; None for providers that pay for nothing."""
        owner = self._owner(counter)
        return owner.usage_row(counter, usage) if owner is not None and not usage.idle else None


def llm_client(settings: Settings, api_key: str | None = None):
    """The process's client for the configured server (one per configuration, sharing one
    request limiter) and the response cache: what the LLM providers and the answer agent use."""
    from tkg.llm.cache import open_cache
    from tkg.llm.extractor import shared_client

    client = shared_client(settings.llm, api_key or os.environ.get("OPENAI_API_KEY"))
    if settings.llm.llm_mode == "batch" and client.batches is None:
        from tkg.llm.batch import BatchRunner

        # Batch ids live beside the data, so a rerun on the same folder resumes them.
        client.batches = BatchRunner(client, settings.home / "cache" / "llm_batches.sqlite")
    return client, open_cache(settings.home, settings.cache)


def open_providers(settings: Settings, api_key: str | None = None) -> Providers:
    """The providers `settings` choose. With the offline backend nothing starts a client."""
    if settings.offline:
        extractor, judge = OfflineExtractor(), RuleJudge()
    else:
        from tkg.llm.extractor import LLMExtractor, LLMJudge

        client, cache = llm_client(settings, api_key)
        extractor, judge = LLMExtractor(client, cache), LLMJudge(client, cache)
    return Providers(extractor, judge, open_embedder(settings, api_key))


def open_embedder(settings: Settings, api_key: str | None = None) -> Embedder:
    """The statement embedder `settings` choose (what the graph's vectors and questions use)."""
    if settings.embeddings == "wordllama":
        return WordLlamaEmbedder()
    from tkg.llm.extractor import OpenAIEmbedder

    return OpenAIEmbedder(*llm_client(settings, api_key))


@dataclass(frozen=True)
class Fingerprints:
    """What shapes each stage's output besides its inputs, computed from the settings alone: the
    stage catalog (tkg.build.catalog) turns these into code versions."""

    extractor: Callable[[str], str]  # task -> hash of its prompt template (or rule set), model and settings
    judge: str  # the judge's code version: its name and what decides its verdicts
    embedder: str  # the statement embedder's name
    chunk_embedder: str = wordllama_name()
    chunking: ChunkingSettings = ChunkingSettings()
    shards: int = 8  # how the global steps split their blocks: it shapes their intermediate files, not their results
    policy: str = ""  # the invalidation policy's fingerprint (candidate selection reads its thresholds)


def fingerprints(settings: Settings) -> Fingerprints:
    if settings.offline:
        extractor = OfflineExtractor().settings_fingerprint
        judge = f"{RuleJudge.name}:{RuleJudge().settings_fingerprint('judge')}"
    else:
        from tkg.llm.extractor import stage_fingerprint

        def extractor(task: str) -> str:
            return stage_fingerprint(settings.llm, task)

        judge = f"llm:{settings.llm.model('judge')}:{extractor('judge')}"
    return Fingerprints(extractor=extractor, judge=judge, embedder=settings.embedder_name(), shards=settings.shards,
                        policy=f"{vocabulary_fingerprint()}:{policy.POLICY.fingerprint()}")
