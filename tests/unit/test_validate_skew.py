"""tp2's waiting at blocking all-reduces: the closed form of `validate.predict.skew_s`."""

import pytest

from paraplan.validate.predict import skew_s


def test_k_sync_points_wait_sqrt_k_times_half_the_whole_pass_drift():
    # 16 all-reduces, ranks 10 ms apart over the whole pass: sqrt(16) x 10 ms / 2
    assert skew_s(16, 0.010) == pytest.approx(0.020)
    # one sync point at the end of the pass waits half the mean difference: E[max(a, b)] - E[a]
    assert skew_s(1, 0.010) == pytest.approx(0.005)


def test_no_sync_points_or_no_drift_costs_nothing():
    assert skew_s(0, 0.010) == 0.0
    assert skew_s(16, 0.0) == 0.0
