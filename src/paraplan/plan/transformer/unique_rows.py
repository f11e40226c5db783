"""`np.unique(rows, axis=0, return_inverse=True)` for integer columns, faster: the
planner keys tens of thousands of candidates by a few small integers, and NumPy's
row-wise unique sorts them as structured records (tens of ms each time). Packing each
row into one int64 (mixed radix, each column offset by its minimum) sorts them the
same way, lexicographically, column 0 first."""

from __future__ import annotations

import numpy as np

_MAX_PACKED = 2**62  # the packed key's range must fit int64


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of the 2-D integer array `rows`, sorted lexicographically, and
    each row's index among them: what `np.unique(rows, axis=0, return_inverse=True)`
    gives (the inverse flattened)."""
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[0] == 0 or rows.dtype.kind not in "iub":
        unique, inverse = np.unique(rows, axis=0, return_inverse=True)
        return unique, inverse.ravel()
    wide = rows.astype(np.int64)
    low = wide.min(axis=0)
    span = wide.max(axis=0) - low + 1
    if float(np.prod(span.astype(float))) >= _MAX_PACKED:
        unique, inverse = np.unique(rows, axis=0, return_inverse=True)
        return unique, inverse.ravel()
    packed = np.zeros(len(wide), dtype=np.int64)
    for j in range(wide.shape[1]):
        packed = packed * span[j] + (wide[:, j] - low[j])
    _, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
    return rows[first], inverse.ravel()
