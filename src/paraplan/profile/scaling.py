"""Batch scaling: time(b) = fixed + per_sample x b, fitted per layer by least squares."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def fit_fixed_per_sample(batches: Sequence[int], times_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`times_s[k, layer]` measured at `batches[k]` -> (fixed_s, per_sample_s) per layer.

    Both are clipped to >= 0 (a negative intercept is noise: the fit is redone through
    the origin for those layers), so time(b) never goes negative. One batch size gives
    fixed = 0.
    """
    b = np.asarray(batches, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if t.ndim == 1:
        t = t[:, None]
    if t.shape[0] != b.size:
        raise ValueError(f"{b.size} batch sizes but {t.shape[0]} rows of times")
    if np.unique(b).size < 2:
        return np.zeros(t.shape[1]), t.mean(axis=0) / b.mean()
    design = np.column_stack([np.ones_like(b), b])
    coef, *_ = np.linalg.lstsq(design, t, rcond=None)
    fixed, per_sample = coef[0], coef[1]
    through_origin = (t * b[:, None]).sum(axis=0) / (b**2).sum()
    negative_fixed = fixed < 0
    fixed = np.where(negative_fixed, 0.0, fixed)
    per_sample = np.where(negative_fixed, through_origin, per_sample)
    negative_slope = per_sample < 0  # time falls with batch: keep the mean as fixed cost
    fixed = np.where(negative_slope, t.mean(axis=0), fixed)
    per_sample = np.where(negative_slope, 0.0, per_sample)
    return fixed, per_sample


def fixed_at_batch(batches: Sequence[int], times_s: np.ndarray, measured_at_max_s: np.ndarray) -> np.ndarray:
    """The fixed part to store beside the values measured at the largest batch: the
    fitted intercept, capped at the measured time (the CSV contract fixed <= t)."""
    fixed, _ = fit_fixed_per_sample(batches, times_s)
    return np.minimum(fixed, np.asarray(measured_at_max_s, dtype=float))
