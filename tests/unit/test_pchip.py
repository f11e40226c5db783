"""paraplan's PCHIP coefficients are scipy.interpolate.PchipInterpolator's, bit for bit
(the table comm model predicts with them; paraplan.comm.pchip says why it has its own)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.interpolate import PchipInterpolator

from paraplan.comm.pchip import coefficients

REPO = Path(__file__).resolve().parents[2]


def _scipy(xs: list[float], ys: list[float]) -> list[list[float]]:
    return PchipInterpolator(np.array(xs), np.array(ys)).c.T.tolist()


def test_a_straight_line_is_its_own_slope_and_intercept():
    assert coefficients([0.0, 1.0, 3.0], [1.0, 3.0, 7.0]) == [[0.0, 0.0, 2.0, 1.0], [0.0, 0.0, 2.0, 3.0]]


def test_a_peak_has_a_flat_derivative_there_and_three_point_ends():
    # slopes +1 then -1 change sign at the middle knot: its derivative is 0; at the first
    # knot ((2 + 1) x 1 - 1 x (-1)) / 2 = 2, not above 3 x 1; [c1, c0] = [derivative, value]
    first, second = coefficients([0.0, 1.0, 2.0], [0.0, 1.0, 0.0])
    assert first[2:] == [2.0, 0.0]
    assert second[2:] == [0.0, 1.0]


@pytest.mark.parametrize("seed", range(60))
def test_equal_to_scipy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 40))
    x = np.cumsum(rng.uniform(0.01, 3.0, n))
    y = [np.cumsum(rng.uniform(0.0, 2.0, n)) - 30.0,  # increasing, as a measured time curve
         rng.normal(size=n) * 5.0,  # any shape
         np.round(rng.normal(size=n)),  # flat stretches: zero slopes
         ][seed % 3]
    assert coefficients(x.tolist(), y.tolist()) == _scipy(x.tolist(), y.tolist())


def test_equal_to_scipy_on_the_shipped_calibrations_tables():
    tables = [fit["params"] for path in sorted((REPO / "config/calibrations").glob("*.json"))
              for fit in (json.loads(path.read_text()).get("intra_node_comm") or {}).get("fits", [])
              if fit["model"] == "table"]
    assert tables  # a100-vtrain's all_reduce
    for params in tables:
        xs, ys = params["log2_size_bytes"], params["log2_time_s"]
        assert coefficients(xs, ys) == _scipy(xs, ys)
