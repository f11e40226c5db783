"""Prediction errors as Lin et al. (HiPC 2022) report them: relative error per point, GMAE
(geometric mean with epsilon 4e-4, so an exact point does not send the log to
minus infinity), mean and standard deviation. Errors are fractions (0.04 = 4%)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GMAE_EPS = 4e-4


def rel_err(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """|predicted - measured| / measured, elementwise."""
    predicted = np.asarray(predicted, dtype=float)
    measured = np.asarray(measured, dtype=float)
    return np.abs(predicted - measured) / measured


def gmae(errors: np.ndarray) -> float:
    """exp(mean(log(e + 4e-4))); NaN for no errors."""
    errors = np.asarray(errors, dtype=float)
    if errors.size == 0:
        return float("nan")
    return float(np.exp(np.mean(np.log(errors + GMAE_EPS))))


@dataclass(frozen=True)
class ErrorSummary:
    gmae: float
    mean_abs_rel_err: float
    std_abs_rel_err: float
    n_points: int


def summarize(errors: np.ndarray) -> ErrorSummary:
    """GMAE, mean and (sample) standard deviation of relative errors."""
    errors = np.asarray(errors, dtype=float)
    n = int(errors.size)
    if n == 0:
        nan = float("nan")
        return ErrorSummary(nan, nan, nan, 0)
    std = float(np.std(errors, ddof=1)) if n > 1 else 0.0
    return ErrorSummary(gmae(errors), float(np.mean(errors)), std, n)


def histogram_pct(errors: np.ndarray, step_pct: float = 5.0, max_pct: float = 400.0) -> tuple[np.ndarray, np.ndarray]:
    """Counts of relative errors in the study's bins 0, 5, 10, ..., 400% (the last bin
    also holds everything larger); returns (counts, edges in percent)."""
    edges = np.arange(0.0, max_pct + step_pct, step_pct)
    clipped = np.clip(np.asarray(errors, dtype=float) * 100.0, 0.0, max_pct - 1e-9)
    counts, _ = np.histogram(clipped, bins=edges)
    return counts, edges
