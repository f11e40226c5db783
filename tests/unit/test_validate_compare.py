"""Validation arithmetic: step-time statistics, rel_err, the CSV columns of DESIGN.md,
the MLflow metric names, and the prediction's strategies and correction."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.core import ConstantBandwidthModel, Group, LayerProfile, ModelProfile, StrategyError
from paraplan.validate import (
    COLUMNS,
    Measurement,
    rel_err,
    strategy_metrics,
    summarise,
    validation_metrics,
    validation_table,
)
from paraplan.validate.predict import PredictionSetup, both_busy_fraction, tp_unused_backward_allreduce_s
from paraplan.validate.strategies import strategy_for


def test_rel_err_is_predicted_over_measured_minus_one():
    assert rel_err(1.1, 1.0) == pytest.approx(0.1)
    assert rel_err(0.5, 2.0) == pytest.approx(-0.75)
    with pytest.raises(ValueError):
        rel_err(1.0, 0.0)


def test_each_step_counts_the_slowest_rank():
    m = summarise("dp", [[1.0, 5.0, 3.0, 2.0, 4.0], [2.0, 1.0, 3.5, 1.0, 1.0]])
    assert m.step_times_s == (2.0, 5.0, 3.5, 2.0, 4.0)
    assert m.median_s == 3.5
    assert m.p10_s == pytest.approx(np.percentile([2, 5, 3.5, 2, 4], 10))
    assert m.p90_s == pytest.approx(4.6)  # numpy linear: 4 + 0.6 x (5 - 4)
    with pytest.raises(ValueError, match="no timed steps"):
        Measurement("dp", ())
    with pytest.raises(ValueError, match="> 0"):
        Measurement("dp", (1.0, float("nan")))


def test_table_has_the_design_columns_in_order():
    measured = {"dp": Measurement("dp", (0.1, 0.2, 0.3)), "tp2": Measurement("tp2", (0.4, 0.4, 0.4))}
    table = validation_table(measured, {"tp2": 0.3, "dp": 0.25})
    assert tuple(table.columns) == COLUMNS == (
        "strategy", "measured_s", "measured_p10_s", "measured_p90_s", "predicted_s", "rel_err")
    assert list(table["strategy"]) == ["dp", "tp2"]
    assert table["rel_err"].tolist() == pytest.approx([0.25, -0.25])
    metrics = validation_metrics(table)
    assert metrics == pytest.approx({"median_abs_rel_err": 0.25, "max_abs_rel_err": 0.25})
    # one child run per strategy, the same metric names in each
    per_strategy = strategy_metrics(table)
    assert list(per_strategy) == ["dp", "tp2"]
    assert per_strategy["dp"]["measured_s"] == pytest.approx(0.2)
    assert per_strategy["tp2"]["rel_err"] == pytest.approx(-0.25)
    assert set(per_strategy["dp"]) == set(per_strategy["tp2"]) == set(COLUMNS[1:])
    with pytest.raises(ValueError, match="no prediction for strategy 'tp2'"):
        validation_table(measured, {"dp": 0.2})


SETUP = PredictionSetup(global_batch_size=32, num_microbatches=4, pipeline_boundary=2, tp_allreduces=(0, 1, 0, 1))


def test_strategies_map_to_the_simulator():
    assert strategy_for("dp", 4, 2).data_parallel_size == 2
    assert strategy_for("dp", 4, 2).gradient_sync == "end"
    assert strategy_for("dp_overlap", 4, 2).gradient_sync == "overlap"
    assert strategy_for("tp2", 4, 2).tensor_model_parallel_size == 2
    pp = strategy_for("pp_gpipe", SETUP.num_microbatches, SETUP.pipeline_boundary)
    assert (pp.pipeline_model_parallel_size, pp.num_microbatches, pp.schedule, pp.stage_boundaries) == (
        2, 4, "gpipe", (2,))
    assert strategy_for("pp_1f1b", 4, 2).schedule == "1f1b"
    with pytest.raises(StrategyError, match="unknown strategy 'zb'"):
        strategy_for("zb", 4, 2)


def test_tp_correction_removes_the_first_pairs_backward_allreduce():
    layer = LayerProfile("l", 1e-3, 2e-3, activation_bytes=4096.0, param_bytes=1e6)
    profile = ModelProfile("mlp", 16, (layer,) * 4)
    comm = ConstantBandwidthModel(1e9, 1e9, intra_latency_s=1e-5)
    # batch 32 doubles the profile's 4096 activation bytes
    expected = comm.time_s("all_reduce", 8192.0, Group(2))
    assert tp_unused_backward_allreduce_s(profile, comm, SETUP) == pytest.approx(expected)
    gpt = PredictionSetup(32, 4, 2, (0, 2, 2, 0))  # a block's input comes from the embedding
    assert tp_unused_backward_allreduce_s(profile, comm, gpt) == 0.0


def _timeline(device, stream, start, end):
    from paraplan.core import Timeline

    n = len(device)
    return Timeline(np.array(device), np.array(stream, dtype=np.int8), np.zeros(n, dtype=np.int8),
                    np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32), np.array(start, float),
                    np.array(end, float), step_time_s=max(end), batch_size=1, num_devices=2,
                    speedup=1.0, bubble_fraction=0.0)


def test_both_busy_fraction_reads_the_overlap_of_the_compute_streams():
    # rank 0 computes [0, 2], rank 1 [1, 3]: 1 s of 2 together
    assert both_busy_fraction(_timeline([0, 1], [0, 0], [0, 1], [2, 3])) == pytest.approx(0.5)
    # identical work (data parallel): always together; communication (stream 1) does not count
    tl = _timeline([0, 1, 0, 1], [0, 0, 1, 1], [0, 0, 1, 1], [1, 1, 5, 5])
    assert both_busy_fraction(tl) == pytest.approx(1.0)
    # a 2-stage pipeline's fill and drain: F0 on 0, then F1 on 0 beside F0 on 1, then F1 on 1
    tl = _timeline([0, 0, 1, 1], [0, 0, 0, 0], [0, 1, 1, 2], [1, 2, 2, 3])
    assert both_busy_fraction(tl) == pytest.approx(0.5)


def test_saturated_cpu_predicts_overlap_as_serial_per_layer_allreduces():
    from paraplan.clusters import load_cluster
    from paraplan.validate.predict import predict_step_times

    layer = LayerProfile("l", 1e-3, 2e-3, activation_bytes=4096.0, param_bytes=1e6)
    profile = ModelProfile("mlp", 32, (layer,) * 4)
    latency_s = 1e-4
    comm = ConstantBandwidthModel(1e9, 1e9, intra_latency_s=latency_s)
    cluster = load_cluster("local-cpu")
    free = PredictionSetup(32, 4, 2, (0, 1, 0, 1))
    busy = PredictionSetup(32, 4, 2, (0, 1, 0, 1), comm_uses_compute_cores=True)
    t_free = predict_step_times(profile, cluster, comm, ["dp", "dp_overlap"], free)
    t_busy = predict_step_times(profile, cluster, comm, ["dp", "dp_overlap"], busy)
    # no overlap: compute (b = 16 per rank) then one ring all-reduce of 4 MB over 2 ranks
    assert t_free["dp"] == pytest.approx(4 * 1.5e-3 + 2 * latency_s + 4e6 / 1e9)
    assert t_free["dp_overlap"] < t_free["dp"]
    # 4 per-layer all-reduces in series: the same bytes, 3 more latencies of 2 alpha each
    assert t_busy["dp_overlap"] == pytest.approx(t_free["dp"] + 3 * 2 * latency_s)
    # contention x 2 while both ranks compute: data parallel ranks always compute together
    t_slow = predict_step_times(profile, cluster, comm, ["dp"], free, compute_factor=2.0)
    assert t_slow["dp"] == pytest.approx(2 * 4 * 1.5e-3 + 2 * latency_s + 4e6 / 1e9)


def test_tensor_parallel_profile_keeps_replicated_layers_whole_and_splits_cpu_fixed_time():
    from paraplan.validate.predict import tensor_parallel_profile

    layer = LayerProfile("l", 3e-3, 6e-3, activation_bytes=4096.0, param_bytes=1e6,
                         fwd_fixed_s=1e-3, bwd_fixed_s=2e-3)
    profile = ModelProfile("m", 32, (layer,) * 3)
    setup = PredictionSetup(32, 4, 1, (0, 1, 0), tp_split=(True, True, False), tp_splits_fixed_time=True)
    tp = tensor_parallel_profile(profile, setup)
    # what the simulator computes per rank at batch b: fixed + (t - fixed) x (b / B) / 2
    def per_rank_fwd(la, b):
        return la.fwd_fixed_s + (la.fwd_s - la.fwd_fixed_s) * (b / 32) / 2

    for b in (16, 32):
        # split layer: all of it halves; replicated layer: all of it stays
        assert per_rank_fwd(tp.layers[0], b) == pytest.approx((1e-3 + 2e-3 * b / 32) / 2)
        assert per_rank_fwd(tp.layers[2], b) == pytest.approx(1e-3 + 2e-3 * b / 32)
    gpu = tensor_parallel_profile(profile, PredictionSetup(32, 4, 1, (0, 1, 0), tp_split=(True, True, False)))
    assert gpu.layers[0] == layer  # a GPU's fixed (launch) time stays whole: the simulator's rule


def test_pipeline_backward_is_charged_its_average_gradient_accumulation():
    from paraplan.validate.predict import accumulation_profile

    layer = LayerProfile("l", 1e-3, 2e-3, activation_bytes=4096.0, param_bytes=4e6)
    profile = ModelProfile("m", 32, (layer,) * 2)
    acc = accumulation_profile(profile, num_microbatches=4, mem_bandwidth_Bps=20e9)
    # 3 of 4 micro-batches add 4 MB into 4 MB: 3 x 4e6 B / 20e9 B/s = 0.6 ms each
    extra_s = 3 / 4 * 0.6e-3
    for b in (8, 32):  # the same at every micro-batch size
        assert acc.bwd_s_at(b)[0] == pytest.approx(profile.bwd_s_at(b)[0] + extra_s)
    assert acc.fwd_s_at(8)[0] == profile.fwd_s_at(8)[0]
    assert accumulation_profile(profile, 1, 20e9) is profile


def test_tp2_charges_each_activation_allreduce_its_measured_mean():
    from dataclasses import replace

    from paraplan.clusters import load_cluster
    from paraplan.validate.predict import MeasuredAllReduce, predict_step_times

    layer = LayerProfile("l", 1e-3, 2e-3, activation_bytes=4096.0, param_bytes=1e6)
    profile = ModelProfile("mlp", 32, (layer,) * 4)
    comm = ConstantBandwidthModel(1e9, 1e9, intra_latency_s=1e-4)
    cluster = load_cluster("local-cpu")
    fitted = PredictionSetup(32, 4, 2, (0, 1, 0, 1))
    mean_s = 3e-3
    measured = replace(fitted, tp_allreduce_s=((4096.0, mean_s),))
    fit_s = comm.time_s("all_reduce", 4096.0, Group(2))
    # the wrapper answers only the measured size on the run's 2 ranks, the fit otherwise
    wrapped = MeasuredAllReduce(comm, measured.tp_allreduce_s)
    assert wrapped.time_s("all_reduce", 4096.0, Group(2)) == mean_s
    assert wrapped.time_s("all_reduce", 8192.0, Group(2)) == comm.time_s("all_reduce", 8192.0, Group(2))
    assert wrapped.time_s("all_gather", 4096.0, Group(2)) == comm.time_s("all_gather", 4096.0, Group(2))
    names = ["dp", "tp2"]
    before = predict_step_times(profile, cluster, comm, names, fitted)
    after = predict_step_times(profile, cluster, comm, names, measured)
    # two pairs: 2 forward + 2 backward all-reduces, less the first pair's backward one
    assert after["tp2"] == pytest.approx(before["tp2"] + 3 * (mean_s - fit_s))
    assert after["dp"] == before["dp"]
