"""Parquet is the system of record: one file per (asset, company, quarter), replaced atomically.

Partitioned steps never touch the DuckDB file, so partition runs can go fully parallel; global
steps read the files through an in-memory DuckDB connection (no file lock either).
"""

from __future__ import annotations

import os
import tempfile
from datetime import date
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq


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
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(handle)
        try:
            pq.write_table(table, temporary, compression="zstd")
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
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
