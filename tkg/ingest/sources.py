"""Transcript sources: the bundled sample, a local parquet/jsonl/csv file, or the Hugging Face
dataset `jlh-ibm/earnings_call` (config `transcripts`).

Local files are read row by row, so one bad row (no text, a date that does not parse or falls
outside the partition space, bytes that are not UTF-8, a line that is not JSON) is skipped and
named with its file, row and field, and every other row is still built. Rows that repeat
another row exactly are built once, with a warning; two different texts for the same company
and date are an error naming both rows, and neither is built.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from tkg.core.companies import load_companies
from tkg.core.partitions import (
    EARLIEST_CALL,
    Partition,
    last_quarter,
    quarter_start,
    sort_key,
)
from tkg.core.paths import SAMPLE_DIR
from tkg.ingest.parsing import SourceRow

log = logging.getLogger(__name__)

SAMPLE_PATH = SAMPLE_DIR / "transcripts.jsonl"
HF_DATASET = ("jlh-ibm/earnings_call", "transcripts")
REQUIRED_COLUMNS = ("company", "date", "transcript")
_FORMATS = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv"}


class SourceError(ValueError):
    """The source as a whole cannot be read (missing file, unknown format, missing columns)."""


@dataclass(frozen=True)
class SourceProblem:
    """A row that is not built, and why. `partition` is set when the row's company and date
    were readable, so the caller knows which partition the row belonged to."""

    origin: str  # 'transcripts.jsonl line 7'
    field: str | None  # the column at fault, when one is
    message: str
    partition: Partition | None = None

    def __str__(self) -> str:
        where = f"{self.origin}, field '{self.field}'" if self.field else self.origin
        return f"{where}: {self.message}"


@dataclass
class LoadedSource:
    """The rows that can be built, the rows that cannot (with the reason for each), and the
    exact repeats that were folded into one row."""

    name: str
    rows: list[SourceRow]
    problems: list[SourceProblem] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)

    @property
    def skipped(self) -> list[str]:
        return [str(problem) for problem in self.problems]

    def partitions(self) -> list[Partition]:
        """(company, quarter) keys with at least one buildable row, oldest first."""
        return sorted({(row.company, quarter_start(row.call_date)) for row in self.rows}, key=sort_key)

    def rows_for(self, company: str, quarter: date) -> list[SourceRow]:
        return [row for row in self.rows if row.company == company and quarter_start(row.call_date) == quarter]

    def problem_partitions(self) -> dict[Partition, list[SourceProblem]]:
        """Partitions that hold a row that could not be read, with those rows."""
        found: dict[Partition, list[SourceProblem]] = defaultdict(list)
        for problem in self.problems:
            if problem.partition is not None:
                found[problem.partition].append(problem)
        return dict(found)

    def without_call(self, company: str, quarter: date) -> bool:
        """Whether the source holds no row for the partition, readable or not: a quarter still
        to come, or a call taken out of the source (tkg.build.stages.build_partition)."""
        return not self.rows_for(company, quarter) and (company, quarter) not in self.problem_partitions()


def rows_fingerprint(rows: list[SourceRow]) -> str:
    """A hash of a partition's source rows (company, date, text), independent of their order."""
    digests = sorted(f"{row.company}|{row.call_date.isoformat()}|{hashlib.sha256(row.text.encode()).hexdigest()}"
                     for row in rows)
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()


def describe(source: str) -> str:
    if source in ("", "sample"):
        return f"the bundled sample ({SAMPLE_PATH.name})"
    if _is_hf(source):
        return f"Hugging Face {HF_DATASET[0]} ({HF_DATASET[1]})"
    return str(Path(source).expanduser())


def _is_hf(source: str) -> bool:
    return source in ("hf", "huggingface") or source.startswith("hf:")


def source_path(source: str) -> Path | None:
    """The local file behind a source, or None for the Hugging Face hub."""
    if _is_hf(source):
        return None
    return SAMPLE_PATH if source in ("", "sample") else Path(source).expanduser()


# --- reading records -------------------------------------------------------------------------

Record = tuple[str, dict[str, Any] | None, SourceProblem | None]  # (origin, fields, problem)


