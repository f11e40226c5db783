"""Validation arithmetic: step-time statistics, rel_err, the CSV columns of docs/design.md,
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
from paraplan.validate.predict import PredictionSetup, both_busy_fraction, predict_step_times, tp_backward_allreduces
from paraplan.validate.strategies import strategy_for


def test_rel_err_is_predicted_over_measured_minus_one():
    assert rel_err(1.1, 1.0) == pytest.approx(0.1)
    assert rel_err(0.5, 2.0) == pytest.approx(-0.75)
    with pytest.raises(ValueError, match=r"^measured time must be > 0, got 0\.0$"):
        rel_err(1.0, 0.0)


def test_each_step_counts_the_slowest_rank():
    m = summarise("dp", [[1.0, 5.0, 3.0, 2.0, 4.0], [2.0, 1.0, 3.5, 1.0, 1.0]])
    assert m.step_times_s == (2.0, 5.0, 3.5, 2.0, 4.0)
    assert m.median_s == 3.5
    assert m.p10_s == pytest.approx(np.percentile([2, 5, 3.5, 2, 4], 10))
    assert m.p90_s == pytest.approx(4.6)  # numpy linear: 4 + 0.6 x (5 - 4)
    with pytest.raises(ValueError, match=r"^strategy 'dp': no timed steps$"):
        Measurement("dp", ())
    with pytest.raises(ValueError, match=r"^strategy 'dp': step times must be finite and > 0$"):
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
    # one table row per strategy, the same metric names in each
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


def test_tp_backward_skips_the_first_pairs_input_allreduce():
    layer = LayerProfile("l", 1e-3, 2e-3, activation_bytes=4096.0, param_bytes=1e6)
    profile = ModelProfile("mlp", 16, (layer,) * 4)
    comm = ConstantBandwidthModel(1e9, 1e9, intra_latency_s=1e-5)
    assert tp_backward_allreduces(SETUP) == (0, 0, 0, 1)
    gpt = PredictionSetup(32, 4, 2, (0, 2, 2, 0))  # a block's input comes from the embedding
    assert tp_backward_allreduces(gpt) == (0, 2, 2, 0)
    # the step runs exactly one all-reduce of the first pair's output fewer than a run
    # whose data input needed its gradient; batch 32 doubles the profile's 4096 bytes
    from dataclasses import replace

    from paraplan.clusters import load_cluster

    cluster = load_cluster("local-cpu")
    with_grad = replace(SETUP, first_pair_input_needs_grad=True)
    skipped = predict_step_times(profile, cluster, comm, ["tp2"], SETUP)["tp2"]
    full = predict_step_times(profile, cluster, comm, ["tp2"], with_grad)["tp2"]
    assert full - skipped == pytest.approx(comm.time_s("all_reduce", 8192.0, Group(2)))


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


def test_tensor_parallelism_keeps_replicated_layers_whole_and_splits_cpu_fixed_time():
    from paraplan.clusters import load_cluster
    from paraplan.core import Strategy
    from paraplan.sim.strategy_sim import RunConditions, profile_execution

    layer = LayerProfile("l", 3e-3, 6e-3, activation_bytes=4096.0, param_bytes=1e6,
                         fwd_fixed_s=1e-3, bwd_fixed_s=2e-3)
    profile = ModelProfile("m", 32, (layer,) * 3)
    cluster = load_cluster("local-cpu")
    free = ConstantBandwidthModel(1e30, 1e30)
    no_comm = (0.0, 0.0, 0.0)

    def forward_s(batch, **conditions):
        built = profile_execution(profile, cluster, free, Strategy(tensor_model_parallel_size=2), batch,
                                  tp_allreduces=no_comm, conditions=RunConditions(**conditions))
        return float(built.model.costs.fwd_s[0])

    for b in (16, 32):
        # CPU: split layers halve all of their time, the replicated third layer keeps all of it
        cpu = forward_s(b, tp_split=(True, True, False), tp_splits_fixed_time=True)
        assert cpu == pytest.approx(2 * (1e-3 + 2e-3 * b / 32) / 2 + (1e-3 + 2e-3 * b / 32))
        # GPU: a split layer's fixed (launch) time stays whole
        gpu = forward_s(b, tp_split=(True, True, False))
        assert gpu == pytest.approx(2 * (1e-3 + 2e-3 * b / 32 / 2) + (1e-3 + 2e-3 * b / 32))
        assert forward_s(b) == pytest.approx(3 * (1e-3 + 2e-3 * b / 32 / 2))


def test_pipeline_backward_is_charged_its_average_gradient_accumulation():
    from paraplan.clusters import load_cluster
    from paraplan.core import Strategy
    from paraplan.sim.strategy_sim import RunConditions, profile_execution

    layer = LayerProfile("l", 1e-3, 2e-3, activation_bytes=4096.0, param_bytes=4e6)
    profile = ModelProfile("m", 32, (layer,) * 2)
    cluster = load_cluster("local-cpu")
    comm = ConstantBandwidthModel(1e9, 1e9)
    pipeline = Strategy(pipeline_model_parallel_size=2, num_microbatches=4)

    def backward_s(conditions):
        return profile_execution(profile, cluster, comm, pipeline, 32, conditions=conditions).model.costs.bwd_s

    # 3 of 4 micro-batches add 4 MB into 4 MB: 3 x 4e6 B / 20e9 B/s = 0.6 ms each, on average 3/4 of it
    extra_s = 3 / 4 * 0.6e-3
    charged = backward_s(RunConditions(accumulation_Bps=20e9))
    np.testing.assert_allclose(charged - backward_s(RunConditions()), extra_s)
    single = Strategy(pipeline_model_parallel_size=2, num_microbatches=1)
    built = profile_execution(profile, cluster, comm, single, 32, conditions=RunConditions(accumulation_Bps=20e9))
    np.testing.assert_allclose(built.model.costs.bwd_s, profile.bwd_s_at(32)[:1].sum())


def test_tp2_charges_each_activation_allreduce_its_measured_mean():
    from dataclasses import replace

    from paraplan.clusters import load_cluster
    from paraplan.validate.predict import MeasuredAllReduce

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
