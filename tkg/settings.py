"""Every setting of a tkg process, resolved once.

The command line (or the Dagster resources) comes first, then the TKG_* variables, then the
defaults. `Settings.resolve` is the one place that reads them; the frozen `Settings` it returns
is passed down to the Dagster definitions, the worker processes, the providers and the stores,
none of which reads the environment for these settings again.

Secrets are not part of it. The API key is read where a client is made (OPENAI_API_KEY, or the
Dagster resource's EnvVar), and a shared cache URL (which may hold a password) is kept out of
repr, logs and metadata.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import duckdb

from tkg.core.embeddings import wordllama_name
from tkg.core.machine import SIZE_UNITS, usable_cores
from tkg.llm.settings import (
    LLMSettings,
    choose_backend,
    choose_embeddings,
    settings_from_env,
)
from tkg.store.parquet import ParquetStore, spilling_connection


def _path(value: str | os.PathLike) -> Path:
    return Path(value).expanduser().resolve()


def _flag(value: str | None) -> bool:
    return (value or "") not in ("", "0", "false")


def _shards(value: str | None) -> int:
    if not value:
        return 8
    if not value.isdigit() or not 1 <= int(value) <= 4096:
        raise ValueError(f"TKG_SHARDS={value!r} is not a shard count; give a whole number from 1 to 4096")
    return int(value)


def size_in_bytes(value: str, variable: str) -> int:
    """'4GB', '512MB', '1.5GiB' in bytes; anything else is an error naming `variable`."""
    text = value.strip().upper().replace(" ", "")
    number = text.rstrip("KMGTIB")
    unit = text[len(number):]
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if unit not in SIZE_UNITS or amount <= 0:
        raise ValueError(f"{variable}={value!r} is not a size; give one like 4GB, 512MB or 1.5GiB")
    return int(amount * SIZE_UNITS[unit])


def _count(value: str | None, default: int, variable: str, meaning: str) -> int:
    """A positive whole number setting, checked now rather than when a run first uses it."""
    if not value:
        return default
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"{variable}={value!r} is not {meaning}; give a whole number of 1 or more")
    return int(value)


def _size(value: str | None, default: str, variable: str) -> str:
    """A memory setting, checked now rather than when a step first uses it."""
    chosen = value or default
    size_in_bytes(chosen, variable)
    return chosen


@dataclass(frozen=True)
class Settings:
    home: Path  # Parquet (by default), caches, the Dagster instance, tkg.duckdb (TKG_HOME)
    warehouse: Path  # the published DuckDB file (TKG_DUCKDB; default <home>/tkg.duckdb)
    storage: str  # root of the Parquet system of record: a folder or s3://bucket/prefix (TKG_STORAGE)
    dagster_home: Path  # the Dagster instance (DAGSTER_HOME; default <home>/dagster_home)
    source: str = "sample"  # 'sample', a .parquet/.jsonl/.csv file, or 'hf' (TKG_SOURCE)
    backend: str = "offline"  # offline | openai: extraction and the judge (TKG_LLM)
    embeddings: str = "wordllama"  # wordllama | openai: statement and description embeddings (TKG_EMBEDDINGS)
    llm: LLMSettings = field(default_factory=LLMSettings)  # models, server, batching, limits (TKG_MODEL_*, ...)
    duckdb_upload: str | None = None  # s3://bucket/key each published file is shared at (TKG_DUCKDB_UPLOAD)
    cache: str | None = field(default=None, repr=False)  # a shared postgresql:// response cache (TKG_CACHE)
    allow_partial: bool = False  # keep what a stage extracted when items went unanswered (TKG_ALLOW_PARTIAL)
    step_memory: str = "2GB"  # what a global step's DuckDB may hold before it spills to disk (TKG_STEP_MEMORY)
    shards: int = 8  # how many shards the global steps split their blocks into (TKG_SHARDS); results do not depend on it
    memory_limit: str = "4GB"  # the most one global step or shard may hold; past it, it stops with a message (TKG_MEMORY_LIMIT)
    # The most a global step's DuckDB (or the publish) may spill to disk; unset, half the disk's
    # free space when the step starts, so that a runaway query never fills it (TKG_STEP_DISK)
    step_disk: str | None = None
    # DuckDB's threads in a global step's connection: unset, one per core; a process of a pool of
    # worker processes takes its share of the cores (for_workers), so that the pool does not run
    # more threads than there are cores, each paying to share them
    duckdb_threads: int | None = None
    # A UI backfill's runs: at most this many partitions each, built by this many worker processes
    # of tkg build's pool (1: in the run's own process). TKG_PARTITIONS_PER_RUN=1 is one run per partition.
    partitions_per_run: int = 50  # (TKG_PARTITIONS_PER_RUN) ten years of a company's quarters, plus the one under way
    run_workers: int = 1  # (TKG_RUN_WORKERS) runs already go side by side, one per core (the run queue)

    @classmethod
    def resolve(cls, *, home: str | os.PathLike | None = None, warehouse: str | os.PathLike | None = None,
                storage: str | None = None, duckdb_upload: str | None = None, source: str | None = None,
                backend: str | None = None, embeddings: str | None = None, base_url: str | None = None,
                api_mode: str | None = None, batch_size: int | None = None, max_in_flight: int | None = None,
                service_tier: str | None = None, cache: str | None = None, allow_partial: bool | None = None,
                shards: int | None = None, llm_mode: str | None = None) -> Settings:
        """The settings a value given here, else its variable, else its default, decides."""
        environ = os.environ
        home_path = _path(home or environ.get("TKG_HOME") or "tkg_data")
        overrides = {name: value for name, value in (("base_url", base_url), ("api_mode", api_mode),
                                                      ("batch_size", batch_size), ("max_in_flight", max_in_flight),
                                                      ("service_tier", service_tier), ("llm_mode", llm_mode))
                     if value is not None}
        llm = replace(settings_from_env(), **overrides)
        chosen = choose_backend(backend, llm.base_url)
        return cls(
            home=home_path,
            warehouse=_path(warehouse or environ.get("TKG_DUCKDB") or home_path / "tkg.duckdb"),
            storage=storage or environ.get("TKG_STORAGE") or str(home_path / "parquet"),
            dagster_home=_path(environ["DAGSTER_HOME"]) if environ.get("DAGSTER_HOME") else home_path / "dagster_home",
            source=source or environ.get("TKG_SOURCE") or "sample",
            backend=chosen,
            embeddings=choose_embeddings(embeddings, chosen),
            llm=llm,
            duckdb_upload=duckdb_upload or environ.get("TKG_DUCKDB_UPLOAD") or None,
            cache=cache or environ.get("TKG_CACHE") or None,
            allow_partial=_flag(environ.get("TKG_ALLOW_PARTIAL")) if allow_partial is None else allow_partial,
            step_memory=_size(environ.get("TKG_STEP_MEMORY"), "2GB", "TKG_STEP_MEMORY"),
            memory_limit=_size(environ.get("TKG_MEMORY_LIMIT"), "4GB", "TKG_MEMORY_LIMIT"),
            step_disk=_size(environ["TKG_STEP_DISK"], "", "TKG_STEP_DISK") if environ.get("TKG_STEP_DISK") else None,
            shards=shards if shards is not None else _shards(environ.get("TKG_SHARDS")),
            partitions_per_run=_count(environ.get("TKG_PARTITIONS_PER_RUN"), 50, "TKG_PARTITIONS_PER_RUN",
                                      "a number of partitions per run"),
            run_workers=_count(environ.get("TKG_RUN_WORKERS"), 1, "TKG_RUN_WORKERS", "a number of worker processes"),
        )

    @property
    def offline(self) -> bool:
        return self.backend == "offline"

    def store(self) -> ParquetStore:
        return ParquetStore(self.home, self.storage)

    def spilling_connection(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection for a global step's set work: it spills past `step_memory` to a
        temporary folder under the home."""
        folder = self.home / "tmp" / "duckdb"
        return spilling_connection(folder, self.duckdb_memory, self.duckdb_disk(folder), self.duckdb_threads)

    @property
    def duckdb_memory(self) -> str:
        """`step_memory` as DuckDB's memory_limit."""
        return f"{size_in_bytes(self.step_memory, 'TKG_STEP_MEMORY') // 2**20}MiB"

    def duckdb_disk(self, folder: Path) -> str:
        """`step_disk` as DuckDB's max_temp_directory_size, for a spill to `folder`: unset, half
        the free space of its disk now (DuckDB's own default is 90%, enough to fill a shared disk)."""
        if self.step_disk:
            return f"{size_in_bytes(self.step_disk, 'TKG_STEP_DISK') // 2**20}MiB"
        existing = next(parent for parent in (folder, *folder.parents) if parent.exists())
        return f"{max(shutil.disk_usage(existing).free // 2 // 2**20, 1)}MiB"

    def with_changes(self, **changes: object) -> Settings:
        return replace(self, **changes)

    def for_workers(self, workers: int) -> Settings:
        """The settings of one of `workers` processes: the request limit and the cores are per
        process, so they are split between them, and together they keep to them."""
        return replace(self, llm=replace(self.llm, max_in_flight=max(1, self.llm.max_in_flight // max(1, workers))),
                       duckdb_threads=max(1, usable_cores() // workers) if workers > 1 else self.duckdb_threads)

    def embedder_name(self) -> str:
        """The model the statement vectors come from, as recorded in raw.build_info."""
        if self.embeddings == "wordllama":
            return wordllama_name()
        return f"{self.llm.embedding_model}-{self.llm.embedding_dimensions}"

    def describe(self) -> str:
        """One line for logs: backend, models, server, batching. Never a key or a password."""
        if self.offline:
            return f"offline rules and judge, {self.embeddings} embeddings"
        llm = self.llm
        return (f"openai-compatible at {llm.base_url or 'api.openai.com'} ({llm.api_mode} API), "
                f"models {llm.models}, batch size {llm.batch_size}, at most {llm.max_in_flight} in flight until the "
                f"provider's rate-limit headers pace requests, {self.embeddings} embeddings"
                + (", LLM stages through the Batch API (half price, answers within 24 h)" if llm.llm_mode == "batch" else ""))
