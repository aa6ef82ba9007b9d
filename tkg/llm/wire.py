"""What the LLM is asked to return (strict JSON schemas), and lenient parsing with repair.

The schemas constrain providers that honour structured outputs. Servers that do not (or a
model having a bad day) can still return near-misses; `parse_*` repairs what can be repaired
deterministically (label case, a misspelt predicate, an unparseable date, an end before the
start), counts every repair and drop in `StageStats`, and raises `InvalidOutput` with a
message fit to send back to the model when nothing usable remains.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from rapidfuzz import fuzz, process

from tkg.core.models import (
    EntityType,
    FigureKind,
    FigureMetric,
    Predicate,
    RawEntity,
    RawExtraction,
    RawFigure,
    RawFigureList,
    RawStatement,
    RawTriplet,
    StatementType,
    TemporalType,
    TemporalValidityRange,
    parse_datetime_utc,
)
from tkg.core.results import StageStats
from tkg.extract.figures import Segment


class RequestFailed(RuntimeError):
    """A request that still failed after all retries; the caller drops the item and counts it.
    (Here, not beside the client, so that code catching it need not import the OpenAI SDK.)"""


class InvalidOutput(ValueError):
    """The response cannot be used; the message says why, for a re-ask."""


class WireStatement(BaseModel):
    statement: str
    statement_type: StatementType
    temporal_type: TemporalType


class StatementsOut(BaseModel):
    statements: list[WireStatement]


class WireValidity(BaseModel):
    index: int
    valid_at: str | None
    invalid_at: str | None


class ValidityOut(BaseModel):
    items: list[WireValidity]


class WireEntity(BaseModel):
    entity_idx: int
    name: str
    type: EntityType
    description: str


class WireTriplet(BaseModel):
    subject_name: str
    subject_id: int
    predicate: Predicate
    object_name: str
    object_id: int | None
    value: str | None


class WireExtraction(BaseModel):
    index: int
    entities: list[WireEntity]
    triplets: list[WireTriplet]


class TripletsOut(BaseModel):
    items: list[WireExtraction]


class WireFigure(BaseModel):
    metric: FigureMetric
    segment: str | None
    basis: Literal["GAAP", "non-GAAP"] | None
    kind: FigureKind
    fiscal_year: int
    fiscal_quarter: int | None
    value: float
    low: float | None
    high: float | None
    unit: str
    text: str


class WireFigures(BaseModel):
    index: int
    figures: list[WireFigure]


class FiguresOut(BaseModel):
    items: list[WireFigures]


class WireVerdict(BaseModel):
    candidate_index: int
    reason: str
    invalidates: bool


class JudgeOut(BaseModel):
    verdicts: list[WireVerdict]


def load_list(text: str, key: str) -> list[Any]:
    """The list under `key` of a JSON object; tolerates a code fence around it."""
    stripped = re.sub(r"^\s*```(?:json)?\s*|\s*```\s*$", "", text or "")
    try:
        document = json.loads(stripped)
    except json.JSONDecodeError as error:
        raise InvalidOutput(f"the answer is not valid JSON ({error.msg} at position {error.pos})") from None
    if not isinstance(document, dict) or not isinstance(document.get(key), list):
        raise InvalidOutput(f'the answer must be a JSON object with a list under "{key}"')
    return document[key]


def _asked_items(text: str, expected: list[int], stats: StageStats, stage: str) -> Iterator[dict[str, Any]]:
    """The items of a batched answer that answer a statement asked about (by `index`); any
    other item is dropped and counted as `<stage>_unknown_index`."""
    for item in load_list(text, "items"):
        if not isinstance(item, dict) or item.get("index") not in expected:
            stats.drop(f"{stage}_unknown_index")
            continue
        yield item


def parse_statements(text: str, stats: StageStats) -> list[RawStatement]:
    statements = []
    for item in load_list(text, "statements"):
        try:
            statement = RawStatement.model_validate(item)
        except ValidationError:
            stats.drop("statement_invalid")
            continue
        if statement.statement.strip():
            statements.append(statement)
    return statements


def parse_validity(text: str, expected: list[int], stats: StageStats) -> dict[int, TemporalValidityRange]:
    """Ranges by statement index. Unparseable dates become null; an end before the start is
    dropped (the start is more reliable); indices that were not asked for are ignored."""
    ranges: dict[int, TemporalValidityRange] = {}
    for item in _asked_items(text, expected, stats, "validity"):
        valid_at, invalid_at = (parse_datetime_utc(item.get(k)) for k in ("valid_at", "invalid_at"))
        for key, parsed in (("valid_at", valid_at), ("invalid_at", invalid_at)):
            if item.get(key) not in (None, "", "null") and parsed is None:
                stats.repair(f"{key}_unparseable_set_null")
        if valid_at and invalid_at and invalid_at < valid_at:
            stats.repair("invalid_at_before_valid_at_dropped")
            invalid_at = None
        ranges[item["index"]] = TemporalValidityRange(valid_at=valid_at, invalid_at=invalid_at)
    return ranges


_PREDICATES = [p.value for p in Predicate]


def repair_predicate(value: Any) -> Predicate | None:
    """'holds role', 'HAS_ROLE' -> HOLDS_ROLE; None when nothing in the vocabulary is close."""
    key = re.sub(r"[\s\-]+", "_", str(value or "").strip()).upper()
    if key in _PREDICATES:
        return Predicate(key)
    match = process.extractOne(key, _PREDICATES, scorer=fuzz.ratio, score_cutoff=80)
    return Predicate(match[0]) if match else None


def parse_triplets(text: str, expected: list[int], stats: StageStats) -> dict[int, RawExtraction]:
    extractions: dict[int, RawExtraction] = {}
    for item in _asked_items(text, expected, stats, "triplets"):
        entities = []
        for raw in item.get("entities") or []:
            try:
                entities.append(RawEntity.model_validate(raw))
            except ValidationError:
                stats.drop("entity_invalid")
        triplets = []
        for raw in item.get("triplets") or []:
            if not isinstance(raw, dict):
                stats.drop("triplet_invalid")
                continue
            predicate = repair_predicate(raw.get("predicate"))
            if predicate is None:
                stats.drop("triplet_unknown_predicate")
                continue
            if predicate.value != str(raw.get("predicate")):
                stats.repair("predicate_mapped_to_vocabulary")
            try:
                triplets.append(RawTriplet.model_validate({**raw, "predicate": predicate}))
            except (ValidationError, ValueError):
                stats.drop("triplet_invalid")
        extractions[item["index"]] = RawExtraction(entities=entities, triplets=triplets)
    return extractions


def parse_figures(text: str, expected: list[int], stats: StageStats, segments: tuple[Segment, ...]
                  ) -> dict[int, RawFigureList]:
    """Figures by statement index. A figure that fails `RawFigure` validation (revenue in
    percent, a quarter 5) is dropped and counted, never the whole answer; a segment is named as
    the registry names it (`segments`), and a figure of a part of the business the registry
    does not list, or a segment figure the vocabulary has no place for (a segment's margin),
    is dropped and counted, as the offline rules leave it out."""
    answers: dict[int, RawFigureList] = {}
    for item in _asked_items(text, expected, stats, "figures"):
        figures = []
        for raw in item.get("figures") or []:
            try:
                figure = RawFigure.model_validate(raw)
            except ValidationError:
                stats.drop("figure_invalid")
                continue
            if figure.segment is not None:
                name = next((s.name for s in segments if s.pattern.fullmatch(figure.segment.strip())), None)
                if name is None:
                    stats.drop("figure_segment_not_in_registry")
                    continue
                if figure.metric not in (FigureMetric.SEGMENT_REVENUE, FigureMetric.REVENUE_GROWTH):
                    stats.drop("figure_segment_metric_not_in_vocabulary")
                    continue
                if name != figure.segment:
                    stats.repair("segment_alias_mapped_to_registry_name")
                    figure = figure.model_copy(update={"segment": name})
            figures.append(figure)
        answers[item["index"]] = RawFigureList(figures=figures)
    return answers


def parse_verdicts(text: str, count: int, stats: StageStats) -> dict[int, tuple[bool, str]]:
    verdicts: dict[int, tuple[bool, str]] = {}
    for item in load_list(text, "verdicts"):
        index = item.get("candidate_index") if isinstance(item, dict) else None
        if not isinstance(index, int) or not 0 <= index < count:
            stats.drop("verdict_unknown_candidate")
            continue
        invalidates = item.get("invalidates")
        if isinstance(invalidates, str):
            invalidates = invalidates.strip().lower() in {"true", "yes"}
        verdicts[index] = (bool(invalidates), str(item.get("reason") or ""))
    return verdicts


__all__ = ["InvalidOutput", "StatementsOut", "ValidityOut", "TripletsOut", "FiguresOut", "JudgeOut",
           "parse_statements", "parse_validity", "parse_triplets", "parse_figures", "parse_verdicts", "repair_predicate"]
