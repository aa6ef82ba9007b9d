"""How a question names a time window and an office: the words both the general reader
(tkg.answer.ask) and the financial reader (tkg.answer.financial) read."""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import date, datetime, timezone

from tkg.core.companies import load_companies

MONTHS = {name.lower(): number for number, name in enumerate(calendar.month_name) if name}
MONTHS.update({name.lower(): number for number, name in enumerate(calendar.month_abbr) if name})
ORDINALS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "1st": 1, "2nd": 2, "3rd": 3, "4th": 4}

# Office words a question may use, and how titles spell them.
ROLES = {
    "ceo": ("ceo", "chief executive"), "cfo": ("cfo", "chief financial"), "coo": ("coo", "chief operating"),
    "cto": ("cto", "chief technology"), "president": ("president",), "chairman": ("chairman", "chair", "chairwoman"),
    "investor relations": ("ir", "investor relations"), "treasurer": ("treasurer",), "general counsel": ("general counsel",),
}
@dataclass
class Period:
    """A window a question names, and the words that named it."""

    start: datetime
    end: datetime
    said: str


def _day_start(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=timezone.utc)


def _day_end(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, 23, 59, 59, tzinfo=timezone.utc)


def _year(text: str) -> int:
    digits = text.strip("'")
    return int(digits) + 2000 if len(digits) == 2 else int(digits)


_FISCAL_QUARTER = re.compile(
    r"\b(?:fiscal\s+)?(?:q([1-4])|(first|second|third|fourth|1st|2nd|3rd|4th)\s+(?:fiscal\s+)?quarter)"
    r"(?:\s+(?:of\s+)?(?:fiscal\s+(?:year\s+)?|fy\s*)?('?\d{2}\b|\d{4}))?", re.IGNORECASE)
_FISCAL_YEAR = re.compile(r"\b(?:fiscal\s+(?:year\s+)?|fy\s?)('?\d{2}\b|\d{4})", re.IGNORECASE)
_MONTH = re.compile(r"\b(" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?(?:\s+(\d{1,2}))?,?\s+(\d{4})\b",
                    re.IGNORECASE)
_ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_YEAR = re.compile(r"\b(19\d{2}|20\d{2})\b")


def read_period(question: str, company: str | None, latest: date | None = None) -> tuple[Period | None, list[str]]:
    """The window a question names: a day, a month, a fiscal quarter or year (on the company's
    fiscal calendar), or a calendar year. A quarter without a year takes the year the question
    names elsewhere, else the newest the graph holds."""
    notes: list[str] = []
    fiscal_calendar = load_companies().get(company) if company else None
    if (found := _FISCAL_QUARTER.search(question)) is not None:
        quarter = int(found[1]) if found[1] else ORDINALS[found[2].lower()]
        if found[3]:
            year = _year(found[3])
        elif (other := _YEAR.search(question[found.end():]) or _YEAR.search(question)) is not None:
            year = int(other[1])
        else:
            year = (latest or date.today()).year
            notes.append(f"'{found[0]}' names no year; read as fiscal {year}, the newest in the graph")
        if fiscal_calendar is not None:
            first, last = fiscal_calendar.fiscal_period(quarter, year)
            notes.append(f"'{found[0]}' is Q{quarter} of {company}'s fiscal {year}: {first} to {last}")
        else:
            first = date(year, 3 * quarter - 2, 1)
            last = date(year, 3 * quarter, calendar.monthrange(year, 3 * quarter)[1])
        return Period(_day_start(first), _day_end(last), found[0]), notes
    if (found := _ISO.search(question)) is not None:
        day = date(int(found[1]), int(found[2]), int(found[3]))
        return Period(_day_start(day), _day_end(day), found[0]), notes
    if (found := _MONTH.search(question)) is not None:
        month, year = MONTHS[found[1].lower()], int(found[3])
        if found[2]:
            day = date(year, month, int(found[2]))
            return Period(_day_start(day), _day_end(day), found[0]), notes
        last = calendar.monthrange(year, month)[1]
        return Period(_day_start(date(year, month, 1)), _day_end(date(year, month, last)), found[0]), notes
    if (found := _FISCAL_YEAR.search(question)) is not None:
        year = _year(found[1])
        if fiscal_calendar is not None:
            first, _ = fiscal_calendar.fiscal_period(1, year)
            _, last = fiscal_calendar.fiscal_period(4, year)
            notes.append(f"'{found[0]}' is {company}'s fiscal {year}: {first} to {last}")
        else:
            first, last = date(year, 1, 1), date(year, 12, 31)
        return Period(_day_start(first), _day_end(last), found[0]), notes
    if (found := _YEAR.search(question)) is not None:
        year = int(found[1])
        return Period(_day_start(date(year, 1, 1)), _day_end(date(year, 12, 31)), found[0]), notes
    return None, notes
