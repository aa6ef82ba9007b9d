"""Pydantic models: the contract between pipeline stages and with the LLM.

Validators normalise what a model (or a person) returns: enum labels in any case, dates to
timezone-aware UTC, a bare year to January 1st, entity indices to ints.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timezone
from enum import StrEnum
from typing import Any

from dateutil import parser as date_parser
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class StatementType(StrEnum):
    FACT = "FACT"
    OPINION = "OPINION"
    PREDICTION = "PREDICTION"


class TemporalType(StrEnum):
    STATIC = "STATIC"
    DYNAMIC = "DYNAMIC"
    ATEMPORAL = "ATEMPORAL"


class Predicate(StrEnum):
    IS_A = "IS_A"
    HAS_A = "HAS_A"
    LOCATED_IN = "LOCATED_IN"
    HOLDS_ROLE = "HOLDS_ROLE"
    PRODUCES = "PRODUCES"
    SELLS = "SELLS"
    LAUNCHED = "LAUNCHED"
    DEVELOPED = "DEVELOPED"
    ADOPTED_BY = "ADOPTED_BY"
    INVESTS_IN = "INVESTS_IN"
    COLLABORATES_WITH = "COLLABORATES_WITH"
    SUPPLIES = "SUPPLIES"
    HAS_REVENUE = "HAS_REVENUE"
    INCREASED = "INCREASED"
    DECREASED = "DECREASED"
    RESULTED_IN = "RESULTED_IN"
    TARGETS = "TARGETS"
    PART_OF = "PART_OF"
    DISCONTINUED = "DISCONTINUED"
    SECURED = "SECURED"


PREDICATE_DEFINITIONS: dict[Predicate, str] = {
    Predicate.IS_A: "The subject is an instance or kind of the object (category, type or class).",
    Predicate.HAS_A: "The subject owns, contains or includes the object as a component or asset.",
    Predicate.LOCATED_IN: "The subject is physically or legally based in the object place.",
    Predicate.HOLDS_ROLE: "A person holds an office or position (the object) at an organisation.",
    Predicate.PRODUCES: "The subject manufactures or creates the object product or service.",
    Predicate.SELLS: "The subject sells, distributes or offers the object to customers.",
    Predicate.LAUNCHED: "The subject introduced or released the object to the market.",
    Predicate.DEVELOPED: "The subject designed, built or researched the object.",
    Predicate.ADOPTED_BY: "The subject (a product or technology) is used or adopted by the object.",
    Predicate.INVESTS_IN: "The subject puts money or resources into the object.",
    Predicate.COLLABORATES_WITH: "The subject partners or works jointly with the object.",
    Predicate.SUPPLIES: "The subject provides goods or services to the object.",
    Predicate.HAS_REVENUE: "The subject earned the value as revenue (or sales) for the object period or line.",
    Predicate.INCREASED: "The object metric of the subject went up, by or to the value.",
    Predicate.DECREASED: "The object metric of the subject went down, by or to the value.",
    Predicate.RESULTED_IN: "The subject caused or led to the object outcome.",
    Predicate.TARGETS: "The subject aims for, guides to or expects the object metric at the value.",
    Predicate.PART_OF: "The subject is a part, unit or member of the object.",
    Predicate.DISCONTINUED: "The subject stopped producing, selling or supporting the object.",
    Predicate.SECURED: "The subject won or obtained the object (a contract, customer, funding or approval).",
}

class EntityType(StrEnum):
    PERSON = "Person"
    ORGANIZATION = "Organization"
    ROLE = "Role"
    PRODUCT = "Product"
    METRIC = "Metric"
    LOCATION = "Location"
    NUMERIC = "Numeric"
    OTHER = "Other"


LABEL_DEFINITIONS: dict[str, dict[str, str]] = {
    "statement_type": {
        "FACT": "A verifiable claim about something that is or was the case: reported results, "
        "appointments, launches, agreements. It could be checked against a record.",
        "OPINION": "A belief, judgement, feeling or speculation of the speaker: 'we are pleased', "
        "'we believe demand is strong', 'a great quarter'. Not verifiable.",
        "PREDICTION": "An uncertain statement about the future: guidance, outlook, expectations, "
        "plans and targets ('we expect revenue of about $1.2 billion next quarter').",
    },
    "temporal_type": {
        "STATIC": "A point-in-time event that happened once and stays true from then on: "
        "'the company launched X in March', 'Q3 revenue was $1.6 billion'. It is never invalidated.",
        "DYNAMIC": "A state that holds over a period and can be ended by a later event: "
        "'Jane Doe is CFO', 'full-year guidance is $5 billion', 'the company supplies Y'.",
        "ATEMPORAL": "Always true, independent of time: definitions, general truths "
        "('a fab is a semiconductor fabrication plant').",
    },
}


def parse_datetime_utc(value: Any) -> datetime | None:
    """Parse an ISO-ish date string (or date/datetime) to a timezone-aware UTC datetime.

    A bare year becomes January 1st of that year, a date without time becomes 00:00Z, naive
    datetimes are read as UTC. Empty strings, "null"/"none" and unparseable text return None.
    """
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=timezone.utc)
    text = str(value).strip()
    if not text or text.lower() in {"null", "none", "n/a", "unknown"}:
        return None
    if re.fullmatch(r"\d{4}", text):
        return datetime(int(text), 1, 1, tzinfo=timezone.utc)
    if re.fullmatch(r"\d{4}-\d{2}", text):
        year, month = text.split("-")
        return datetime(int(year), int(month), 1, tzinfo=timezone.utc)
    try:
        parsed = date_parser.isoparse(text)
    except (ValueError, OverflowError):
        try:
            parsed = date_parser.parse(text, default=datetime(1900, 1, 1))
        except (ValueError, OverflowError):
            return None
        if parsed.year == 1900:
            return None
    return parsed.replace(tzinfo=timezone.utc) if parsed.tzinfo is None else parsed.astimezone(timezone.utc)


def _enum_from_any(enum_cls: type[StrEnum], value: Any) -> Any:
    """Accept enum labels in any case and with spaces or dashes instead of underscores."""
    if isinstance(value, enum_cls) or value is None:
        return value
    key = re.sub(r"[\s\-]+", "_", str(value).strip()).upper()
    for member in enum_cls:
        if member.value.upper() == key or member.name == key:
            return member
    return value  # let pydantic raise its usual error naming the allowed values


class _Lenient(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


# --- Documents -------------------------------------------------------------------------------


class Participant(_Lenient):
    name: str
    organization: str | None = None
    title: str | None = None
    kind: str = Field(description="'corporate' (the company's people) or 'conference' (analysts and guests)")


class Turn(_Lenient):
    index: int
    section: str
    speaker: str
    organization: str | None = None
    title: str | None = None
    heading: str | None = Field(None, description="Sub-heading of an Event Brief summary block")
    start: int
    end: int
    text: str


class Transcript(_Lenient):
    """One earnings call: the source row plus what the StreetEvents parser found in it."""

    transcript_id: str
    company: str
    company_name: str
    call_date: date
    call_datetime: datetime
    title: str
    doc_type: str
    fiscal_quarter: str | None = Field(None, description="The title's fiscal label, e.g. 'Q2 2021'")
    fiscal_year: int | None = None
    fiscal_period_start: date | None = None
    fiscal_period_end: date | None = None
    participants: list[Participant] = []
    participants_start: int = Field(0, description="Offset of the participants lists in the text")
    participants_end: int = 0
    turns: list[Turn] = []
    text: str
    body_end: int = Field(description="Offset where the Definitions/Disclaimer boilerplate starts")
    content_sha256: str

    @field_validator("call_datetime", mode="before")
    @classmethod
    def _utc(cls, value: Any) -> datetime | None:
        return parse_datetime_utc(value)


class Chunk(_Lenient):
    chunk_id: str
    transcript_id: str
    company: str
    chunk_index: int
    kind: str = Field(description="'participants', 'speech' or 'summary'")
    section: str
    speaker: str | None = None
    speaker_organization: str | None = None
    speaker_title: str | None = None
    start: int = Field(description="Start character offset into the transcript text")
    end: int = Field(description="End character offset into the transcript text (exclusive)")
    text: str


# --- LLM-facing extraction models --------------------------------------------------------------


class RawStatement(_Lenient):
    statement: str = Field(description="One self-contained atomic statement")
    statement_type: StatementType = StatementType.FACT
    temporal_type: TemporalType = TemporalType.ATEMPORAL

    _normalise_statement_type = field_validator("statement_type", mode="before")(
        lambda v: StatementType.FACT if v is None else _enum_from_any(StatementType, v)
    )
    _normalise_temporal_type = field_validator("temporal_type", mode="before")(
        lambda v: TemporalType.ATEMPORAL if v is None else _enum_from_any(TemporalType, v)
    )


class TemporalValidityRange(_Lenient):
    valid_at: datetime | None = None
    invalid_at: datetime | None = None

    _utc = field_validator("valid_at", "invalid_at", mode="before")(parse_datetime_utc)

    @model_validator(mode="after")
    def _ordered(self) -> TemporalValidityRange:
        if self.valid_at and self.invalid_at and self.invalid_at < self.valid_at:
            raise ValueError(
                f"invalid_at {self.invalid_at.isoformat()} is before valid_at {self.valid_at.isoformat()}"
            )
        return self


class RawEntity(_Lenient):
    entity_idx: int
    name: str
    type: EntityType = EntityType.OTHER
    description: str = ""

    @field_validator("type", mode="before")
    @classmethod
    def _entity_type(cls, value: Any) -> EntityType:
        # Models invent types ("Company", "Executive"); map the common ones, the rest is Other.
        aliases = {"COMPANY": "ORGANIZATION", "ORGANISATION": "ORGANIZATION", "EXECUTIVE": "PERSON",
                   "TITLE": "ROLE", "POSITION": "ROLE", "NUMBER": "NUMERIC", "MONEY": "NUMERIC",
                   "PERCENTAGE": "NUMERIC", "PLACE": "LOCATION", "COUNTRY": "LOCATION"}
        key = re.sub(r"[\s\-]+", "_", str(value or "").strip()).upper()
        key = aliases.get(key, key)
        return next((member for member in EntityType if member.name == key), EntityType.OTHER)

    @field_validator("entity_idx", mode="before")
    @classmethod
    def _int_idx(cls, value: Any) -> int:
        return int(str(value).strip())


class RawTriplet(_Lenient):
    subject_name: str
    subject_id: int
    predicate: Predicate
    object_name: str
    object_id: int | None = None
    value: str | None = None

    _normalise_predicate = field_validator("predicate", mode="before")(lambda v: _enum_from_any(Predicate, v))

    @field_validator("subject_id", "object_id", mode="before")
    @classmethod
    def _int_ids(cls, value: Any) -> int | None:
        if value is None or str(value).strip().lower() in {"", "null", "none"}:
            return None
        return int(str(value).strip())


class RawExtraction(_Lenient):
    entities: list[RawEntity] = []
    triplets: list[RawTriplet] = []


class FigureMetric(StrEnum):
    """The `metrics` view's controlled vocabulary (a contract: scripts and dashboards query it)."""

    REVENUE = "revenue"  # net sales count as revenue
    SEGMENT_REVENUE = "segment_revenue"
    GROSS_MARGIN = "gross_margin"
    OPERATING_MARGIN = "operating_margin"
    OPERATING_INCOME = "operating_income"
    OPERATING_EXPENSES = "operating_expenses"
    NET_INCOME = "net_income"
    EPS = "eps"
    CAPEX = "capex"
    FREE_CASH_FLOW = "free_cash_flow"
    REVENUE_GROWTH = "revenue_growth"


