"""Configurable resources: where data lives, where transcripts come from, and which extraction
backend (offline rules or an OpenAI-compatible LLM) and embedder run.

They are the Dagster face of `tkg.settings.Settings`, split by concern so the launchpad shows
each on its own: `resources_for(settings)` makes them from resolved settings (what `tkg build`
and the code location do), and `settings_of(...)` resolves them back, a field left unset
falling back to its TKG_* variable, as everywhere in tkg.
"""

import os

import dagster as dg
from pydantic import Field

from tkg.settings import Settings
from tkg.store.parquet import download, upload


class TkgStorage(dg.ConfigurableResource):
    """The Parquet tree (system of record) and the published DuckDB file.

    On one machine everything sits under `home`. Past one machine, `storage` puts the Parquet
    system of record in an object store (s3://bucket/prefix, credentials and AWS_ENDPOINT_URL
    from the standard AWS variables), and `duckdb_upload` shares each published file, so that
    workers with separate disks build one graph."""

    home: str | None = Field(None, description="Folder for Parquet files, caches and tkg.duckdb (TKG_HOME; default ./tkg_data)")
    duckdb_path: str | None = Field(None, description="Published DuckDB file; defaults to <home>/tkg.duckdb (TKG_DUCKDB)")
    storage: str | None = Field(None, description="Root of the Parquet system of record: a folder or s3://bucket/prefix; "
                                                   "defaults to <home>/parquet (TKG_STORAGE)")
    duckdb_upload: str | None = Field(None, description="s3://bucket/key the published DuckDB file is uploaded to after "
                                                         "each publish, and fetched from by steps on other machines "
                                                         "(TKG_DUCKDB_UPLOAD)")
    shards: int | None = Field(None, description="How many shards the global half splits its blocks into (TKG_SHARDS; "
                                                 "default 8). Results do not depend on it; each shard is one run")


class TranscriptSource(dg.ConfigurableResource):
    """Where transcripts come from: 'sample' (bundled), a parquet/jsonl/csv path, or 'hf'."""

    source: str | None = Field(None, description="'sample', a local .parquet/.jsonl/.csv with company,date,transcript, "
                                                 "or 'hf' (TKG_SOURCE; default 'sample')")


class ExtractionBackend(dg.ConfigurableResource):
    """Statement, date and triplet extraction, the invalidation judge and the embedders.

    `backend`: 'offline' runs the rule-based extractor and judge with wordllama embeddings (no
    key, no network); 'openai' runs the prompts in prompts/ against OpenAI or any
    OpenAI-compatible server (`base_url`). Unset, it follows TKG_LLM, else 'openai' when
    OPENAI_API_KEY is set or a server is configured (`base_url` / OPENAI_BASE_URL), else
    'offline'. Every unset field falls back to its TKG_* variable (see README). Chunking always
    uses the local wordllama embeddings: it embeds every sentence window and is not worth
    paying for.
    """

    backend: str | None = Field(None, description="openai | offline (TKG_LLM)")
    embeddings: str | None = Field(None, description="openai | wordllama for statement embeddings (TKG_EMBEDDINGS)")
    api_key: str | None = Field(None, description="Set from EnvVar('OPENAI_API_KEY'); never logged or stored")
    base_url: str | None = Field(None, description="OpenAI-compatible server, e.g. http://localhost:8000/v1 (OPENAI_BASE_URL)")
    api_mode: str | None = Field(None, description="responses | chat (TKG_API_MODE)")
    batch_size: int | None = Field(None, description="statements per validity/triplet/figure request (TKG_BATCH_SIZE)")
    max_in_flight: int | None = Field(None, description="requests in flight at most (TKG_MAX_IN_FLIGHT)")
    service_tier: str | None = Field(None, description="e.g. flex (TKG_SERVICE_TIER)")
    llm_mode: str | None = Field(None, description="sync | batch: LLM stages through OpenAI's Batch API at half price, "
                                                   "answers within 24 h, resumable (TKG_LLM_MODE)")
    cache: str | None = Field(None, description="A shared response cache: postgresql://user:password@host/db; unset, a "
                                                "SQLite file under <home>/cache (TKG_CACHE). Set it from an EnvVar: it "
                                                "may hold a password")
    allow_partial: bool | None = Field(
        None, description="Write what a stage extracted when the provider left items unanswered, and say what is missing "
                          "(TKG_ALLOW_PARTIAL). Off: such a stage fails and keeps the partition's last good output")


def settings_of(storage: TkgStorage, source: TranscriptSource | None = None,
                extraction: ExtractionBackend | None = None) -> Settings:
    """The settings the resources give (their unset fields from the environment)."""
    source = source or TranscriptSource()
    extraction = extraction or ExtractionBackend()
    return Settings.resolve(
        home=storage.home, warehouse=storage.duckdb_path, storage=storage.storage, duckdb_upload=storage.duckdb_upload,
        shards=storage.shards,
        source=source.source, backend=extraction.backend, embeddings=extraction.embeddings, base_url=extraction.base_url,
        api_mode=extraction.api_mode, batch_size=extraction.batch_size, max_in_flight=extraction.max_in_flight,
        service_tier=extraction.service_tier, cache=extraction.cache, allow_partial=extraction.allow_partial,
        llm_mode=extraction.llm_mode)


def resources_for(settings: Settings) -> dict[str, dg.ConfigurableResource]:
    """The resources of `settings`. The key and a shared cache URL are not copied in: the key
    comes from the environment as an EnvVar, so Dagster shows the variable's name, never its
    value, and the cache URL is read from TKG_CACHE where it is used."""
    llm = settings.llm
    return {
        "storage": TkgStorage(home=str(settings.home), duckdb_path=str(settings.warehouse), storage=settings.storage,
                              duckdb_upload=settings.duckdb_upload, shards=settings.shards),
        "source": TranscriptSource(source=settings.source),
        "extraction": ExtractionBackend(
            backend=settings.backend, embeddings=settings.embeddings, base_url=llm.base_url, api_mode=llm.api_mode,
            batch_size=llm.batch_size, max_in_flight=llm.max_in_flight, service_tier=llm.service_tier,
            llm_mode=llm.llm_mode, allow_partial=settings.allow_partial,
            api_key=dg.EnvVar("OPENAI_API_KEY") if os.environ.get("OPENAI_API_KEY") else None),
    }


def share_warehouse(settings: Settings) -> None:
    """Upload the published file, when an upload target is configured."""
    if settings.duckdb_upload:
        upload(settings.warehouse, settings.duckdb_upload)


def fetch_warehouse(settings: Settings) -> None:
    """Replace the local copy with the shared one (another machine may have published it)."""
    if settings.duckdb_upload:
        download(settings.duckdb_upload, settings.warehouse)