def _jsonl_records(path: Path) -> Iterator[Record]:
    """JSON lines (or one JSON array of objects), one record per line, each checked on its own."""
    data = path.read_bytes()
    if data.lstrip()[:1] == b"[":
        try:
            items = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise SourceError(f"{path} starts like a JSON array but does not parse ({error}); "
                              "use one JSON object per line to have bad rows skipped one by one") from None
        for position, item in enumerate(items, start=1):
            origin = f"{path.name} item {position}"
            yield (origin, item, None) if isinstance(item, dict) else (origin, None, SourceProblem(origin, None, "is not a JSON object"))
        return
    for number, line in enumerate(data.split(b"\n"), start=1):
        origin = f"{path.name} line {number}"
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as error:
            yield origin, None, SourceProblem(origin, None, f"is not UTF-8 (byte 0x{line[error.start]:02x} at column {error.start + 1})")
            continue
        try:
            item = json.loads(text)
        except json.JSONDecodeError as error:
            yield origin, None, SourceProblem(origin, None, f"is not JSON ({error.msg} at column {error.colno})")
            continue
        if not isinstance(item, dict):
            yield origin, None, SourceProblem(origin, None, f"is a JSON {type(item).__name__}, not an object with {', '.join(REQUIRED_COLUMNS)}")
            continue
        yield origin, item, None


def _csv_records(path: Path) -> Iterator[Record]:
    """CSV with a header row; bytes that are not UTF-8 are reported per row and field."""
    text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    _require_columns(path, reader.fieldnames or [])
    line = reader.line_num
    for record in reader:
        origin = f"{path.name} line {line + 1}"
        line = reader.line_num
        bad = next((name for name in REQUIRED_COLUMNS if _has_surrogates(record.get(name))), None)
        if bad:
            yield origin, None, SourceProblem(origin, bad, "is not UTF-8")
            continue
        if None in record:  # more cells than header columns
            yield origin, None, SourceProblem(origin, None, f"has {len(record[None])} more cell(s) than the header")
            continue
        yield origin, record, None


def _has_surrogates(value: object) -> bool:
    return isinstance(value, str) and any("\udc80" <= ch <= "\udcff" for ch in value)


def _parquet_records(path: Path) -> Iterator[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)  # not pq.read_table: that imports pyarrow.dataset and pandas
    except (OSError, pa.ArrowException) as error:
        raise SourceError(f"{path} is not a readable Parquet file ({error})") from None
    _require_columns(path, parquet.schema_arrow.names)
    table = parquet.read(columns=list(REQUIRED_COLUMNS))
    # Strings are read as bytes and decoded per row, so one bad value names its row.
    columns = {}
    for name in REQUIRED_COLUMNS:
        column = table.column(name)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            column = column.cast(pa.large_binary())
        columns[name] = column.to_pylist()
    for index in range(table.num_rows):
        origin = f"{path.name} row {index + 1}"
        record = {}
        for name in REQUIRED_COLUMNS:
            value = columns[name][index]
            if isinstance(value, bytes):
                try:
                    value = value.decode("utf-8")
                except UnicodeDecodeError as error:
                    yield origin, None, SourceProblem(origin, name, f"is not UTF-8 (byte 0x{value[error.start]:02x} at offset {error.start})")
                    break
            record[name] = value
        else:
            yield origin, record, None


def _hf_records(source: str) -> Iterator[Record]:
    import datasets

    name = source.split(":", 1)[1] if source.startswith("hf:") and source != "hf:" else HF_DATASET[0]
    loaded = datasets.load_dataset(name, HF_DATASET[1])
    dataset = datasets.concatenate_datasets(list(loaded.values()))  # HF splits train/test; we want all calls
    _require_columns(Path(name), dataset.column_names)
    for index, record in enumerate(dataset.select_columns(list(REQUIRED_COLUMNS))):
        yield f"{name} row {index + 1}", record, None


def _require_columns(path: Path, names: list[str]) -> None:
    missing = [column for column in REQUIRED_COLUMNS if column not in names]
    if missing:
        raise SourceError(f"transcript source {path} lacks column(s) {', '.join(missing)}; it needs "
                          f"{', '.join(REQUIRED_COLUMNS)} (found {', '.join(map(str, names)) or 'none'})")


