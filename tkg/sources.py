"""Transcript sources: the bundled sample, a local parquet/jsonl/csv file, or the Hugging Face
dataset `jlh-ibm/earnings_call` (config `transcripts`). All load through `datasets`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import lru_cache
from pathlib import Path

from tkg.parsing import SourceRow

log = logging.getLogger(__name__)

SAMPLE_PATH = Path(__file__).parent / "sample" / "transcripts.jsonl"
HF_DATASET = ("jlh-ibm/earnings_call", "transcripts")
REQUIRED_COLUMNS = ("company", "date", "transcript")
_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}


@dataclass
class LoadedSource:
    """Rows that can be ingested, and the rows that could not, with the reason for each."""

    name: str
    rows: list[SourceRow]
    skipped: list[str] = field(default_factory=list)


def quarter_start(day: date) -> date:
    """The calendar quarter a call date falls in, as the quarter's first day (the partition key)."""
    return date(day.year, 3 * ((day.month - 1) // 3) + 1, 1)


def _as_date(value: object) -> date | None:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    if isinstance(value, str) and value.strip():
        try:
            return date.fromisoformat(value.strip()[:10])
        except ValueError:
            return None
    return None


def describe(source: str) -> str:
    if source in ("", "sample"):
        return f"the bundled sample ({SAMPLE_PATH.name})"
    if source in ("hf", "huggingface") or source.startswith("hf:"):
        return f"Hugging Face {HF_DATASET[0]} ({HF_DATASET[1]})"
    return str(Path(source).expanduser())


def _load_dataset(source: str):
    import datasets

    if source in ("hf", "huggingface") or source.startswith("hf:"):
        name = source.split(":", 1)[1] if source.startswith("hf:") and source != "hf:" else HF_DATASET[0]
        loaded = datasets.load_dataset(name, HF_DATASET[1])
        return datasets.concatenate_datasets(list(loaded.values()))  # HF splits train/test; we want all calls
    path = SAMPLE_PATH if source in ("", "sample") else Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"transcript source {path} does not exist; pass a parquet, jsonl or csv file, 'sample' or 'hf'")
    file_format = _FORMATS.get(path.suffix.lower())
    if file_format is None:
        raise ValueError(f"transcript source {path} has suffix {path.suffix!r}; use .parquet, .jsonl, .json or .csv")
    return datasets.load_dataset(file_format, data_files=str(path), split="train")


@lru_cache(maxsize=4)
def _load_cached(source: str, stamp: float) -> LoadedSource:
    dataset = _load_dataset(source)
    missing = [column for column in REQUIRED_COLUMNS if column not in dataset.column_names]
    if missing:
        raise ValueError(
            f"transcript source {describe(source)} lacks column(s) {', '.join(missing)}; "
            f"it needs {', '.join(REQUIRED_COLUMNS)} (found {', '.join(dataset.column_names)})"
        )
    loaded = LoadedSource(name=describe(source), rows=[])
    for position, record in enumerate(dataset.select_columns(list(REQUIRED_COLUMNS))):
        company = str(record["company"] or "").strip().upper()
        call_date = _as_date(record["date"])
        text = record["transcript"]
        if not company or call_date is None or not isinstance(text, str) or not text.strip():
            problem = "no company" if not company else "no parseable date" if call_date is None else "no transcript text"
            loaded.skipped.append(f"row {position} ({company or '?'} {record['date']}): {problem}")
            continue
        loaded.rows.append(SourceRow(company=company, call_date=call_date, text=text.replace("\r\n", "\n")))
    loaded.rows.sort(key=lambda row: (row.company, row.call_date))
    return loaded


def load_source(source: str = "sample") -> LoadedSource:
    """All rows of a source, validated; cached per process until the file changes."""
    path = SAMPLE_PATH if source in ("", "sample") else Path(source).expanduser()
    stamp = path.stat().st_mtime if path.exists() else 0.0
    return _load_cached(source or "sample", stamp)


def rows_for_partition(source: LoadedSource, company: str, quarter: date) -> list[SourceRow]:
    return [row for row in source.rows if row.company == company and quarter_start(row.call_date) == quarter]
