"""The versioned company registry: tickers, legal names, aliases and fiscal calendars."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from pathlib import Path

import yaml

from tkg.core.paths import CONFIG_DIR

DEFAULT_COMPANIES_FILE = CONFIG_DIR / "companies.yaml"


@dataclass(frozen=True)
class Company:
    ticker: str
    name: str
    aliases: tuple[str, ...] = field(default_factory=tuple)
    fiscal_year_end_month: int = 12
    # Reporting segments and product lines, each with the other names calls use for it: a
    # figure qualified by one is that segment's, never the company total.
    segments: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def fiscal_period(self, fiscal_quarter: int, fiscal_year: int) -> tuple[date, date]:
        """First and last day of fiscal quarter `fiscal_quarter` of fiscal year `fiscal_year`."""
        start, after = fiscal_quarter_bounds(self.fiscal_year_end_month, fiscal_quarter, fiscal_year)
        return start, date.fromordinal(after.toordinal() - 1)


def fiscal_quarter_bounds(fiscal_year_end_month: int, fiscal_quarter: int, fiscal_year: int) -> tuple[date, date]:
    """[start, end) of a fiscal quarter, as month-aligned dates.

    Fiscal year N ends in month `fiscal_year_end_month` of calendar year N, so NVIDIA's
    (January year-end) Q2 2021 runs May-July 2020 and Apple's (September) Q1 2016 runs
    October-December 2015.
    """
    first_month = fiscal_year * 12 + (fiscal_year_end_month - 1) - 3 * (4 - fiscal_quarter) - 2
    after = first_month + 3
    return date(first_month // 12, first_month % 12 + 1, 1), date(after // 12, after % 12 + 1, 1)


def companies_file() -> Path:
    return Path(os.environ.get("TKG_COMPANIES", DEFAULT_COMPANIES_FILE))


@lru_cache(maxsize=4)
def _load(path: Path) -> dict[str, Company]:
    try:
        document = yaml.safe_load(path.read_text())
    except FileNotFoundError as error:
        raise FileNotFoundError(f"company registry {path} does not exist; set TKG_COMPANIES to a companies.yaml") from error
    registry: dict[str, Company] = {}
    for entry in document.get("companies", []):
        ticker = str(entry["ticker"]).strip().upper()
        if "|" in ticker:
            raise ValueError(f"ticker {ticker!r} in {path} contains '|', which Dagster uses to join partition keys")
        month = int(entry.get("fiscal_year_end_month", 12))
        if not 1 <= month <= 12:
            raise ValueError(f"{ticker} in {path}: fiscal_year_end_month must be 1..12, got {month}")
        registry[ticker] = Company(ticker, str(entry["name"]), tuple(entry.get("aliases", ())), month,
                                   _segments(entry.get("segments", ()), ticker, path))
    return registry


def _segments(entries: object, ticker: str, path: Path) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`segments:` entries, each a name or {name: [aliases]}."""
    segments = []
    for entry in entries or ():
        if isinstance(entry, str):
            segments.append((entry, ()))
        elif isinstance(entry, dict) and len(entry) == 1:
            name, aliases = next(iter(entry.items()))
            segments.append((str(name), tuple(str(alias) for alias in aliases or ())))
        else:
            raise ValueError(f"{ticker} in {path}: each segment is a name or {{name: [aliases]}}, got {entry!r}")
    return tuple(segments)


def load_companies() -> dict[str, Company]:
    """All configured companies by ticker."""
    return _load(companies_file())


def get_company(ticker: str) -> Company:
    companies = load_companies()
    try:
        return companies[ticker.upper()]
    except KeyError:
        raise KeyError(
            f"company {ticker!r} is not in the registry {companies_file()}; add it there "
            "(ticker, name, aliases, fiscal_year_end_month) to ingest its transcripts"
        ) from None
