"""Configurable resources: where data lives, where transcripts come from, and which extraction
backend (offline rules or an OpenAI-compatible LLM) and embedder run."""


import os
from pathlib import Path

import dagster as dg
from pydantic import Field

from tkg.build.stages import Components
from tkg.core.embeddings import Embedder
from tkg.extract.base import Extractor
from tkg.ingest.sources import LoadedSource, describe, load_source
from tkg.invalidate.invalidation import Judge
from tkg.llm.settings import LLMSettings
from tkg.providers import Backend, allow_partial_from_env, default_home
from tkg.store.parquet import ParquetStore, download, upload


class TkgStorage(dg.ConfigurableResource):
    """The Parquet tree (system of record) and the published DuckDB file.

    On one machine everything sits under `home`. Past one machine, `storage` puts the Parquet
    system of record in an object store (s3://bucket/prefix, credentials and AWS_ENDPOINT_URL
    from the standard AWS variables), and `duckdb_upload` shares each published file, so that
    workers with separate disks build one graph."""

    home: str = Field(default_factory=default_home, description="Folder for Parquet files, caches and tkg.duckdb (TKG_HOME)")
    duckdb_path: str | None = Field(None, description="Published DuckDB file; defaults to <home>/tkg.duckdb (TKG_DUCKDB)")
    storage: str | None = Field(default_factory=lambda: os.environ.get("TKG_STORAGE") or None,
                                description="Root of the Parquet system of record: a folder or s3://bucket/prefix; "
                                            "defaults to <home>/parquet (TKG_STORAGE)")
    duckdb_upload: str | None = Field(default_factory=lambda: os.environ.get("TKG_DUCKDB_UPLOAD") or None,
                                      description="s3://bucket/key the published DuckDB file is uploaded to after each "
                                                  "publish, and fetched from by steps on other machines (TKG_DUCKDB_UPLOAD)")

    @property
    def store(self) -> ParquetStore:
        return ParquetStore(self.home, self.storage)

    def share_warehouse(self) -> None:
        """Upload the published file, when an upload target is configured."""
        if self.duckdb_upload:
            upload(self.warehouse_path, self.duckdb_upload)

    def fetch_warehouse(self) -> None:
        """Replace the local copy with the shared one (another machine may have published it)."""
        if self.duckdb_upload:
            download(self.duckdb_upload, self.warehouse_path)

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
    batch_size: int | None = Field(None, description="statements per validity/triplet/figure request (TKG_BATCH_SIZE)")
    max_in_flight: int | None = Field(None, description="requests in flight at most (TKG_MAX_IN_FLIGHT)")
    service_tier: str | None = Field(None, description="e.g. flex (TKG_SERVICE_TIER)")
    cache: str | None = Field(None, description="A shared response cache: postgresql://user:password@host/db; unset, a "
                                                "SQLite file under <home>/cache (TKG_CACHE). Set it from an EnvVar: it "
                                                "may hold a password")
    home: str = Field(default_factory=default_home, description="where the response cache lives (<home>/cache)")
    allow_partial: bool = Field(
        default_factory=allow_partial_from_env,
        description="Write what a stage extracted even when the provider left items unanswered, and say what is "
                    "missing (TKG_ALLOW_PARTIAL). Off: such a stage fails and keeps the partition's last good output")

    def plain(self) -> Backend:
        """The same settings as a plain `tkg.providers.Backend` (what the work is done with)."""
        return Backend(**{name: getattr(self, name) for name in Backend.__dataclass_fields__})

    def llm_settings(self) -> LLMSettings:
        return self.plain().llm_settings()

    def resolved_backend(self) -> str:
        return self.plain().resolved_backend()

    def extractor(self) -> Extractor:
        return self.plain().extractor()

    def judge(self) -> Judge:
        return self.plain().judge()

    def embedder(self) -> Embedder:
        return self.plain().embedder()

    def chunk_embedder(self) -> Embedder:
        return self.plain().chunk_embedder()

    def components(self) -> Components:
        return self.plain().components()

    def describe(self) -> str:
        return self.plain().describe()

    def explicit_fields(self) -> dict[str, object]:
        return self.plain().explicit_fields()

    def code_versions(self) -> dict[str, str]:
        return self.plain().code_versions()

    def judge_code_version(self) -> str:
        return self.plain().judge_code_version()


def extraction_backend_from_env(**fields: object) -> ExtractionBackend:
    """The resource as `dagster dev` and `tkg build` configure it (with `fields` set
    explicitly): the key comes from the environment as an EnvVar, so Dagster shows the
    variable's name, never its value."""
    if os.environ.get("OPENAI_API_KEY"):
        fields["api_key"] = dg.EnvVar("OPENAI_API_KEY")
    return ExtractionBackend(**fields)
