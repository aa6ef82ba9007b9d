"""The partition space, computed in one place: company x calendar quarter of the call date.

A partition key reads 'INTC|2016-10-01' (Dagster joins multi-partition dimensions sorted by
name: company, then quarter). The calendar quarter is unambiguous per company, whereas fiscal
labels are not (NVIDIA's and AMD's 'Q1 2019' are different periods); the fiscal label is kept
as data in `transcripts`. Nothing here imports dagster: the CLI, the planner and the Dagster
definitions all use these functions.
"""

from __future__ import annotations

from datetime import date, datetime, timezone

Partition = tuple[str, date]  # (ticker, first day of the calendar quarter)

# Where the partition space starts when the source cannot be listed (the Hugging Face corpus starts here).
FIRST_QUARTER = date(2016, 1, 1)
# Calls dated before this, or after the quarter under way, are refused as implausible.
EARLIEST_CALL = date(1990, 1, 1)


def quarter_start(day: date) -> date:
    """The calendar quarter a call date falls in, as the quarter's first day (the partition key)."""
    return date(day.year, 3 * ((day.month - 1) // 3) + 1, 1)


def last_quarter(today: date | None = None) -> date:
    """The last quarter of the partition space: the one under way (a call held today belongs to it)."""
    return quarter_start(today or datetime.now(timezone.utc).date())


def key_of(company: str, quarter: date) -> str:
    """The partition key string, as Dagster writes it."""
    return f"{company}|{quarter.isoformat()}"


def parse_key(key: str) -> Partition:
    """'AMD|2017-01-01' -> ('AMD', date(2017, 1, 1)); a clear error for anything else."""
    company, separator, quarter = str(key).partition("|")
    try:
        day = date.fromisoformat(quarter)
    except ValueError:
        day = None
    if not separator or not company or day is None or day != quarter_start(day):
        raise ValueError(f"{key!r} is not a partition key; expected TICKER|YYYY-MM-DD with the first day of a quarter, "
                         "e.g. AMD|2017-01-01")
    return company, day


def sort_key(partition: Partition) -> tuple[date, str]:
    """Partitions are built oldest quarter first, then by ticker."""
    return partition[1], partition[0]
