"""What a stage gets and gives back: the contract between a stage's function and whatever runs it
(`tkg build`'s workers, a Dagster asset, a test).

A stage function takes a `StageJob` (its partition, its input tables, the providers) and
returns a `StageResult`: its table, what it counted and the metadata the asset shows. The
runner adds the LLM usage its providers' counters measured, and the stamp. A stage that could
not finish its work raises `StageIncomplete`, and nothing is written.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

import pyarrow as pa


@dataclass
class StageStats:
    """Counters one stage reports into asset metadata and the llm_calls table."""

    requests: int = 0
    cache_hits: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    retries: int = 0
    rate_limited: int = 0
    reasks: int = 0
    partial_answers: int = 0  # batched answers that left some of their items out
    cost_usd: float = 0.0
    sync_cost_usd: float = 0.0  # what the same tokens cost as synchronous requests (= cost_usd unless batched)
    dropped: Counter = field(default_factory=Counter)
    repaired: Counter = field(default_factory=Counter)
    # Items that got no usable answer at all (after retries and a re-ask): the stage did not
    # finish its work. Also counted in `dropped`, as every lost item is.
    unanswered_items: Counter = field(default_factory=Counter)
    last_error: str = ""
    latencies_ms: list[float] = field(default_factory=list)

    def drop(self, reason: str, count: int = 1) -> None:
        """An item that could not be used: counted, logged by the caller, never silent."""
        self.dropped[reason] += count

    def unanswered(self, reason: str, count: int = 1, error: object = None) -> None:
        """Items the provider never answered usably: dropped, and they make the stage incomplete."""
        self.drop(reason, count)
        self.unanswered_items[reason] += count
        if error is not None:
            self.last_error = str(error)

    def repair(self, reason: str, count: int = 1) -> None:
        """An item fixed deterministically and kept."""
        self.repaired[reason] += count

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @property
    def idle(self) -> bool:
        """Nothing was asked, answered from the cache or dropped."""
        return not (self.requests or self.cache_hits or self.dropped_total)

    def since(self, earlier: StageStats) -> StageStats:
        """What happened after `earlier` (a snapshot of this same counter)."""
        delta = StageStats(**{name: getattr(self, name) - getattr(earlier, name) for name in
                              ("requests", "cache_hits", "input_tokens", "cached_input_tokens", "output_tokens",
                               "retries", "rate_limited", "reasks", "partial_answers", "cost_usd", "sync_cost_usd")})
        delta.dropped = self.dropped - earlier.dropped
        delta.repaired = self.repaired - earlier.repaired
        delta.unanswered_items = self.unanswered_items - earlier.unanswered_items
        delta.last_error = self.last_error if delta.unanswered_items else ""
        delta.latencies_ms = self.latencies_ms[len(earlier.latencies_ms):]
        return delta

    def snapshot(self) -> StageStats:
        """A copy that later changes to this counter do not touch."""
        return self.since(StageStats())

    def latency_percentile(self, q: float) -> float | None:
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]

    def summary(self) -> dict[str, object]:
        return {
            "requests": self.requests, "cache_hits": self.cache_hits, "input_tokens": self.input_tokens,
            "cached_input_tokens": self.cached_input_tokens, "output_tokens": self.output_tokens,
            "retries": self.retries, "rate_limited": self.rate_limited, "reasks": self.reasks,
            "partial_answers": self.partial_answers,
            "dropped": self.dropped_total, "dropped_by_reason": dict(self.dropped), "repaired_by_reason": dict(self.repaired),
            "latency_p50_ms": self.latency_percentile(50), "latency_p95_ms": self.latency_percentile(95),
            "latency_p99_ms": self.latency_percentile(99), "estimated_cost_usd": round(self.cost_usd, 6),
            "sync_cost_usd": round(self.sync_cost_usd, 6),
        }


class Counted:
    """A provider that keeps a `StageStats` per counter it serves (`counters`, e.g. 'validity'
    for the extractor's validity-range requests). Offline providers count drops and repairs;
    providers that pay for requests also turn a counter's usage into a row of `llm_calls`."""

    counters: tuple[str, ...] = ()

    def stats(self, counter: str) -> StageStats:
        return self.all_stats().setdefault(counter, StageStats())

    def all_stats(self) -> dict[str, StageStats]:
        """Every counter kept so far, by name (the live counters, not copies)."""
        return self.__dict__.setdefault("_stats", {})

    def usage_row(self, counter: str, usage: StageStats) -> dict[str, Any] | None:
        """A row of `llm_calls` (without step, partition and time) for `usage`, or None when the
        provider pays for nothing."""
        return None


@dataclass
class StageJob:
    """What a stage's function is given."""

    partition: tuple[str, Any] | None  # (ticker, quarter start); None for a global stage
    inputs: dict[str, pa.Table]  # the input stages' tables, by stage name
    providers: Any  # tkg.providers.Providers: extractor, judge, embedders, chunking settings
    rows: list[Any] = field(default_factory=list)  # the partition's source rows (the transcripts stage)
    allow_partial: bool = False  # a stage that could not finish may keep what it has (see StageIncomplete)
    store: Any = None  # tkg.store.parquet.ParquetStore: what a global stage reads every partition from
    connection: Any = None  # a DuckDB connection that spills to disk, for a global stage's set work
    shard: str | None = None  # a shard stage's shard ('00', '01', ...)
    shard_keys: list[str] = field(default_factory=list)  # every shard, for the stages that split or merge them
    versions: dict[str, str] = field(default_factory=dict)  # the versions of the global stages it reads (their split folders)
    # The stage's own last output (its files by table name) when the same code and settings
    # wrote it: a stage may keep the parts of it whose inputs did not change (a memo, never
    # a different result). Empty when there is none to trust.
    previous: dict[str, Any] = field(default_factory=dict)

    @property
    def shards(self) -> int:
        return len(self.shard_keys)


@dataclass
class StageResult:
    """A stage's output table and what it counted (rows skipped or dropped, with reasons)."""

    table: pa.Table
    # Every output by its raw-table name, for a stage that writes several (its stamp table is
    # `table`); a stage that writes one leaves it empty. An output may be a DuckDB relation on
    # the job's connection: it is streamed to its file, never held whole in memory.
    tables: dict[str, Any] = field(default_factory=dict)
    # A global stage's tables split by shard: DuckDB relations with a `shard` column.
    shard_tables: dict[str, Any] = field(default_factory=dict)
    counts: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    missing: Counter = field(default_factory=Counter)  # items a partial result lacks
    metadata: dict[str, Any] = field(default_factory=dict)  # JSON-able facts for the asset metadata
    usage: list[dict[str, Any]] = field(default_factory=list)  # llm_calls rows of the requests it made
    stamp: Any = None  # the tkg.core.versions.Stamp the output is written with
    path: PurePath | None = None  # where the runner wrote the table
    # The data versions of the stages it read, as Dagster knows them (a global or shard step's:
    # each input stage's whole version; a shard's stamp holds its rows' fingerprint instead).
    input_versions: dict[str, str] = field(default_factory=dict)
    rows: int | None = None  # the rows of a kept output (the table is then not read back)


class StageIncomplete(RuntimeError):
    """A stage could not finish its work; nothing was written, the last good output is kept."""

    def __init__(self, stage: str, partition: str | None, reason: str, missing: dict[str, int] | None = None) -> None:
        self.stage, self.partition, self.reason, self.missing = stage, partition, reason, dict(missing or {})
        where = f"{stage} of {partition}" if partition else stage
        super().__init__(f"{where} is incomplete: {reason}; its last good output is kept")


def missing_text(missing: dict[str, int]) -> str:
    """'3 unanswered validity, 1 unparsed triplets'."""
    return ", ".join(f"{count} {reason.replace('_', ' ')}" for reason, count in sorted(missing.items()))
