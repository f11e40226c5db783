"""The engine's peak as the largest moment (`paraplan.sim.rank_peak.peak_at_ops`): what
the schedule holds when an op runs plus that op's own working set, not the activation
peak plus the largest working set whenever it happens."""

import numpy as np
import pytest

from paraplan.sim.rank_peak import Kept, activation_peak, peak_at_ops, rank_peaks, stacked_orders
from paraplan.sim.schedules import BWD, FWD, WGT, cached_orders


def test_the_loss_counts_where_the_last_chunk_runs_forward():
    # interleaved 1F1B, 2 ranks, 4 micro-batches, 2 chunks; the last rank runs
    # F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 B1.3 B0.2 B0.3 (chunk.micro-batch):
    # it holds 3 a0 after F0.2, but the loss (on chunk 1's forwards) runs when it holds 2 a0 + a1
    order = cached_orders("interleaved_1f1b", 2, 4, 1, 2)[1]
    a0, a1, loss = 4.0, 1.0, 10.0
    chunk_bytes = np.array([a0, a1])
    working = np.array([[0.0, loss], [0.0, 0.0]])
    acts, grads, work = peak_at_ops(order, chunk_bytes, None, working, BWD)
    assert (acts, grads, work) == (2 * a0 + a1, 0.0, loss)
    assert activation_peak(order, chunk_bytes, BWD)[0] + loss == 3 * a0 + loss  # the old sum: 3 bytes more
    # a backward working set counts at the backward's start, its micro-batch's activations still held
    acts, _, work = peak_at_ops(order, chunk_bytes, None, np.array([[0.0, 0.0], [5.0, 5.0]]), BWD)
    assert (acts, work) == (3 * a0, 5.0)


def _brute_force(order, chunk_bytes, grad_bytes, working, free_kind, kept_out, kept_grad):
    """Op by op: memory at each op's end, and at a backward's start."""
    held = grads = 0.0
    seen: set[int] = set()
    best = -np.inf
    for kind, chunk in zip(order.kind.tolist(), order.chunk.tolist(), strict=True):
        w = working[0 if kind == FWD else 1, chunk]
        if kind != FWD:
            best = max(best, held + grads + w)
        if kind == FWD:
            held += chunk_bytes[chunk] + kept_out[chunk]
        if kind == free_kind:
            held -= chunk_bytes[chunk]
            if chunk not in seen:
                seen.add(chunk)
                grads += grad_bytes[chunk]
        if kind == BWD:
            held += kept_grad[chunk]
        best = max(best, held + grads + w)
    return best


@pytest.mark.parametrize(("schedule", "p", "m", "v"), [("1f1b", 4, 8, 1), ("gpipe", 3, 5, 1),
                                                        ("interleaved_1f1b", 4, 8, 3), ("zb_h1", 4, 8, 1)])
def test_vectorised_moments_equal_the_op_by_op_walk(schedule, p, m, v):
    rng = np.random.default_rng(7)
    free_kind = WGT if schedule == "zb_h1" else BWD
    for rank, order in enumerate(cached_orders(schedule, p, m, 1, v)):
        chunk_bytes, grad_bytes = rng.uniform(1, 5, v), rng.uniform(0, 9, v)
        kept = Kept(rng.uniform(0, 1, v), rng.uniform(0, 1, v))
        working = rng.uniform(0, 20, (2, v))
        acts, grads, work = peak_at_ops(order, chunk_bytes, grad_bytes, working, free_kind, kept)
        expected = _brute_force(order, chunk_bytes, grad_bytes, working, free_kind, kept.output, kept.input_grad)
        assert acts + grads + work == pytest.approx(expected, rel=1e-12), (schedule, rank)


@pytest.mark.parametrize(("schedule", "p", "m", "v"), [("1f1b", 4, 8, 1), ("interleaved_1f1b", 4, 8, 3),
                                                        ("zb_h1", 4, 8, 1)])
def test_all_ranks_at_once_equal_rank_by_rank(schedule, p, m, v):
    rng = np.random.default_rng(11)
    free_kind = WGT if schedule == "zb_h1" else BWD
    chunk_bytes, grad_bytes = rng.uniform(1, 5, (p, v)), rng.uniform(0, 9, (p, v))
    kept = Kept(rng.uniform(0, 1, (p, v)), rng.uniform(0, 1, (p, v)))
    working = rng.uniform(0, 20, (p, 2, v))
    stacked = stacked_orders(schedule, p, m, v)
    got = rank_peaks(stacked, chunk_bytes, kept, grad_bytes, working, free_kind)
    for rank, order in enumerate(cached_orders(schedule, p, m, 1, v)):
        one = Kept(kept.output[rank], kept.input_grad[rank])
        assert (got.activation_peak_bytes[rank], got.inflight_microbatches[rank]) == pytest.approx(
            activation_peak(order, chunk_bytes[rank], free_kind, one))
        assert (got.activation_bytes[rank], got.gradient_accumulator_bytes[rank], got.working_bytes[rank]) == \
            pytest.approx(peak_at_ops(order, chunk_bytes[rank], grad_bytes[rank], working[rank], free_kind, one))
