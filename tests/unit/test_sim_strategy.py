"""One training step of D x T x P strategies: hand formulas with free or alpha-beta
communication."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.core import (
    Cluster,
    ConstantBandwidthModel,
    Device,
    LayerProfile,
    Link,
    ModelProfile,
    Strategy,
    StrategyError,
)
from paraplan.sim import default_tp_allreduces, simulate, simulate_pipeline

FWD_S, BWD_S, ACT_B, PARAM_B = 1e-3, 2e-3, 4e6, 16e6
PROFILE = ModelProfile(
    "mlp8", 32, tuple(LayerProfile(f"l{i}", FWD_S, BWD_S, ACT_B, PARAM_B) for i in range(8))
)
CLUSTER = Cluster("test", 2, 8, Device("acc", 1e14, 1e12, 80e9), Link(100e9, 5e-6), Link(10e9, 20e-6))
FREE = ConstantBandwidthModel(float("inf"), float("inf"))
ALPHA, BW = 5e-6, 100e9
AB = ConstantBandwidthModel(BW, 10e9, ALPHA, 20e-6)
COMPUTE_S = 8 * (FWD_S + BWD_S)  # the whole model at the profile batch


@pytest.mark.parametrize("d", [1, 2, 4, 8, 16])
def test_data_parallel_free_comm_speedup_is_d(d):
    tl = simulate(PROFILE, CLUSTER, FREE, Strategy(data_parallel_size=d), 32 * d)
    assert tl.step_time_s == pytest.approx(COMPUTE_S)
    assert tl.speedup == pytest.approx(d)
    assert tl.throughput == pytest.approx(32 * d / COMPUTE_S)
    assert tl.num_devices == d


@pytest.mark.parametrize("d", [2, 4, 8])
def test_data_parallel_alpha_beta_matches_hand_formula(d):
    """No overlap: compute, then one ring all-reduce of all gradients:
    2 (D - 1) alpha + 2 (D - 1) / D x bytes / B (inside one node)."""
    tl = simulate(PROFILE, CLUSTER, AB, Strategy(data_parallel_size=d), 32 * d)
    grads = 8 * PARAM_B
    assert tl.step_time_s == pytest.approx(COMPUTE_S + 2 * (d - 1) * ALPHA + 2 * (d - 1) / d * grads / BW)


def test_data_parallel_across_nodes_uses_inter_tier():
    tl = simulate(PROFILE, CLUSTER, AB, Strategy(data_parallel_size=16), 32 * 16)
    assert tl.step_time_s == pytest.approx(COMPUTE_S + 30 * 20e-6 + 30 / 16 * 8 * PARAM_B / 10e9)


def test_overlapped_buckets_hide_all_but_the_last():
    """Buckets of one layer (16 MB): each all-reduce starts when its layer's gradient
    is ready in the backward; only the last bucket (layer 0) is exposed if the
    link keeps up: step = compute + one bucket's all-reduce."""
    d = 4
    bucket = 2 * (d - 1) * ALPHA + 2 * (d - 1) / d * PARAM_B / BW  # 0.27 ms < 2 ms backward
    tl = simulate(PROFILE, CLUSTER, AB, Strategy(data_parallel_size=d, gradient_sync="overlap"), 32 * d,
                  grad_bucket_bytes=PARAM_B)
    assert tl.step_time_s == pytest.approx(COMPUTE_S + bucket)
    no_overlap = simulate(PROFILE, CLUSTER, AB, Strategy(data_parallel_size=d), 32 * d)
    assert no_overlap.step_time_s == pytest.approx(COMPUTE_S + 8 * bucket - 7 * 2 * (d - 1) * ALPHA)


def test_tensor_parallel_allreduce_counts():
    """T = 2 halves compute and adds one activation all-reduce per 2-layer pair in
    forward and one in backward: 8 layers -> 4 + 4 all-reduces."""
    t = 2
    ar = 2 * (t - 1) * ALPHA + 2 * (t - 1) / t * ACT_B / BW
    tl = simulate(PROFILE, CLUSTER, AB, Strategy(tensor_model_parallel_size=t), 32)
    assert default_tp_allreduces(8).sum() == 4
    assert tl.step_time_s == pytest.approx(COMPUTE_S / t + 8 * ar)
    blocks = simulate(PROFILE, CLUSTER, AB, Strategy(tensor_model_parallel_size=t), 32, tp_allreduces=[2] * 8)
    assert blocks.step_time_s == pytest.approx(COMPUTE_S / t + 32 * ar)


def test_pipeline_matches_bare_pipeline_with_free_comm():
    """P = 4, M = 8, two layers per stage: per-stage t_f = 2 x FWD_S / 8 per micro-batch."""
    p, m = 4, 8
    tl = simulate(PROFILE, CLUSTER, FREE, Strategy(pipeline_model_parallel_size=p, num_microbatches=m), 32)
    tf, tb = 2 * FWD_S / m, 2 * BWD_S / m
    assert tl.step_time_s == pytest.approx((m + p - 1) * (tf + tb))
    bare = simulate_pipeline("1f1b", p, m, tf, tb)
    assert tl.bubble_fraction == pytest.approx(bare.bubble_fraction)
    assert tl.speedup == pytest.approx(COMPUTE_S / tl.step_time_s)


