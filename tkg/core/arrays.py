"""Small numpy and Arrow helpers shared by candidate selection and entity resolution."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def run_starts(*columns: np.ndarray) -> np.ndarray:
    """Positions where a run of equal rows starts, for rows sorted on `columns`."""
    if not len(columns[0]):
        return np.zeros(0, dtype=np.int64)
    changed = np.zeros(len(columns[0]) - 1, dtype=bool)
    for column in columns:
        changed |= column[1:] != column[:-1]
    return np.flatnonzero(np.r_[True, changed])


def take_rows(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """`table.take(rows)`, chunk by chunk. Arrow's take first joins a column's chunks into one
    array, and a list column (an embedding per row) of more than 2**31 values overflows its
    32-bit offsets there (about 8.4M mentions of 256 dimensions); the rows taken are few."""
    rows = np.asarray(rows, dtype=np.int64)
    bounds = np.cumsum([0] + [batch.num_rows for batch in table.to_batches()])
    chunk_of = np.searchsorted(bounds, rows, side="right") - 1
    order = np.argsort(chunk_of, kind="stable")
    pieces = [batch.take(pa.array(rows[order][chunk_of[order] == chunk] - bounds[chunk]))
              for chunk, batch in enumerate(table.to_batches()) if (chunk_of == chunk).any()]
    if not pieces:
        return table.schema.empty_table()
    taken = pa.Table.from_batches(pieces, schema=table.schema)
    return taken.take(pa.array(np.argsort(order, kind="stable")))