PERCENT_METRICS = frozenset({FigureMetric.GROSS_MARGIN, FigureMetric.OPERATING_MARGIN, FigureMetric.REVENUE_GROWTH})


class FigureKind(StrEnum):
    REPORTED = "reported"  # a result for a closed period
    GUIDANCE = "guidance"  # a forward-looking figure for a period not yet over


class RawFigure(_Lenient):
    """One financial figure a statement states, in base units: the `metrics` view's fields."""

    metric: FigureMetric
    segment: str | None = Field(None, description="The segment or product line of a segment figure, else null")
    basis: str | None = Field(None, description="'GAAP', 'non-GAAP', or null when not stated")
    kind: FigureKind
    fiscal_year: int = Field(description="The company's own fiscal year label")
    fiscal_quarter: int | None = Field(None, description="1-4, or null for a full fiscal year")
    value: float = Field(description="In base units: 1.48e9 for '$1.48 billion', 61.9 for '61.9%'; a range's midpoint")
    low: float | None = None
    high: float | None = None
    unit: str = Field(description="'USD' (or the stated currency code), 'percent', or 'USD/share'")
    text: str = Field("", description="The amount as written in the statement")

    _normalise_metric = field_validator("metric", mode="before")(lambda v: _enum_from_any(FigureMetric, v))
    _normalise_kind = field_validator("kind", mode="before")(lambda v: _enum_from_any(FigureKind, v))

    @field_validator("basis", mode="before")
    @classmethod
    def _basis(cls, value: Any) -> str | None:
        text = re.sub(r"[\s_-]+", "", str(value or "")).lower()
        return {"gaap": "GAAP", "nongaap": "non-GAAP", "adjusted": "non-GAAP"}.get(text)

    @field_validator("segment", mode="before")
    @classmethod
    def _segment(cls, value: Any) -> str | None:
        text = str(value or "").strip()
        return None if text.lower() in {"", "null", "none", "total"} else text

    @field_validator("fiscal_quarter", mode="before")
    @classmethod
    def _quarter(cls, value: Any) -> int | None:
        text = str(value or "").strip().upper().removeprefix("Q")
        if text in {"", "NULL", "NONE", "FY", "0"}:
            return None
        if text not in {"1", "2", "3", "4"}:
            raise ValueError(f"fiscal_quarter must be 1-4 or null, got {value!r}")
        return int(text)

    @field_validator("unit", mode="before")
    @classmethod
    def _unit(cls, value: Any) -> str:
        text = str(value or "").strip()
        lower = text.lower().replace(" ", "")
        if lower in {"%", "percent", "pct", "percentage"}:
            return "percent"
        if lower.endswith(("/share", "pershare")):
            return f"{lower.split('/')[0].removesuffix('pershare').upper() or 'USD'}/share"
        return {"$": "USD", "usd": "USD", "€": "EUR", "eur": "EUR", "dollars": "USD"}.get(lower, text.upper())

    @model_validator(mode="after")
    def _consistent(self) -> RawFigure:
        if (self.low is None) != (self.high is None):
            self.low = self.high = None
        if self.low is not None and self.high is not None:
            self.low, self.high = sorted((self.low, self.high))
        if self.metric == FigureMetric.SEGMENT_REVENUE and not self.segment:
            raise ValueError("a segment_revenue figure names its segment")
        if self.metric == FigureMetric.REVENUE and self.segment:
            self.metric = FigureMetric.SEGMENT_REVENUE
        if (self.metric in PERCENT_METRICS) != (self.unit == "percent"):
            raise ValueError(f"{self.metric.value} is measured in {'percent' if self.metric in PERCENT_METRICS else 'money'}, "
                             f"not {self.unit}")
        return self

    @property
    def key(self) -> tuple:
        """What the figure is about: a later, different value for the same key revises it."""
        return (self.metric.value, self.segment, self.basis, self.kind.value, self.fiscal_year, self.fiscal_quarter)


class RawFigureList(_Lenient):
    """The figures of one statement (the LLM's answer item)."""

    figures: list[RawFigure] = []


# --- Pipeline records ------------------------------------------------------------------------


class TemporalEvent(_Lenient):
    """One statement with its validity range, embedding and bi-temporal bookkeeping."""

    event_id: str
    chunk_id: str
    transcript_id: str
    company: str
    statement: str
    statement_hash: str
    statement_type: StatementType
    temporal_type: TemporalType
    valid_at: datetime | None = None
    invalid_at: datetime | None = None
    created_at: datetime
    expired_at: datetime | None = None
    invalidated_by: str | None = None
    embedding: list[float] = []

    _utc = field_validator("valid_at", "invalid_at", "created_at", "expired_at", mode="before")(parse_datetime_utc)

    @model_validator(mode="after")
    def _expire_finished_dynamic(self) -> TemporalEvent:
        # A DYNAMIC state that already has an end when we record it is expired from the start.
        if self.temporal_type == TemporalType.DYNAMIC and self.invalid_at is not None and self.expired_at is None:
            self.expired_at = self.created_at
        return self
