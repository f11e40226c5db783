"""Hockney alpha-beta: t = alpha + size x factor / beta, with `factor` the busbw
factor, so beta is a bus bandwidth (the per-link bandwidth of the ring algorithms).

Fitted to minimise the squared *relative* error sum((t_pred - t) / t)^2 with
alpha >= 0 and 1/beta >= 0: linear in (alpha, 1/beta), so it is a non-negative
least-squares problem with a unique answer; no iterations, no starting point.
Absolute error would let the largest sizes (9 orders of magnitude above the
smallest) decide everything.
"""

from __future__ import annotations

import numpy as np

NAME = "alpha_beta"
_MAX_BW_BPS = 1e18  # a flat sweep (no size dependence) fits 1/beta = 0


def fit(size_bytes: np.ndarray, time_s: np.ndarray, factor: float) -> dict:
    from scipy.optimize import nnls  # here: predicting from a fit never pays for importing scipy.optimize

    size = np.asarray(size_bytes, dtype=float)
    time = np.asarray(time_s, dtype=float)
    design = np.column_stack((1.0 / time, size * factor / time))
    scale = np.linalg.norm(design, axis=0)
    scale[scale == 0] = 1.0
    solution, _ = nnls(design / scale, np.ones_like(time))
    alpha_s, inv_beta = solution / scale
    beta = 1.0 / inv_beta if inv_beta > 1.0 / _MAX_BW_BPS else _MAX_BW_BPS
    return {"alpha_s": float(alpha_s), "beta_Bps": float(beta), "busbw_factor": float(factor)}


def predict(params: dict, size_bytes: np.ndarray) -> np.ndarray:
    size = np.asarray(size_bytes, dtype=float)
    return params["alpha_s"] + size * params["busbw_factor"] / params["beta_Bps"]
