"""Seed 002's three-region "sigmoid bandwidth" model, made robust.

With x = log2(size) and busbw = size x factor / time:
- below `ln_p` (latency still flat): t = overhead;
- between `ln_p` and `sats_p`: log10(busbw) = L / (1 + exp(-k (x - x0))) + b and
  t = size x factor / busbw;
- above `sats_p` (bandwidth saturated): t = size x factor / max_busbw + overhead.

Turning points follow the seed (reference/comm-fitting.md): `ln_p` is the point
before the first index >= i0 whose relative central slope of latency exceeds 0.1,
`sats_p` two points after the last one whose busbw is below 95% of the peak;
`overhead` is the latency at `ln_p`. Robustness added here: i0 is 5 only for sweeps
long enough to have 5 flat points (n // 4 otherwise), the sigmoid parameters are
bounded, several starting points are tried with a generous evaluation budget, and
when the sigmoid cannot be fitted (too few points, no convergence, a non-finite
answer) the middle region falls back to a straight line in (x, log10 busbw), or a
constant. `params["fit"]` records which. The fit never raises for finite positive
input with at least two sizes.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit

NAME = "sigmoid_bw"
FLAT_SLOPE = 0.1
SATURATION = 0.95
_MAX_EVALUATIONS = 4000
_K_STARTS = (0.5, 1.5, 4.0)


def _sigmoid(x: np.ndarray, big_l: float, k: float, x0: float, b: float) -> np.ndarray:
    return big_l / (1.0 + np.exp(-k * (x - x0))) + b


def turning_indices(time_s: np.ndarray, busbw: np.ndarray) -> tuple[int, int]:
    """(ln index, sats index) into a sweep sorted by size; sats may be past the end."""
    n = time_s.size
    start = min(5, max(1, n // 4))
    ln_idx = n - 1
    for i in range(start, n - 1):
        slope = abs(time_s[i + 1] - time_s[i - 1]) / (2.0 * time_s[i])
        if slope > FLAT_SLOPE:
            ln_idx = i - 1
            break
    below = np.flatnonzero(busbw < SATURATION * busbw.max())
    sats_idx = int(below[-1]) + 2 if below.size else 0
    sats_idx = max(sats_idx, ln_idx + 1)
    return ln_idx, sats_idx


def _fit_middle(x: np.ndarray, y: np.ndarray) -> tuple[dict, str]:
    """Sigmoid (bounded, multi-start) through (x, log10 busbw), else a line, else a constant."""
    if x.size >= 4:
        span = float(y.max() - y.min())
        lower = (0.0, 1e-3, float(x.min()) - 8.0, float(y.min()) - 3.0)
        upper = (span + 3.0, 20.0, float(x.max()) + 8.0, float(y.max()) + 0.5)
        best = None
        for k0 in _K_STARTS:
            start = (span + 0.05, k0, float(np.median(x)), float(y.min()) - 0.025)
            start = tuple(float(np.clip(s, lo + 1e-9, hi - 1e-9)) for s, lo, hi in zip(start, lower, upper, strict=True))
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", OptimizeWarning)
                    warnings.simplefilter("ignore", RuntimeWarning)
                    popt, _ = curve_fit(
                        _sigmoid, x, y, p0=start, bounds=(lower, upper), method="trf", max_nfev=_MAX_EVALUATIONS
                    )
            except (RuntimeError, ValueError, FloatingPointError):
                continue
            if not np.all(np.isfinite(popt)):
                continue
            sse = float(np.sum((_sigmoid(x, *popt) - y) ** 2))
            if best is None or sse < best[0]:
                best = (sse, popt)
        if best is not None:
            big_l, k, x0, b = (float(v) for v in best[1])
            return {"L": big_l, "k": k, "x0": x0, "b": b}, "sigmoid"
    if x.size >= 2 and np.ptp(x) > 0:
        slope, intercept = np.polyfit(x, y, 1)
        return {"slope": float(slope), "intercept": float(intercept)}, "linear"
    return {"intercept": float(np.mean(y))}, "constant"


def fit(size_bytes: np.ndarray, time_s: np.ndarray, factor: float) -> dict:
    order = np.argsort(size_bytes, kind="stable")
    size = np.asarray(size_bytes, dtype=float)[order]
    time = np.asarray(time_s, dtype=float)[order]
    x = np.log2(size)
    busbw = size * factor / time
    ln_idx, sats_idx = turning_indices(time, busbw)
    step = float(np.median(np.diff(x))) if x.size > 1 else 1.0
    sats_log2 = float(x[sats_idx]) if sats_idx < x.size else float(x[-1] + (sats_idx - (x.size - 1)) * step)
    middle = slice(ln_idx, min(sats_idx, x.size - 1) + 1)
    curve, kind = _fit_middle(x[middle], np.log10(busbw[middle]))
    return {
        "busbw_factor": float(factor),
        "overhead_s": float(time[ln_idx]),
        "max_busbw_Bps": float(busbw.max()),
        "ln_p_log2_bytes": float(x[ln_idx]),
        "sats_p_log2_bytes": sats_log2,
        "fit": kind,
        **curve,
    }


def log10_busbw(params: dict, x: np.ndarray) -> np.ndarray:
    """The middle region's bus bandwidth (B/s, log10) at log2 sizes x."""
    kind = params["fit"]
    if kind == "sigmoid":
        with np.errstate(over="ignore"):
            return _sigmoid(x, params["L"], params["k"], params["x0"], params["b"])
    if kind == "linear":
        return params["slope"] * x + params["intercept"]
    return np.full_like(x, params["intercept"])


def predict(params: dict, size_bytes: np.ndarray) -> np.ndarray:
    size = np.asarray(size_bytes, dtype=float)
    x = np.log2(size)
    factor = params["busbw_factor"]
    middle = size * factor / np.power(10.0, log10_busbw(params, x))
    saturated = size * factor / params["max_busbw_Bps"] + params["overhead_s"]
    flat = np.full_like(size, params["overhead_s"])
    return np.where(x < params["ln_p_log2_bytes"], flat, np.where(x > params["sats_p_log2_bytes"], saturated, middle))
