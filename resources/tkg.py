"""Configurable resources: where data lives, where transcripts come from, and which extraction
backend (offline rules or an OpenAI-compatible LLM) and embedder run."""


import logging
import os
from pathlib import Path

import dagster as dg
from pydantic import Field

from tkg.embeddings import Embedder, WordLlamaEmbedder
from tkg.extraction.base import Extractor
from tkg.extraction.offline import OfflineExtractor
from tkg.invalidation import Judge, RuleJudge
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
    """Statement, date and triplet extraction, the invalidation judge and the embedder.

    `backend` 'offline' runs the rule-based extractor and judge with wordllama embeddings; no
    key, no network.
    """

    backend: str = Field(default_factory=lambda: os.environ.get("TKG_LLM", "offline"), description="offline (TKG_LLM)")

    @staticmethod
    def code_version_for(stage: str) -> str:
        """Code version of an extraction stage: a hash of what changes its output, so a new
        prompt, model or rule set marks the asset stale in the UI."""
        return OfflineExtractor().settings_fingerprint(stage)

    def extractor(self) -> Extractor:
        return OfflineExtractor()

    def judge(self) -> Judge:
        return RuleJudge()

    def embedder(self) -> Embedder:
        return WordLlamaEmbedder()