# --- validating rows -------------------------------------------------------------------------


def _as_date(value: object) -> date | None:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    if isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            return date.fromisoformat(text[:10]) if len(text) == 10 or text[10:11] in ("T", " ") else None
        except ValueError:
            return None
    return None


def _validate(origin: str, record: dict[str, Any], known: set[str]) -> SourceRow | SourceProblem:
    company = str(record.get("company") or "").strip().upper()
    if not company:
        return SourceProblem(origin, "company", "is empty")
    raw_date = record.get("date")
    call_date = _as_date(raw_date)
    if call_date is None:
        shown = repr(raw_date) if raw_date not in (None, "") else "empty"
        return SourceProblem(origin, "date", f"{shown} is not a date (YYYY-MM-DD)")
    partition = (company, quarter_start(call_date))
    if company not in known:
        return SourceProblem(origin, "company", f"{company} is not in the company registry; add it to companies.yaml "
                             "(ticker, name, aliases, fiscal_year_end_month) to build its calls", partition)
    if not EARLIEST_CALL <= call_date or partition[1] > last_quarter():
        return SourceProblem(origin, "date", f"{call_date.isoformat()} is outside the dates tkg accepts "
                             f"({EARLIEST_CALL.isoformat()} to the end of the current quarter)", partition)
    text = record.get("transcript")
    if not isinstance(text, str) or not text.strip():
        return SourceProblem(origin, "transcript", "is empty" if text is None or isinstance(text, str)
                             else f"is a {type(text).__name__}, not text", partition)
    return SourceRow(company=company, call_date=call_date, text=text.replace("\r\n", "\n"), origin=origin)


def _collect(name: str, records: Iterator[Record]) -> LoadedSource:
    loaded = LoadedSource(name=name, rows=[])
    known = set(load_companies())
    by_call: dict[tuple[str, date], list[SourceRow]] = defaultdict(list)
    for origin, record, problem in records:
        checked = problem if problem is not None else _validate(origin, record, known)
        if isinstance(checked, SourceProblem):
            loaded.problems.append(checked)
        else:
            by_call[(checked.company, checked.call_date)].append(checked)
    for (company, call_date), rows in sorted(by_call.items()):
        texts = {row.text for row in rows}
        if len(texts) > 1:
            origins = ", ".join(row.origin for row in rows)
            for row in rows:
                loaded.problems.append(SourceProblem(
                    row.origin, "transcript", f"{company} {call_date.isoformat()} has different texts in {origins}; "
                    "keep one of them", (company, quarter_start(call_date))))
            continue
        if len(rows) > 1:
            loaded.duplicates.append(f"{', '.join(row.origin for row in rows[1:])} repeat{'s' if len(rows) == 2 else ''} "
                                     f"{rows[0].origin} ({company} {call_date.isoformat()}); built once")
        loaded.rows.append(rows[0])
    return loaded


@lru_cache(maxsize=4)
def _load_cached(source: str, stamp: tuple[float, int]) -> LoadedSource:
    path = source_path(source)
    if path is None:
        return _collect(describe(source), _hf_records(source))
    if not path.exists():
        raise SourceError(f"transcript source {path} does not exist; pass a .parquet, .jsonl or .csv file, 'sample' or 'hf'")
    file_format = _FORMATS.get(path.suffix.lower())
    if file_format is None:
        raise SourceError(f"transcript source {path} has suffix {path.suffix!r}; use .parquet, .jsonl, .json or .csv")
    reader = {"parquet": _parquet_records, "jsonl": _jsonl_records, "csv": _csv_records}[file_format]
    return _collect(describe(source), reader(path))


def load_source(source: str = "sample") -> LoadedSource:
    """All rows of a source, validated; cached per process until the file changes."""
    source = source or "sample"
    path = source_path(source)
    stat = path.stat() if path is not None and path.exists() else None
    return _load_cached(source, (stat.st_mtime, stat.st_size) if stat else (0.0, 0))
