"""Configurable resources: where data lives, where transcripts come from, and which extraction
backend (offline rules or an OpenAI-compatible LLM) and embedder run."""


import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import dagster as dg
from pydantic import Field

from tkg.build import Components, judge_code_version, stage_code_versions
from tkg.embeddings import Embedder, WordLlamaEmbedder
from tkg.extraction.base import Extractor
from tkg.extraction.offline import OfflineExtractor
from tkg.invalidation import Judge, RuleJudge
from tkg.llm.settings import LLMSettings, choose_backend, choose_embeddings, settings_from_env
from tkg.sources import LoadedSource, describe, load_source
from tkg.store import ParquetStore

log = logging.getLogger(__name__)


def default_home() -> str:
    return os.environ.get("TKG_HOME", str(Path.cwd() / "tkg_data"))


class TkgStorage(dg.ConfigurableResource):
    """The Parquet tree (system of record) and the published DuckDB file."""

    home: str = Field(default_factory=default_home, description="Folder for Parquet files, caches and tkg.duckdb (TKG_HOME)")
    duckdb_path: str | None = Field(None, description="Published DuckDB file; defaults to <home>/tkg.duckdb (TKG_DUCKDB)")

    @property
    def store(self) -> ParquetStore:
        return ParquetStore(self.home)

    @property
    def warehouse_path(self) -> Path:
        return Path(self.duckdb_path or os.environ.get("TKG_DUCKDB") or Path(self.home) / "tkg.duckdb").expanduser().resolve()


class TranscriptSource(dg.ConfigurableResource):
    """Where transcripts come from: 'sample' (bundled), a parquet/jsonl/csv path, or 'hf'."""

    source: str = Field(default_factory=lambda: os.environ.get("TKG_SOURCE", "sample"),
                        description="'sample', a local .parquet/.jsonl/.csv with company,date,transcript, or 'hf' (TKG_SOURCE)")

    def load(self) -> LoadedSource:
        return load_source(self.source)

    def describe(self) -> str:
        return describe(self.source)


class ExtractionBackend(dg.ConfigurableResource):
    """Statement, date and triplet extraction, the invalidation judge and the embedders.

    `backend`: 'offline' runs the rule-based extractor and judge with wordllama embeddings (no
    key, no network); 'openai' runs the prompts in prompts/ against OpenAI or any
    OpenAI-compatible server (`base_url`). Unset, it follows TKG_LLM, else 'openai' when
    OPENAI_API_KEY is set or a server is configured (`base_url` / OPENAI_BASE_URL), else
    'offline'. Every unset field falls back to its TKG_* variable
    (see README). Chunking always uses the local wordllama embeddings: it embeds every
    sentence window and is not worth paying for.
    """

    backend: str | None = Field(None, description="openai | offline (TKG_LLM)")
    embeddings: str | None = Field(None, description="openai | wordllama for statement embeddings (TKG_EMBEDDINGS)")
    api_key: str | None = Field(None, description="Set from EnvVar('OPENAI_API_KEY'); never logged or stored")
    base_url: str | None = Field(None, description="OpenAI-compatible server, e.g. http://localhost:8000/v1 (OPENAI_BASE_URL)")
    api_mode: str | None = Field(None, description="responses | chat (TKG_API_MODE)")
    batch_size: int | None = Field(None, description="statements per validity/triplet request (TKG_BATCH_SIZE)")
    max_in_flight: int | None = Field(None, description="requests in flight at most (TKG_MAX_IN_FLIGHT)")
    service_tier: str | None = Field(None, description="e.g. flex (TKG_SERVICE_TIER)")
    home: str = Field(default_factory=default_home, description="where the response cache lives (<home>/cache)")
    allow_partial: bool = Field(
        default_factory=lambda: os.environ.get("TKG_ALLOW_PARTIAL", "") not in ("", "0", "false"),
        description="Write what a stage extracted even when the provider left items unanswered, and say what is "
                    "missing (TKG_ALLOW_PARTIAL). Off: such a stage fails and keeps the partition's last good output")

    def llm_settings(self) -> LLMSettings:
        settings = settings_from_env()
        overrides = {name: getattr(self, name) for name in ("base_url", "api_mode", "batch_size", "max_in_flight", "service_tier")
                     if getattr(self, name) is not None}
        return replace(settings, **overrides)

    def resolved_backend(self) -> str:
        return choose_backend(self.backend, self.base_url)

    def _llm(self):
        from tkg.llm.extractor import open_cache, shared_client

        return shared_client(self.llm_settings(), self.api_key or os.environ.get("OPENAI_API_KEY")), open_cache(self.home)

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
        if choose_embeddings(self.embeddings, self.resolved_backend()) == "wordllama":
            return WordLlamaEmbedder()
        from tkg.llm.extractor import OpenAIEmbedder

        return OpenAIEmbedder(*self._llm())

    def describe(self) -> str:
        """One line for logs: backend, models, server, batching. Never the key."""
        backend = self.resolved_backend()
        embeddings = choose_embeddings(self.embeddings, backend)
        if backend == "offline":
            return f"offline rules and judge, {embeddings} embeddings"
        settings = self.llm_settings()
        return (f"openai-compatible at {settings.base_url or 'api.openai.com'} ({settings.api_mode} API), "
                f"models {settings.models}, batch size {settings.batch_size}, at most {settings.max_in_flight} in flight, "
                f"{embeddings} embeddings")

    def chunk_embedder(self) -> Embedder:
        return WordLlamaEmbedder()

    def components(self) -> Components:
        """The extractor and embedders the partitioned stages run with."""
        return Components(self.extractor(), self.embedder(), self.chunk_embedder(), allow_partial=self.allow_partial)

    def explicit_fields(self) -> dict[str, object]:
        """The fields that were set (not left to their TKG_* variables), for worker processes."""
        return {name: getattr(self, name) for name in ("backend", "embeddings", "base_url", "api_mode", "batch_size",
                                                        "max_in_flight", "service_tier") if getattr(self, name) is not None}

    def _fingerprint(self) -> Callable[[str], str]:
        if self.resolved_backend() == "offline":
            return OfflineExtractor().settings_fingerprint
        from tkg.llm.extractor import stage_fingerprint

        settings = self.llm_settings()
        return lambda stage: stage_fingerprint(settings, stage)

    def embedder_name(self) -> str:
        if choose_embeddings(self.embeddings, self.resolved_backend()) == "wordllama":
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
            return judge_code_version(RuleJudge.name)
        return judge_code_version(f"llm:{self.llm_settings().model('judge')}", self._fingerprint()("judge"))


def extraction_backend_from_env(**fields: object) -> ExtractionBackend:
    """The resource as `dagster dev` and `tkg build` configure it (with `fields` set
    explicitly): the key comes from the environment as an EnvVar, so Dagster shows the
    variable's name, never its value."""
    if os.environ.get("OPENAI_API_KEY"):
        fields["api_key"] = dg.EnvVar("OPENAI_API_KEY")
    return ExtractionBackend(**fields)
