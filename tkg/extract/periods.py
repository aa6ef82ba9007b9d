"""Resolve period expressions ('next quarter', 'fiscal 2017', 'July 1, 2024') against a call.

Earnings calls talk in fiscal periods and happen weeks after the quarter they report on, so
'this quarter' in a result is the reported fiscal quarter, while in an outlook it is the one
already under way. Used by the offline extractor; the LLM gets the same facts in its prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

from tkg.core.companies import fiscal_quarter_bounds
from tkg.extract.base import DocumentContext

_ORDINALS = {"first": 1, "1st": 1, "second": 2, "2nd": 2, "third": 3, "3rd": 3, "fourth": 4, "4th": 4}
_MONTHS = {
    name: number
    for number, names in enumerate(
        [("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",), ("june", "jun"),
         ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"), ("october", "oct"),
         ("november", "nov"), ("december", "dec")],
        start=1,
    )
    for name in names
}
_MONTH = r"(January|February|March|April|May|June|July|August|September|October|November|December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)\.?"

EXACT_DATE = re.compile(_MONTH + r"\s+(\d{1,2}),?\s+(\d{4})", re.IGNORECASE)
MONTH_YEAR = re.compile(_MONTH + r"\s+(?:of\s+)?(\d{4})", re.IGNORECASE)
ORDINAL_QUARTER = re.compile(
    r"\b(first|second|third|fourth|1st|2nd|3rd|4th)[- ]quarter(?:\s+of)?(?:\s+(?:fiscal|FY)\s*'?)?(?:\s+(\d{4}))?", re.IGNORECASE
)
Q_LABEL = re.compile(r"\bQ([1-4])(?:\s*(?:FY|fiscal)?\s*'?(\d{4}|\d{2}))?\b|\b([1-4])Q\s?'?(\d{2})\b")
FISCAL_YEAR = re.compile(r"\b(?:full[- ]year|fiscal(?: year)?|FY)\s*'?(\d{4}|\d{2})\b", re.IGNORECASE)
_DIGIT = re.compile(r"\d")
_FOUR_DIGITS = re.compile(r"\d{4}")
RELATIVE = re.compile(
    r"\b(next quarter|following quarter|coming quarter|last quarter|prior quarter|previous quarter|"
    r"this quarter|the quarter|current quarter|full[- ]year|the year|this year|next year|fiscal year)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Period:
    label: str
    start: datetime
    end: datetime  # exclusive


def _utc(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=timezone.utc)


def _year(text: str) -> int:
    return int(text) + 2000 if len(text) == 2 else int(text)


class PeriodResolver:
    """Period arithmetic on one document's fiscal calendar."""

    def __init__(self, context: DocumentContext) -> None:
        self.context = context
        self.reported: tuple[int, int] | None = None
        if context.fiscal_quarter and (match := re.match(r"Q([1-4]) (\d{4})", context.fiscal_quarter)):
            self.reported = (int(match[1]), int(match[2]))

    def quarter(self, quarter: int, year: int) -> Period:
        start, after = fiscal_quarter_bounds(self.context.fiscal_year_end_month, quarter, year)
        return Period(f"Q{quarter} {year}", _utc(start), _utc(after))

    def fiscal_year(self, year: int) -> Period:
        first, last = self.quarter(1, year), self.quarter(4, year)
        return Period(f"FY{year}", first.start, last.end)

    def shift(self, quarters: int) -> Period | None:
        if self.reported is None:
            return None
        index = self.reported[1] * 4 + self.reported[0] - 1 + quarters
        return self.quarter(index % 4 + 1, index // 4)

    def _year_for_quarter(self, quarter: int, forward: bool) -> int:
        if self.reported is None:
            return self.context.publication_date.year
        reported_q, reported_year = self.reported
        if forward:
            return reported_year if quarter > reported_q else reported_year + 1
        return reported_year if quarter <= reported_q else reported_year - 1

    def find(self, text: str, forward: bool) -> Period | None:
        """The first period the text names; `forward` reads unqualified references as upcoming.
        Each pattern runs only when the text holds a word it needs (most sentences hold none)."""
        lower = text.lower()
        has_quarter, has_year = "quarter" in lower, "year" in lower
        if has_quarter and (match := ORDINAL_QUARTER.search(text)):
            quarter = _ORDINALS[match[1].lower()]
            year = _year(match[2]) if match[2] else self._year_for_quarter(quarter, forward)
            return self.quarter(quarter, year)
        if "Q" in text and (match := Q_LABEL.search(text)):
            quarter = int(match[1] or match[3])
            year_text = match[2] or match[4]
            year = _year(year_text) if year_text else self._year_for_quarter(quarter, forward)
            return self.quarter(quarter, year)
        if _DIGIT.search(text) and (match := FISCAL_YEAR.search(text)):
            return self.fiscal_year(_year(match[1]))
        if (has_quarter or has_year) and (match := RELATIVE.search(text)):
            phrase = match[1].lower().replace("-", " ")
            if phrase in {"next quarter", "following quarter", "coming quarter"}:
                return self.shift(1)
            if phrase in {"last quarter", "prior quarter", "previous quarter"}:
                return self.shift(-1 if forward else 0)
            if phrase in {"this quarter", "the quarter", "current quarter"}:
                return self.shift(1 if forward else 0)
            if self.reported is not None:
                year = self.reported[1] + (1 if phrase == "next year" else 0)
                if forward and self.reported[0] == 4 and phrase != "next year":
                    year += 1  # after a Q4 call, 'the year' in an outlook is the new fiscal year
                return self.fiscal_year(year)
        return None


def find_date(text: str) -> tuple[datetime, datetime] | None:
    """An explicit calendar date ('July 1, 2024') or month ('March 2017') as [start, end)."""
    if not _FOUR_DIGITS.search(text):  # both patterns need a year
        return None
    if match := EXACT_DATE.search(text):
        month = _MONTHS[match[1].lower().rstrip(".")]
        try:
            day = date(int(match[3]), month, int(match[2]))
        except ValueError:
            return None
        return _utc(day), _utc(day) + timedelta(days=1)
    if match := MONTH_YEAR.search(text):
        month, year = _MONTHS[match[1].lower().rstrip(".")], int(match[2])
        after = date(year + month // 12, month % 12 + 1, 1)
        return _utc(date(year, month, 1)), _utc(after)
    return None
