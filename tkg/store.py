"""Parquet is the system of record: one file per (asset, company, quarter), replaced atomically.

Partitioned steps never touch the DuckDB file, so partition runs can go fully parallel; global
steps read the files through an in-memory DuckDB connection (no file lock either).
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

# Temporary files carry the host and process that write them, so a later run can tell the
# leftovers of a killed writer from the files of a writer that is still at work.
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<host>[^.]+)-(?P<pid>\d+)\.[0-9a-f]{8}(?P<suffix>\.tmp|\.building)(?:\.wal)?$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def temporary_path(target: Path, suffix: str = ".tmp") -> Path:
    """A unique temporary name beside `target`, for writing it and then swapping it in."""
    return target.with_name(f".{target.name}.{_host()}-{os.getpid()}.{secrets.token_hex(4)}{suffix}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_orphaned_temporaries(root: Path) -> list[Path]:
    """Delete the temporary files that writers on this host left behind when they were killed
    (their process is gone); files of writers still running are left alone."""
    removed = []
    host = _host()
    if not root.exists():
        return removed
    for path in root.rglob(".*"):
        match = _TEMPORARY.match(path.name)
        if match and match["host"] == host and not _alive(int(match["pid"])):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


@contextmanager
def locked(path: Path, waiting: Callable[[str], None] | None = None) -> Iterator[None]:
    """An exclusive lock on `path` (created if needed) for the duration of the block. When
    another process holds it, `waiting` is told who (the pid it wrote) before blocking."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                handle.seek(0)
                waiting(handle.read().strip() or "?")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class ParquetStore:
    """Reads and writes the Parquet files under `<root>/parquet/`."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).expanduser().resolve()
        self.parquet_root = self.root / "parquet"

    def partition_path(self, asset: str, company: str, quarter: date | str) -> Path:
        quarter_text = quarter.isoformat() if isinstance(quarter, date) else quarter
        return self.parquet_root / asset / f"company={company}" / f"quarter={quarter_text}" / f"{asset}.parquet"

    def global_path(self, asset: str, table: str | None = None) -> Path:
        return self.parquet_root / asset / f"{table or asset}.parquet"

    def usage_path(self, step: str, company: str | None = None, quarter: date | None = None) -> Path:
        """Where one step's LLM accounting goes: per partition, or one file for a global step."""
        folder = self.parquet_root / "llm_calls" / step
        if company is not None and quarter is not None:
            folder = folder / f"company={company}" / f"quarter={quarter.isoformat()}"
        return folder / "llm_calls.parquet"

    def glob(self, asset: str) -> str:
        """The glob over every partition file of a partitioned asset."""
        return str(self.parquet_root / asset / "company=*" / "quarter=*" / f"{asset}.parquet")

    def write(self, path: Path, table: pa.Table) -> Path:
        """Write `table` to `path` atomically: a reader sees the old file or the new one, never half."""
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = temporary_path(path)
        try:
            pq.write_table(table, temporary, compression="zstd")
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        return path

    def read(self, path: Path) -> pa.Table:
        return pq.read_table(path)

    def exists(self, asset: str) -> bool:
        return any((self.parquet_root / asset).glob("company=*/quarter=*/*.parquet")) or any(
            (self.parquet_root / asset).glob("*.parquet")
        )

    def read_all(self, asset: str, schema: pa.Schema, columns: list[str] | None = None) -> pa.Table:
        """Every partition of `asset` as one table (empty, with `schema`, when nothing is written yet)."""
        files = sorted((self.parquet_root / asset).glob(f"company=*/quarter=*/{asset}.parquet"))
        if not files:
            empty = schema.empty_table()
            return empty.select(columns) if columns else empty
        select = ", ".join(f'"{c}"' for c in columns) if columns else "*"
        with duckdb.connect() as connection:
            return connection.sql(
                f"SELECT {select} FROM read_parquet($files, union_by_name = true)", params={"files": [str(f) for f in files]}
            ).to_arrow_table()
