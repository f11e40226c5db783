"""P3 gradient synchronisation (priority-based parameter propagation) in the simulator:
a hand-computed two-layer step, free and very slow networks in closed form, and P3
against the bucketed-overlap and no-overlap modes on the same inputs."""

from __future__ import annotations

from dataclasses import dataclass

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
from paraplan.core.timeline import KINDS, STREAMS
from paraplan.sim import simulate
from paraplan.sim.p3 import p3_comm_segments, p3_steady_state

CLUSTER = Cluster("test", 2, 8, Device("acc", 1e14, 1e12, 80e9), Link(100e9, 0.0), Link(10e9, 0.0))
FREE = ConstantBandwidthModel(float("inf"), float("inf"))


@dataclass(frozen=True)
class LinearAllReduce:
    """An all-reduce costs `s_per_byte` x bytes, whatever the group."""

    s_per_byte: float

    def time_s(self, collective: str, nbytes: float, group) -> float:
        return nbytes * self.s_per_byte


def _profile(fwd_ms, bwd_ms, param_bytes, pbs=32):
    return ModelProfile("m", pbs, tuple(LayerProfile(f"l{i}", f * 1e-3, b * 1e-3, 1e6, p)
                                        for i, (f, b, p) in enumerate(zip(fwd_ms, bwd_ms, param_bytes,
                                                                          strict=True))))


# two layers: F = (1, 1) ms, B = (2, 2) ms, all-reduce 2 ms (layer 0) and 6 ms (layer 1)
TWO = _profile([1, 1], [2, 2], [2e6, 6e6])
MS_PER_MB = LinearAllReduce(1e-9)


def test_p3_two_layer_step_by_hand():
    """The last backward starts at S = 2 ms: layer 1's gradient is ready at 4, layer 0's
    at 6. Layer 1's all-reduce runs 4-6, is preempted by layer 0's (6-8) and resumes
    8-12. The next forward runs layer 0 at 8-9 (after its all-reduce), layer 1 at 12-13
    (after its own): period 13 - 2 = 11 ms. Bucket-free overlap is FIFO: 4-10, 10-12,
    step 12 ms; no overlap: 6 + 8 = 14 ms."""
    s = Strategy(data_parallel_size=2, gradient_sync="p3")
    tl = simulate(TWO, CLUSTER, MS_PER_MB, s, 64)
    assert tl.step_time_s == pytest.approx(11e-3)
    assert tl.speedup == pytest.approx(12 / 11)
    assert tl.bubble_fraction == pytest.approx(1 - 6 / 11)
    assert tl.iterations == 2
    dev0 = tl.device == 0
    comm = dev0 & (tl.stream == STREAMS.index("comm"))
    assert (tl.kind[comm] == KINDS.index("allreduce")).all()
    first = comm & (tl.end_s <= 12e-3 + 1e-12)
    assert np.column_stack([tl.start_s[first], tl.end_s[first]]) == pytest.approx(
        np.array([[4, 6], [6, 8], [8, 12]]) * 1e-3)
    gated = dev0 & (tl.kind == KINDS.index("fwd")) & (tl.microbatch == 1)
    assert np.column_stack([tl.start_s[gated], tl.end_s[gated]]) == pytest.approx(
        np.array([[8, 9], [12, 13]]) * 1e-3)
    overlap = simulate(TWO, CLUSTER, MS_PER_MB, Strategy(data_parallel_size=2, gradient_sync="overlap"), 64,
                       grad_bucket_bytes=1)
    end = simulate(TWO, CLUSTER, MS_PER_MB, Strategy(data_parallel_size=2), 64)
    assert overlap.step_time_s == pytest.approx(12e-3)
    assert end.step_time_s == pytest.approx(14e-3)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_p3_gradient_accumulation_adds_whole_micro_steps(k):
    """Only the first forward of an iteration waits: the two-layer period plus k - 1
    micro-steps of F + B = 6 ms."""
    _, step = p3_steady_state(np.array([1.0, 1.0]), np.array([2.0, 2.0]), np.array([2.0, 6.0]), k, 3)
    assert step == pytest.approx(11 + (k - 1) * 6)


def test_p3_comm_segments_preempt_resume():
    """Layer 2 (ready at 0, 5 s) is preempted by layer 1 (ready at 1, 1 s), then by
    layer 0 (ready at 3, 1 s), and finishes last."""
    layer, start, end = p3_comm_segments(np.array([3.0, 1.0, 0.0]), np.array([1.0, 1.0, 5.0]))
    assert layer.tolist() == [2, 1, 2, 0, 2]
    assert np.column_stack([start, end]).tolist() == [[0, 1], [1, 2], [2, 3], [3, 4], [4, 7]]
    with pytest.raises(StrategyError, match="last layer to the first"):
        p3_comm_segments(np.array([0.0, 1.0]), np.array([1.0, 1.0]))


