"""Spearman's rank correlation of predicted and measured times, without scipy.stats.

Importing scipy.stats costs a `paraplan predict` or `paraplan calibrate` with measured
times about 0.4 s of CPU for this one number. The number is Pearson's correlation
(numpy's `corrcoef`) of the two inputs' ranks, ties sharing the mean of the ranks they
span: what `scipy.stats.spearmanr` computes, to the last bit (the ranks and their
sums are exact in binary, so only `corrcoef`'s own arithmetic rounds;
tests/unit/test_rank_correlation.py checks it against scipy). It does not exist (NaN)
for fewer than two pairs, a NaN, or an input whose values are all equal.
"""

from __future__ import annotations

import numpy as np


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of `values` (1-D), equal values sharing the mean of their ranks."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts_run = np.concatenate(([True], ordered[1:] != ordered[:-1]))
    first = np.flatnonzero(starts_run)  # 0-based position where each run of equal values starts
    past = np.append(first[1:], values.size)  # and where it ends (exclusive)
    ranks = np.empty(values.size)
    ranks[order] = ((first + 1 + past) / 2.0)[np.cumsum(starts_run) - 1]
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho of paired 1-D samples `x` and `y` (NaN where it does not exist)."""
    a = np.asarray(x, dtype=float)
    b = np.asarray(y, dtype=float)
    if a.size < 2 or np.isnan(a).any() or np.isnan(b).any() or (a == a[0]).all() or (b == b[0]).all():
        return float("nan")
    return float(np.corrcoef(average_ranks(a), average_ranks(b))[1, 0])
