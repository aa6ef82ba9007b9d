"""The extraction interfaces shared by the offline rules and the LLM path.

An `Extractor` does the three per-partition LLM tasks of REFERENCE 1.3-1.5 in batches (so an
implementation can fan them out concurrently); a `Judge` answers the invalidation question
1:N. Post-processing that must be identical whatever produced the output (validity post-rules,
dropping triplets that point at no entity) lives here, once.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Protocol, Sequence

from tkg.core.companies import Company
from tkg.core.models import (
    Chunk,
    RawExtraction,
    RawFigure,
    RawStatement,
    StatementType,
    TemporalType,
    TemporalValidityRange,
    Transcript,
)


@dataclass(frozen=True)
class DocumentContext:
    """What every prompt needs to know about the document a chunk or statement comes from."""

    ticker: str
    main_entity: str
    short_name: str
    document_type: str
    publication_date: datetime
    fiscal_quarter: str | None
    fiscal_period_start: date | None
    fiscal_period_end: date | None
    fiscal_year_end_month: int

    @classmethod
    def for_transcript(cls, transcript: Transcript, company: Company) -> DocumentContext:
        return cls(
            ticker=company.ticker,
            main_entity=company.name,
            short_name=company.aliases[0] if company.aliases else company.name,
            document_type="Earnings Call Transcript",
            publication_date=transcript.call_datetime,
            fiscal_quarter=transcript.fiscal_quarter,
            fiscal_period_start=transcript.fiscal_period_start,
            fiscal_period_end=transcript.fiscal_period_end,
            fiscal_year_end_month=company.fiscal_year_end_month,
        )

    def quarter_explanation(self) -> str:
        """Plain words on what the fiscal label means for this company (fed to the prompts)."""
        if not self.fiscal_quarter or not self.fiscal_period_start or not self.fiscal_period_end:
            return "The fiscal quarter of this call is unknown."
        calendar = "its fiscal year is the calendar year" if self.fiscal_year_end_month == 12 else (
            f"its fiscal year ends in month {self.fiscal_year_end_month} of the year it is named after"
        )
        return (
            f"This call discusses {self.main_entity}'s fiscal {self.fiscal_quarter}, the period "
            f"{self.fiscal_period_start.isoformat()} to {self.fiscal_period_end.isoformat()}; {calendar}. "
            f"The call took place on {self.publication_date.date().isoformat()}, after that period ended."
        )


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

    def since(self, earlier: "StageStats") -> "StageStats":
        """What happened after `earlier` (a snapshot of this same counter)."""
        delta = StageStats(**{name: getattr(self, name) - getattr(earlier, name) for name in
                              ("requests", "cache_hits", "input_tokens", "cached_input_tokens", "output_tokens",
                               "retries", "rate_limited", "reasks", "partial_answers", "cost_usd")})
        delta.dropped = self.dropped - earlier.dropped
        delta.repaired = self.repaired - earlier.repaired
        delta.unanswered_items = self.unanswered_items - earlier.unanswered_items
        delta.last_error = self.last_error if delta.unanswered_items else ""
        delta.latencies_ms = self.latencies_ms[len(earlier.latencies_ms):]
        return delta

    def snapshot(self) -> "StageStats":
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
        }


class Extractor(Protocol):
    """Statement, validity-range, triplet and figure extraction. Output lists align with the input."""

    name: str

    def settings_fingerprint(self, stage: str) -> str:
        """A short hash of everything that changes this stage's output (prompt, model, settings)."""
        ...

    def extract_statements(self, chunks: Sequence[Chunk], context: DocumentContext) -> list[list[RawStatement]]: ...

    def extract_validity(
        self, statements: Sequence[RawStatement], context: DocumentContext
    ) -> list[TemporalValidityRange | None]: ...

    def extract_triplets(self, statements: Sequence[RawStatement], context: DocumentContext) -> list[RawExtraction]: ...

    def extract_figures(self, statements: Sequence[RawStatement], context: DocumentContext) -> list[list[RawFigure]]:
        """The financial figures of each statement (most have none), on the call's fiscal calendar."""
        ...

    def stats(self, stage: str) -> StageStats: ...


def statement_hash(text: str) -> str:
    """Hash of a statement's normalised text: the identity the cache and dedup key on."""
    return hashlib.sha256(" ".join(text.lower().split()).encode("utf-8")).hexdigest()


def apply_validity_rules(
    statement: RawStatement, extracted: TemporalValidityRange | None, publication_date: datetime
) -> TemporalValidityRange:
    """REFERENCE 1.4 post-rules: ATEMPORAL has no range; a missing start is the publication date;
    STATIC and OPINION statements have no end."""
    if statement.temporal_type == TemporalType.ATEMPORAL:
        return TemporalValidityRange()
    valid_at = extracted.valid_at if extracted and extracted.valid_at else publication_date
    invalid_at = extracted.invalid_at if extracted else None
    if statement.temporal_type == TemporalType.STATIC or statement.statement_type == StatementType.OPINION:
        invalid_at = None
    if invalid_at is not None and invalid_at < valid_at:
        invalid_at = None
    return TemporalValidityRange(valid_at=valid_at, invalid_at=invalid_at)


def drop_dangling_triplets(extraction: RawExtraction, stats: StageStats | None = None) -> RawExtraction:
    """Keep triplets whose subject (and object, when given) is one of the extracted entities;
    count the rest as dropped instead of failing the partition."""
    known = {entity.entity_idx for entity in extraction.entities}
    kept = []
    for triplet in extraction.triplets:
        if triplet.subject_id not in known or (triplet.object_id is not None and triplet.object_id not in known):
            if stats is not None:
                stats.drop("triplet_entity_index_out_of_range")
            continue
        kept.append(triplet)
    return RawExtraction(entities=extraction.entities, triplets=kept)


_ABBREVIATIONS = re.compile(
    r"(?:\b(?:Inc|Co|Corp|Ltd|Mr|Ms|Mrs|Dr|St|No|vs|approx|e\.g|i\.e|U\.S|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec|"
    r"Sr|Jr|qtr|yr|est)\.|\b[A-Z]\.|^\s*[IVX\d]{1,4}\.)$"  # the last: a list number such as '1.' or 'II.'
)


_BOUNDARY = re.compile(r"([.!?][\"')\]]*)\s+(?=[\"'(\[]?[A-Z0-9$])")


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Sentence spans in `text`: ends at . ! ? followed by space and a capital or digit, and at
    line breaks; abbreviations such as 'Inc.' or initials do not end a sentence."""
    spans: list[tuple[int, int]] = []
    for line in re.finditer(r"[^\n]+", text):
        start = line.start()
        for boundary in _BOUNDARY.finditer(text, line.start(), line.end()):
            end = boundary.start() + len(boundary.group(1))
            if _ABBREVIATIONS.search(text[start:end]):
                continue
            spans.append((start, end))
            start = boundary.end()
        spans.append((start, line.end()))
    stripped = []
    for start, end in spans:
        piece = text[start:end]
        if piece.strip():
            start += len(piece) - len(piece.lstrip())
            stripped.append((start, start + len(piece.strip())))
    return stripped