EIGHT = _profile([1, 3, 2, 1, 2, 1, 4, 1], [2, 5, 4, 3, 4, 2, 8, 2],
                 [4e6, 1e6, 16e6, 2e6, 8e6, 0.0, 64e6, 4e6])
COMPUTE_S = (15 + 30) * 1e-3  # the whole model at the profile batch


@pytest.mark.parametrize("d", [2, 4, 8, 16])
@pytest.mark.parametrize("k", [1, 4])
def test_p3_free_comm_speedup_is_d(d, k):
    s = Strategy(data_parallel_size=d, num_microbatches=k, gradient_sync="p3")
    tl = simulate(EIGHT, CLUSTER, FREE, s, 32 * d * k)
    assert tl.step_time_s == pytest.approx(k * COMPUTE_S)
    assert tl.speedup == pytest.approx(d)
    assert tl.bubble_fraction == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("s_per_byte", [1e-6, 1e-5, 1e-4])
def test_p3_comm_bound_period_approaches_total_allreduce(s_per_byte):
    """Every all-reduce of an iteration lies between its last backward and its next
    forward's last layer, so total all-reduce <= period <= total + compute; with the
    network 10^3-10^5 x slower than compute the period is the all-reduce time."""
    total = EIGHT.total_param_bytes * s_per_byte
    tl = simulate(EIGHT, CLUSTER, LinearAllReduce(s_per_byte), Strategy(data_parallel_size=16, gradient_sync="p3"), 512)
    compute = COMPUTE_S
    assert total <= tl.step_time_s <= total + compute
    assert tl.step_time_s / total == pytest.approx(1.0, abs=compute / total)


@pytest.mark.parametrize("bandwidth", [1e9, 1e10, 1e11, 1e12])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("d", [4, 16])
def test_p3_never_slower_than_overlap_or_end(bandwidth, k, d):
    """Latency-free ring all-reduces: P3 releases every layer no later than a bucket and
    moves the same bytes, and may run on into the next forward; so P3 <= overlap and
    P3 <= end (overlap <= end is not claimed: a bucket may wait for its last layer)."""
    comm = ConstantBandwidthModel(bandwidth, bandwidth / 10)
    steps = {}
    for mode in ("end", "overlap", "p3"):
        for bucket in (1.0, 10e6, 25e6):
            s = Strategy(data_parallel_size=d, num_microbatches=k, gradient_sync=mode)
            steps[mode, bucket] = simulate(EIGHT, CLUSTER, comm, s, 32 * d * k,
                                           grad_bucket_bytes=bucket).step_time_s
    p3 = steps["p3", 25e6]
    assert all(p3 == pytest.approx(steps["p3", b]) for b in (1.0, 10e6))  # P3 has no buckets
    assert p3 <= steps["end", 25e6] * (1 + 1e-12)
    for b in (1.0, 10e6, 25e6):
        assert p3 <= steps["overlap", b] * (1 + 1e-12)


def test_p3_timeline_repeats_the_period():
    s = Strategy(data_parallel_size=4, num_microbatches=2, gradient_sync="p3", iterations=4)
    comm = ConstantBandwidthModel(1e9, 1e8)
    tl = simulate(EIGHT, CLUSTER, comm, s, 256)
    two = simulate(EIGHT, CLUSTER, comm, Strategy(data_parallel_size=4, num_microbatches=2, gradient_sync="p3"), 256)
    assert tl.iterations == 4 and tl.step_time_s == pytest.approx(two.step_time_s)
    assert sorted(np.unique(tl.device).tolist()) == [0, 1, 2, 3]
    assert tl.microbatch.max() == 7
    dev0 = tl.device == 0
    bwd_end = np.sort(tl.end_s[dev0 & (tl.kind == KINDS.index("bwd")) & (tl.microbatch % 2 == 1)])
    assert np.diff(bwd_end) == pytest.approx(np.full(3, tl.step_time_s))
    for stream in ("compute", "comm"):  # one op at a time on each stream
        sel = dev0 & (tl.stream == STREAMS.index(stream))
        order = np.argsort(tl.start_s[sel], kind="stable")
        assert (tl.start_s[sel][order][1:] >= tl.end_s[sel][order][:-1] - 1e-12).all()


def test_gradient_sync_names():
    assert Strategy().gradient_sync == "end"
    assert Strategy(gradient_sync="overlap").gradient_sync == "overlap"
    assert Strategy(gradient_sync="p3").gradient_sync == "p3"
    with pytest.raises(StrategyError, match="unknown gradient_sync 'fifo'"):
        Strategy(gradient_sync="fifo")  # type: ignore[arg-type]
    with pytest.raises(StrategyError, match="needs pipeline_model_parallel_size 1"):
        Strategy(pipeline_model_parallel_size=2, num_microbatches=2, gradient_sync="p3")
