"""paraplan's Spearman correlation is scipy.stats.spearmanr's number, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from paraplan.predict.rank_correlation import average_ranks, spearman


def test_ties_share_the_mean_of_their_ranks():
    assert average_ranks(np.array([3.0, 1.0, 3.0, 2.0, 3.0])).tolist() == [4.0, 1.0, 4.0, 2.0, 4.0]


def test_reversed_order_is_minus_one_and_one_swap_of_three_is_minus_a_half():
    assert spearman(np.array([1.0, 2.0, 3.0, 4.0]), np.array([8.0, 4.0, 2.0, 1.0])) == -1.0
    assert spearman(np.array([3.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0])) == -0.5


@pytest.mark.parametrize("seed", range(40))
def test_equals_scipy_to_the_last_bit(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    x = rng.lognormal(size=n)
    y = x * rng.lognormal(sigma=0.3, size=n)
    if seed % 2:  # ties: times rounded as tables print them
        x, y = np.round(x, 1), np.round(y, 1)
    expected = float(spearmanr(x, y).statistic)
    assert spearman(x, y) == expected or (math.isnan(expected) and math.isnan(spearman(x, y)))


@pytest.mark.parametrize(("x", "y"), [([1.0], [2.0]), ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]),
                                      ([1.0, float("nan"), 3.0], [1.0, 2.0, 3.0])])
def test_undefined_is_nan(x, y):
    assert math.isnan(spearman(np.array(x), np.array(y)))
