"""The `table` model: shape-preserving (PCHIP) interpolation of the measured curve
in log-log space (log2 size, log2 time). Monotone where the data are, no overshoot:
the reference an honest parametric model must approach. Outside the measured range
it continues the edge segment's power law (the comm model flags and replaces that
with alpha-beta; this only serves held-out checks and plots)."""

from __future__ import annotations

import numpy as np

NAME = "table"


def fit(size_bytes: np.ndarray, time_s: np.ndarray, factor: float) -> dict:
    del factor  # the measured curve needs no convention
    x = np.log2(np.asarray(size_bytes, dtype=float))
    y = np.log2(np.asarray(time_s, dtype=float))
    # One knot per distinct size (mean of log times where a size repeats).
    knots, inverse = np.unique(x, return_inverse=True)
    values = np.bincount(inverse, weights=y) / np.bincount(inverse)
    return {"log2_size_bytes": knots.tolist(), "log2_time_s": values.tolist()}


def interpolator(params: dict):
    """A callable log2 size -> log2 time (PCHIP inside, edge power law outside)."""
    x = np.asarray(params["log2_size_bytes"], dtype=float)
    y = np.asarray(params["log2_time_s"], dtype=float)
    if x.size == 1:
        return lambda q: np.full_like(np.asarray(q, dtype=float), y[0])
    from scipy.interpolate import PchipInterpolator  # here: only a table of two or more sizes needs it

    pchip = PchipInterpolator(x, y, extrapolate=False)
    lo_slope = (y[1] - y[0]) / (x[1] - x[0])
    hi_slope = (y[-1] - y[-2]) / (x[-1] - x[-2])

    def evaluate(q):
        q = np.asarray(q, dtype=float)
        inside = pchip(np.clip(q, x[0], x[-1]))
        above = np.where(q > x[-1], y[-1] + hi_slope * (q - x[-1]), inside)
        return np.where(q < x[0], y[0] + lo_slope * (q - x[0]), above)

    return evaluate


def predict(params: dict, size_bytes: np.ndarray) -> np.ndarray:
    return np.exp2(interpolator(params)(np.log2(np.asarray(size_bytes, dtype=float))))
