"""Small numpy helpers shared by candidate selection and entity resolution."""

from __future__ import annotations

import numpy as np


def run_starts(*columns: np.ndarray) -> np.ndarray:
    """Positions where a run of equal rows starts, for rows sorted on `columns`."""
    if not len(columns[0]):
        return np.zeros(0, dtype=np.int64)
    changed = np.zeros(len(columns[0]) - 1, dtype=bool)
    for column in columns:
        changed |= column[1:] != column[:-1]
    return np.flatnonzero(np.r_[True, changed])
