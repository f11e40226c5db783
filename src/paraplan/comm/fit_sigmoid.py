"""The three-region "sigmoid bandwidth" model of Lin et al. (HiPC 2022), made robust.

With x = log2(size) and busbw = size x factor / time:
- below `ln_p` (latency still flat): t = overhead;
- between `ln_p` and `sats_p`: log10(busbw) = L / (1 + exp(-k (x - x0))) + b and
  t = size x factor / busbw;
- above `sats_p` (bandwidth saturated): t = size x factor / max_busbw + overhead.

Turning points follow the original (docs/comm-fitting.md): `ln_p` is the point
before the first index >= i0 whose relative central slope of latency exceeds 0.1,
`sats_p` two points after the last one whose busbw is below 95% of the peak.
`overhead` is the median latency of the flat region (the original takes the one point
at `ln_p`, which lets a single noisy size set every small size's time). Robustness
added here: i0 is 5 only for sweeps
long enough to have 5 flat points (n // 4 otherwise), the sigmoid parameters are
bounded, the search starts from the best point of a (k, x0) grid (L and b solved
in closed form there) with a generous evaluation budget, and
when the sigmoid cannot be fitted (too few points, no convergence, a non-finite
answer) the middle region falls back to a straight line in (x, log10 busbw), or a
constant. `params["fit"]` records which. The fit never raises for finite positive
input with at least two sizes.
"""

from __future__ import annotations

import warnings

import numpy as np

NAME = "sigmoid_bw"
FLAT_SLOPE = 0.1
SATURATION = 0.95
_MAX_EVALUATIONS = 4000


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


def _jacobian(x: np.ndarray, big_l: float, k: float, x0: float, b: float) -> np.ndarray:
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-k * (x - x0)))
    ds = s * (1.0 - s)
    return np.column_stack((s, big_l * ds * (x - x0), -big_l * ds * k, np.ones_like(x)))


def _grid_start(x: np.ndarray, y: np.ndarray, lower, upper) -> tuple[float, float, float, float]:
    """Best (L, k, x0, b) on a grid of (k, x0), with L >= 0 and b solved in closed
    form (the model is linear in them): a start that needs no luck."""
    ks = np.geomspace(max(lower[1], 0.02), upper[1], 24)
    x0s = np.linspace(lower[2], upper[2], 41)
    kk, xx = np.meshgrid(ks, x0s, indexing="ij")
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-kk[..., None] * (x - xx[..., None])))
    s_mean = s.mean(axis=-1)
    s_var = ((s - s_mean[..., None]) ** 2).sum(axis=-1)
    cov = ((s - s_mean[..., None]) * (y - y.mean())).sum(axis=-1)
    big_l = np.clip(np.where(s_var > 1e-12, cov / np.maximum(s_var, 1e-12), 0.0), lower[0], upper[0])
    b = np.clip(y.mean() - big_l * s_mean, lower[3], upper[3])
    sse = (((big_l[..., None] * s + b[..., None]) - y) ** 2).sum(axis=-1)
    i, j = np.unravel_index(int(np.argmin(sse)), sse.shape)
    return float(big_l[i, j]), float(kk[i, j]), float(xx[i, j]), float(b[i, j])


def _fit_middle(x: np.ndarray, y: np.ndarray) -> tuple[dict, str]:
    """Sigmoid (bounded, grid start, analytic Jacobian) through (x, log10 busbw),
    else a line, else a constant."""
    from scipy.optimize import OptimizeWarning, curve_fit  # here: predicting never imports scipy.optimize

    if x.size >= 4:
        span = float(y.max() - y.min())
        lower = (0.0, 1e-3, float(x.min()) - 8.0, float(y.min()) - 3.0)
        upper = (span + 3.0, 20.0, float(x.max()) + 8.0, float(y.max()) + 0.5)
        start = _grid_start(x, y, lower, upper)
        inside = [float(np.clip(v, lo + 1e-9, hi - 1e-9)) for v, lo, hi in zip(start, lower, upper, strict=True)]
        candidates = [np.array(inside)]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OptimizeWarning)
                warnings.simplefilter("ignore", RuntimeWarning)
                popt, _ = curve_fit(
                    _sigmoid, x, y, p0=start, bounds=(lower, upper), method="trf",
                    jac=_jacobian, max_nfev=_MAX_EVALUATIONS,
                )
            if np.all(np.isfinite(popt)):
                candidates.append(popt)
        except (RuntimeError, ValueError, FloatingPointError):
            pass  # the grid start is itself a bounded least-squares answer
        best = min(candidates, key=lambda p: float(np.sum((_sigmoid(x, *p) - y) ** 2)))
        if np.all(np.isfinite(best)):
            big_l, k, x0, b = (float(v) for v in best)
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
        "overhead_s": float(np.median(time[: ln_idx + 1])),
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