def test_pipeline_transfer_uses_send_recv_on_the_link():
    """Stages on different nodes (4 devices per node, P = 2 x 4 replicas) pay the inter
    tier for each boundary transfer: GPipe adds 2 x (alpha + bytes / B)."""
    cluster = CLUSTER.with_shape(2, 4)
    m, d = 4, 4
    s = Strategy(pipeline_model_parallel_size=2, data_parallel_size=d, num_microbatches=m, schedule="gpipe")
    tl = simulate(PROFILE, cluster, AB, s, 32 * d)
    tf, tb = 4 * FWD_S / m, 4 * BWD_S / m
    send = 20e-6 + ACT_B / m / 10e9
    grads = 2 * (d - 1) * ALPHA + 2 * (d - 1) / d * 4 * PARAM_B / BW
    assert tl.step_time_s == pytest.approx((m + 1) * (tf + tb) + 2 * send + grads)


def test_memory_per_device():
    """1F1B stage 0 of 4 holds p = 4 micro-batches of its 2 layers' activations, plus
    params, grads and 2x optimizer state; 2BW keeps a second weight copy."""
    p, m = 4, 8
    tl = simulate(PROFILE, CLUSTER, FREE, Strategy(pipeline_model_parallel_size=p, num_microbatches=m), 32)
    act = 2 * ACT_B / m
    params = 2 * PARAM_B
    assert tl.peak_mem_bytes[0] == pytest.approx(params * 4 + 4 * act)
    assert tl.peak_mem_bytes[3] == pytest.approx(params * 4 + 1 * act)
    two = simulate(PROFILE, CLUSTER, FREE,
                   Strategy(pipeline_model_parallel_size=p, num_microbatches=m, schedule="2bw"), 32)
    assert two.peak_mem_bytes[0] == pytest.approx(params * 5 + 4 * act)


def test_two_bw_step_is_steady_state():
    p, m = 4, 8
    tl = simulate(PROFILE, CLUSTER, FREE, Strategy(pipeline_model_parallel_size=p, num_microbatches=m, schedule="2bw"),
                  32)
    assert tl.step_time_s == pytest.approx(m * 2 * (FWD_S + BWD_S) / m)
    assert tl.bubble_fraction == pytest.approx(0.0, abs=1e-12)


def test_hybrid_events_cover_every_device():
    s = Strategy(data_parallel_size=2, tensor_model_parallel_size=2, pipeline_model_parallel_size=2, num_microbatches=4,
                 schedule="zb_h1")
    tl = simulate(PROFILE, CLUSTER, AB, s, 64)
    assert sorted(np.unique(tl.device).tolist()) == list(range(8))
    assert len(tl.peak_mem_bytes) == 8
    assert 1 < tl.speedup < 8


@pytest.mark.parametrize(
    ("strategy", "batch", "message"),
    [
        (Strategy(data_parallel_size=32), 32 * 32, "needs 32 devices"),
        (Strategy(pipeline_model_parallel_size=4, num_microbatches=2, schedule="2bw"), 32,
         "4 stages > 2 micro-batches"),
        (Strategy(data_parallel_size=4, num_microbatches=16), 32, "samples per micro-batch per replica"),
        (Strategy(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=8, num_microbatches=2,
                  schedule="interleaved_1f1b"), 32,
         "need at least 16 layers"),
        (Strategy(pipeline_model_parallel_size=2, placement=((0,), (0,))), 32, "distinct device ids"),
    ],
)
def test_impossible_strategies_say_why(strategy, batch, message):
    with pytest.raises(StrategyError, match=message):
        simulate(PROFILE, CLUSTER, AB, strategy, batch)


def test_iterations_repeat_flushed_steps():
    s1 = Strategy(pipeline_model_parallel_size=2, num_microbatches=4, data_parallel_size=2)
    s3 = Strategy(pipeline_model_parallel_size=2, num_microbatches=4, data_parallel_size=2, iterations=3)
    one = simulate(PROFILE, CLUSTER, AB, s1, 64)
    three = simulate(PROFILE, CLUSTER, AB, s3, 64)
    assert three.step_time_s == pytest.approx(one.step_time_s)
    assert three.num_events == 3 * one.num_events
    assert three.end_s.max() == pytest.approx(3 * one.step_time_s)
    assert three.microbatch.max() == 11 and three.iterations == 3


@pytest.mark.parametrize(("schedule", "v"), [("interleaved_1f1b", 2), ("zb_h1", 1), ("gpipe", 1)])
def test_schedules_in_simulate_match_bare_pipeline(schedule, v):
    """Free communication: simulate() equals the bare pipeline with per-chunk costs."""
    p, m = 2, 4
    s = Strategy(pipeline_model_parallel_size=p, num_microbatches=m, schedule=schedule,
                 virtual_pipeline_model_parallel_size=v)
    tl = simulate(PROFILE, CLUSTER, FREE, s, 32)
    per_chunk = 8 // (p * v)
    bare = simulate_pipeline(schedule, p, m, per_chunk * FWD_S / m, per_chunk * BWD_S / m, virtual_stages=v)
    assert tl.step_time_s == pytest.approx(bare.step_time_s)
