"""The cubic coefficients of a PCHIP curve (Fritsch and Butland's shape-preserving
piecewise cubic Hermite interpolation), for the `table` comm model's fast evaluation
in `paraplan.comm.model`.

Importing scipy.interpolate for them costs every command that reads a calibration
with a table fit (a100-vtrain) about 0.3 s of CPU. These are the same numbers as
`scipy.interpolate.PchipInterpolator(x, y).c`, to the last bit
(tests/unit/test_pchip.py compares them), so no prediction moves:

- slopes: delta_k = (y[k+1] - y[k]) / h_k with h_k = x[k+1] - x[k];
- derivative at an inside knot: 0 where the slopes on its two sides differ in sign
  or one is 0, else their weighted harmonic mean with weights w1 = 2 h_k + h_(k-1)
  (on delta_(k-1)) and w2 = h_k + 2 h_(k-1) (on delta_k);
- at an end knot: the three-point estimate ((2 h0 + h1) delta0 - h0 delta1) / (h0 + h1),
  0 where its sign is not delta0's, 3 delta0 where delta0 and delta1 differ in sign
  and it is larger than that; two knots: the one slope at both;
- on [x_k, x_(k+1)] the Hermite cubic c3 s^3 + c2 s^2 + c1 s + c0 in s = x - x_k.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _end_derivative(h0: float, h1: float, m0: float, m1: float) -> float:
    d = ((2 * h0 + h1) * m0 - h0 * m1) / (h0 + h1)
    if np.sign(d) != np.sign(m0):
        return 0.0
    if np.sign(m0) != np.sign(m1) and abs(d) > 3.0 * abs(m0):
        return 3.0 * m0
    return d


def derivatives(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The curve's slope at each knot (x increasing, at least two knots)."""
    h = x[1:] - x[:-1]
    m = (y[1:] - y[:-1]) / h
    if x.size == 2:
        return np.array([m[0], m[0]])
    w1 = 2 * h[1:] + h[:-1]
    w2 = h[1:] + 2 * h[:-1]
    flat = (np.sign(m[1:]) != np.sign(m[:-1])) | (m[1:] == 0) | (m[:-1] == 0)
    d = np.zeros_like(y)
    with np.errstate(divide="ignore", invalid="ignore"):
        harmonic = (w1 / m[:-1] + w2 / m[1:]) / (w1 + w2)  # 1 / the weighted harmonic mean
    d[1:-1][~flat] = 1.0 / harmonic[~flat]
    d[0] = _end_derivative(h[0], h[1], m[0], m[1])
    d[-1] = _end_derivative(h[-1], h[-2], m[-1], m[-2])
    return d


def coefficients(xs: Sequence[float], ys: Sequence[float]) -> list[list[float]]:
    """[c3, c2, c1, c0] of each interval between knots `xs` (increasing) with values `ys`."""
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    d = derivatives(x, y)
    h = x[1:] - x[:-1]
    m = (y[1:] - y[:-1]) / h
    t = (d[:-1] + d[1:] - 2 * m) / h
    return np.column_stack((t / h, (m - d[:-1]) / h - t, d[:-1], y[:-1])).tolist()
