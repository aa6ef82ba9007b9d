"""Which extractor, judge and embedders run, and their code versions: plain Python.

`Backend` holds the settings that were chosen explicitly (by a Dagster resource, the CLI or a
worker process); every field left unset falls back to its TKG_* variable (see README). The
Dagster resource `resources.tkg.ExtractionBackend` wraps it, so planning a build and running
workers never needs to import dagster.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from tkg.build.stages import Components
from tkg.build.state import judge_code_version, stage_code_versions
from tkg.core.embeddings import Embedder, WordLlamaEmbedder
from tkg.extract.base import Extractor
from tkg.extract.offline import OfflineExtractor
from tkg.invalidate.invalidation import Judge, RuleJudge
from tkg.llm.settings import LLMSettings, choose_backend, choose_embeddings, settings_from_env

# The fields a worker process needs to build the same components (the key is not one of them:
# workers read OPENAI_API_KEY from the environment they inherit).
EXPLICIT_FIELDS = ("backend", "embeddings", "base_url", "api_mode", "batch_size", "max_in_flight", "service_tier", "cache")


def default_home() -> str:
    return os.environ.get("TKG_HOME", os.path.join(os.getcwd(), "tkg_data"))


def allow_partial_from_env() -> bool:
    return os.environ.get("TKG_ALLOW_PARTIAL", "") not in ("", "0", "false")


@dataclass(frozen=True)
class Backend:
    backend: str | None = None  # openai | offline (TKG_LLM)
    embeddings: str | None = None  # openai | wordllama (TKG_EMBEDDINGS)
    api_key: str | None = field(default=None, repr=False)
    base_url: str | None = None
    api_mode: str | None = None
    batch_size: int | None = None
    max_in_flight: int | None = None
    service_tier: str | None = None
    cache: str | None = field(default=None, repr=False)  # postgresql://... (TKG_CACHE); may hold a password
    home: str = field(default_factory=default_home)
    allow_partial: bool = field(default_factory=allow_partial_from_env)

    def llm_settings(self) -> LLMSettings:
        overrides = {name: getattr(self, name) for name in ("base_url", "api_mode", "batch_size", "max_in_flight", "service_tier")
                     if getattr(self, name) is not None}
        return replace(settings_from_env(), **overrides)

    def resolved_backend(self) -> str:
        return choose_backend(self.backend, self.base_url)

    def _embeddings(self) -> str:
        return choose_embeddings(self.embeddings, self.resolved_backend())

    def _llm(self):
        from tkg.llm.cache import open_cache
        from tkg.llm.extractor import shared_client

        return (shared_client(self.llm_settings(), self.api_key or os.environ.get("OPENAI_API_KEY")),
                open_cache(self.home, self.cache))

    def extractor(self) -> Extractor:
        if self.resolved_backend() == "offline":
            return OfflineExtractor()
        from tkg.llm.extractor import LLMExtractor

        return LLMExtractor(*self._llm())

    def judge(self) -> Judge:
        if self.resolved_backend() == "offline":
            return RuleJudge()
        from tkg.llm.extractor import LLMJudge

        return LLMJudge(*self._llm())

    def embedder(self) -> Embedder:
        """Statement and entity-description embeddings."""
        if self._embeddings() == "wordllama":
            return WordLlamaEmbedder()
        from tkg.llm.extractor import OpenAIEmbedder

        return OpenAIEmbedder(*self._llm())

    def chunk_embedder(self) -> Embedder:
        """Chunking embeds every sentence window: always the local model, never worth paying for."""
        return WordLlamaEmbedder()

    def components(self) -> Components:
        """The extractor and embedders the partitioned stages run with."""
        return Components(self.extractor(), self.embedder(), self.chunk_embedder(), allow_partial=self.allow_partial)

    def describe(self) -> str:
        """One line for logs: backend, models, server, batching. Never the key."""
        backend, embeddings = self.resolved_backend(), self._embeddings()
        if backend == "offline":
            return f"offline rules and judge, {embeddings} embeddings"
        settings = self.llm_settings()
        return (f"openai-compatible at {settings.base_url or 'api.openai.com'} ({settings.api_mode} API), "
                f"models {settings.models}, batch size {settings.batch_size}, at most {settings.max_in_flight} in flight, "
                f"{embeddings} embeddings")

    def explicit_fields(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in EXPLICIT_FIELDS if getattr(self, name) is not None}

    def _fingerprint(self) -> Callable[[str], str]:
        if self.resolved_backend() == "offline":
            return OfflineExtractor().settings_fingerprint
        from tkg.llm.extractor import stage_fingerprint

        settings = self.llm_settings()
        return lambda stage: stage_fingerprint(settings, stage)

    def embedder_name(self) -> str:
        if self._embeddings() == "wordllama":
            return WordLlamaEmbedder().name
        settings = self.llm_settings()
        return f"{settings.embedding_model}-{settings.embedding_dimensions}"

    def code_versions(self) -> dict[str, str]:
        """The code version of every partitioned stage (a hash of the prompt template, model and
        settings, or of the rule set), without starting a client: a new prompt or model marks
        the asset stale in the UI and makes `tkg build` rebuild what it shapes."""
        return stage_code_versions(self._fingerprint(), self.embedder_name(), WordLlamaEmbedder().name)

    def judge_code_version(self) -> str:
        if self.resolved_backend() == "offline":
            return judge_code_version(RuleJudge.name, RuleJudge().settings_fingerprint("judge"))
        return judge_code_version(f"llm:{self.llm_settings().model('judge')}", self._fingerprint()("judge"))

    def as_fields(self) -> dict[str, object]:
        return {key: value for key, value in asdict(self).items() if key not in ("api_key", "cache")}
