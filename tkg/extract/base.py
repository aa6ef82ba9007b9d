"""The extraction interface shared by the offline rules and the LLM path.

An `Extractor` does the per-partition LLM tasks of REFERENCE 1.3-1.5 (and financial figures)
in batches, so an implementation can fan them out concurrently. Post-processing that must be
identical whatever produced the output (validity post-rules, dropping triplets that point at
no entity) lives here, once.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
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
from tkg.core.results import StageStats


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


class Extractor(Protocol):
    """Statement, validity-range, triplet and figure extraction. Output lists align with the input.

    It keeps a usage counter per task (`counters`: statements, validity, triplets, figures; see
    tkg.core.results.Counted), which the stage runner reads to account for the work."""

    name: str
    counters: tuple[str, ...]

    def settings_fingerprint(self, stage: str) -> str:
        """A short hash of everything that changes this stage's output (prompt, model, settings)."""
        ...

    def extract_statements(self, chunks: Sequence[Chunk], context: DocumentContext) -> list[list[RawStatement]]: ...

    def extract_validity(
        self, statements: Sequence[RawStatement], context: DocumentContext
    ) -> list[TemporalValidityRange | None]: ...

    def extract_triplets(self, statements: Sequence[RawStatement], context: DocumentContext) -> list[RawExtraction]: ...

    def extract_figures(self, statements: Sequence[RawStatement], context: DocumentContext,
                        scopes: Sequence[str] | None = None) -> list[list[RawFigure]]:
        """The financial figures of each statement (most have none), on the call's fiscal calendar.
        `scopes`, aligned with `statements`, is the paragraph before each (its section opener)."""
        ...

    def stats(self, counter: str) -> StageStats: ...

    def usage_row(self, counter: str, usage: StageStats) -> dict | None: ...


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
