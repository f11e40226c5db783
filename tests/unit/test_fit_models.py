"""The three models, the error measures and the leave-one-out choice."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.comm import fit_alpha_beta, fit_sigmoid, fit_table
from paraplan.comm.fit_errors import GMAE_EPS, gmae, histogram_pct, summarize
from paraplan.comm.fit_sweep import fit_sweep, heldout_errors
from paraplan.comm.log_common import rows_frame
from paraplan.comm.nccl_tests import read_nccl_tests

SIZES = 2.0 ** np.arange(3, 31)  # 8 B .. 1 GiB


def test_gmae_definition():
    assert gmae(np.zeros(4)) == pytest.approx(GMAE_EPS)
    # exp(mean(log(e + eps))): the geometric mean of 0.1 and 0.4 (plus eps)
    assert gmae(np.array([0.1, 0.4])) == pytest.approx(np.sqrt((0.1 + GMAE_EPS) * (0.4 + GMAE_EPS)))
    s = summarize(np.array([0.1, 0.3]))
    assert (s.mean_abs_rel_err, s.std_abs_rel_err, s.n_points) == (pytest.approx(0.2), pytest.approx(np.sqrt(0.02)), 2)
    counts, edges = histogram_pct(np.array([0.01, 0.07, 9.0]))
    assert edges[1] == 5.0 and counts[0] == 1 and counts[1] == 1 and counts[-1] == 1


def test_alpha_beta_recovers_a_synthetic_sweep():
    # ring all_reduce over 8 ranks: factor 2(n-1)/n = 1.75, alpha 12 us, bus bandwidth 80 GB/s
    factor, alpha, beta = 1.75, 12e-6, 80e9
    times = alpha + SIZES * factor / beta
    params = fit_alpha_beta.fit(SIZES, times, factor)
    assert params["alpha_s"] == pytest.approx(alpha, rel=0.01)
    assert params["beta_Bps"] == pytest.approx(beta, rel=0.01)
    # with +-3% alternating noise the relative-error fit still lands within 3%
    noisy = times * (1 + 0.03 * (-1) ** np.arange(SIZES.size))
    params = fit_alpha_beta.fit(SIZES, noisy, factor)
    assert params["alpha_s"] == pytest.approx(alpha, rel=0.03)
    assert params["beta_Bps"] == pytest.approx(beta, rel=0.03)


def test_table_is_exact_on_a_power_law_and_interpolates_monotonically():
    times = 3e-9 * SIZES**0.8
    params = fit_table.fit(SIZES, times, 1.0)
    assert fit_table.predict(params, SIZES) == pytest.approx(times, rel=1e-9)
    # a straight line in log-log: held-out predictions are exact too
    assert heldout_errors("table", SIZES, times, 1.0).max() < 1e-9
    between = fit_table.predict(params, np.sqrt(SIZES[:-1] * SIZES[1:]))
    assert np.all(np.diff(between) > 0)


def test_sigmoid_converges_where_the_naive_fit_fails(data_dir):
    """08 (rccl alltoall on MI355X): Lin et al.'s unbounded dogbox fit exceeds its
    evaluation budget on the middle region; the bounded multi-start fit converges."""
    from scipy.optimize import curve_fit

    frame = rows_frame(read_nccl_tests(data_dir / "nccl-tests/08_mi355x_vultr_1x8_rccl_alltoall.txt").rows)
    sizes = frame["size_bytes"].to_numpy(float)
    times = frame["time_us"].to_numpy(float) * 1e-6
    busbw = sizes * 0.875 / times
    ln, sats = fit_sigmoid.turning_indices(times, busbw)
    assert (ln, sats) == (15, 21)  # 4 MiB, and two points past the end of the sweep
    middle = slice(ln, min(sats, sizes.size - 1) + 1)

    def sigmoid(x, big_l, k, x0, b):
        return big_l / (1 + np.exp(-k * (x - x0))) + b

    with pytest.raises(RuntimeError, match="maximum number of function evaluations"), np.errstate(all="ignore"):
        curve_fit(sigmoid, np.log2(sizes[middle]), np.log10(busbw[middle] / 1e9), method="dogbox")
    params = fit_sigmoid.fit(sizes, times, 0.875)
    assert params["fit"] == "sigmoid"
    errors = np.abs(fit_sigmoid.predict(params, sizes) - times) / times
    assert gmae(errors) < 0.06
    assert params["max_busbw_Bps"] == pytest.approx(322.22e9, rel=1e-3)


@pytest.mark.parametrize(
    "times",
    [
        np.full(SIZES.size, 5e-5),  # flat: latency only
        1e-5 + SIZES / 1e9,  # plain alpha-beta
        np.abs(np.random.default_rng(3).normal(1e-4, 5e-5, SIZES.size)) + 1e-6,  # noise
        np.r_[np.full(10, 2e-5), 2e-5 * 1.7 ** np.arange(SIZES.size - 10)],  # kink
    ],
    ids=["flat", "alpha_beta", "noise", "kink"],
)
def test_sigmoid_never_crashes(times):
    for n in (2, 3, 5, SIZES.size):
        params = fit_sigmoid.fit(SIZES[:n], times[:n], 1.75)
        predicted = fit_sigmoid.predict(params, SIZES[:n])
        assert np.all(np.isfinite(predicted)) and np.all(predicted > 0)
        assert params["fit"] in ("sigmoid", "linear", "constant")


def test_fit_sweep_chooses_the_lowest_heldout_gmae():
    factor, alpha, beta = 1.75, 12e-6, 80e9
    times = alpha + SIZES * factor / beta
    entries = fit_sweep("all_reduce", 8, 1, SIZES, times)
    assert [e.model for e in entries] == ["alpha_beta", "sigmoid_bw", "table"]
    assert sum(e.chosen for e in entries) == 1
    chosen = next(e for e in entries if e.chosen)
    assert chosen.heldout_gmae == min(e.heldout_gmae for e in entries)
    by_model = {e.model: e for e in entries}
    assert by_model["alpha_beta"].heldout_gmae < 1e-3  # exact model: only the GMAE epsilon
    assert len(by_model["table"].heldout_rel_errors) == SIZES.size - 2
    assert by_model["table"].gmae == pytest.approx(GMAE_EPS)  # interpolates every point


def test_two_point_sweep_chooses_a_model_and_one_point_is_refused():
    entries = fit_sweep("broadcast", 2, 1, np.array([1e3, 1e6]), np.array([1e-5, 1e-4]))
    chosen = next(e for e in entries if e.chosen)
    assert chosen.model == "alpha_beta" and np.isnan(chosen.heldout_gmae)
    with pytest.raises(ValueError, match="at least 2 distinct sizes"):
        fit_sweep("broadcast", 2, 1, np.array([1e3, 1e3]), np.array([1e-5, 2e-5]))


@pytest.mark.parametrize("seed", range(4))
def test_rough_sweeps_fit_and_predict_finite_times(seed):
    """Congested, protocol-switching, flat and decreasing sweeps of any length: every
    model fits without warnings and the comm model predicts finite positive times
    inside, outside and beyond the measured world size."""
    import json
    import warnings

    from paraplan.comm.model import FittedCommModel, fits_document
    from paraplan.core import Group

    rng = np.random.default_rng(seed)
    for case in range(6):
        n = int(rng.integers(2, 30))
        sizes = 2.0 ** np.arange(4, 4 + n)
        base = rng.uniform(1e-6, 1e-3) + sizes / rng.uniform(1e7, 1e12)
        times = [
            base * rng.lognormal(0, 0.5, n),  # congested network
            base * np.where(sizes > sizes[n // 2], 3.0, 1.0),  # protocol switch
            np.full(n, 1e-4),  # flat
            base[::-1].copy(),  # decreasing
            base * (1 + 0.5 * np.sin(np.arange(n))),  # wavy
            np.maximum(base + rng.normal(0, base.mean(), n), 1e-7),  # additive noise
        ][case]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            entries = fit_sweep("all_gather", 4, 1, sizes, times)
        model = FittedCommModel.from_dict(json.loads(json.dumps(fits_document(entries), allow_nan=False)))
        for group in (Group(4, 1), Group(16, 2)):
            predicted = [model.time_s("all_gather", q, group) for q in np.geomspace(1, 2**40, 25)]
            assert np.all(np.isfinite(predicted)) and min(predicted) > 0
