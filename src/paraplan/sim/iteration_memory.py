"""Each pipeline rank's peak memory over one iteration of an `ExecutionModel`: its
weight state, the activations its schedule's op order holds at most, the gradient
accumulators allocated by then and its working set (`paraplan.sim.rank_peak` walks the
orders), and what the memory holds at that moment (`MemoryAtPeak`).
`paraplan.sim.execution.run_iteration` reports it beside the iteration's time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from paraplan.sim.rank_peak import (
    Kept,
    StackedOrders,
    activation_peak,
    peak_at_ops,
    peak_with_lazy_gradients,
    rank_peaks,
    stacked_orders,
)
from paraplan.sim.schedules import BWD, WGT, Schedule, cached_orders

if TYPE_CHECKING:
    from paraplan.sim.execution import ExecutionModel


@dataclass(frozen=True, eq=False)
class MemoryAtPeak:
    """Per pipeline rank, what its memory holds at the moment of its peak; the four
    parts add up to `IterationResult.peak_memory_bytes`."""

    state_bytes: np.ndarray  # weights (with held copies), gradients, optimizer state: `RankMemory.weight_state_bytes`
    working_bytes: np.ndarray  # the transient working set: `RankMemory.working_bytes`
    gradient_accumulator_bytes: np.ndarray  # of `RankMemory.lazy_gradient_bytes_per_chunk`, those allocated by then
    activation_bytes: np.ndarray  # held then: the activation peak, or less where the accumulators move the peak



@dataclass(frozen=True, eq=False)
class MemoryPeaks:
    """Per pipeline rank: the activation peak, the micro-batches it holds, the total peak
    and its parts."""

    activation_bytes: np.ndarray
    inflight_microbatches: np.ndarray
    peak_bytes: np.ndarray
    at_peak: MemoryAtPeak


def memory_peaks(model: ExecutionModel, sched: Schedule) -> MemoryPeaks:
    """Each rank's peak memory: weight state, the activations its schedule's order holds
    at most, and its working set."""
    p = model.pipeline_stages
    free_kind = WGT if sched.split_backward else BWD
    if all(m.working_bytes_per_op is not None for m in model.memory):  # z8-cpmem: all ranks at once
        stacked = stacked_orders(model.schedule, p, model.microbatches, model.virtual_stages)
        if stacked is not None and stacked.kind.shape[1]:
            return _stacked_memory_peaks(model, stacked, free_kind)
    orders = cached_orders(model.schedule, p, model.microbatches, 1, model.virtual_stages)
    act_peak = np.zeros(p)
    inflight = np.zeros(p, dtype=np.int64)
    peak = np.zeros(p)
    state, working, grads, acts = np.zeros(p), np.zeros(p), np.zeros(p), np.zeros(p)
    for s in range(p):
        mem = model.memory[s]
        chunk_bytes = np.asarray(mem.activation_bytes_per_chunk, float)
        kept = Kept.of(mem)
        act_peak[s], inflight[s] = activation_peak(orders[s], chunk_bytes, free_kind, kept)
        acts[s] = act_peak[s]
        lazy = None if mem.lazy_gradient_bytes_per_chunk is None else np.asarray(mem.lazy_gradient_bytes_per_chunk,
                                                                                 float)
        state[s], working[s] = mem.weight_state_bytes, mem.working_bytes
        if mem.working_bytes_per_op is not None and len(orders[s]):  # z8-cpmem: each op's own working set
            acts[s], grads[s], working[s] = peak_at_ops(orders[s], chunk_bytes, lazy,
                                                          np.asarray(mem.working_bytes_per_op, float), free_kind, kept)
        elif lazy is not None and len(orders[s]):
            acts[s], grads[s] = peak_with_lazy_gradients(orders[s], chunk_bytes, lazy, free_kind, kept)
        if mem.iteration_end_bytes > acts[s] + grads[s] + working[s]:  # the moment after the last backward
            acts[s], grads[s], working[s] = 0.0, 0.0, mem.iteration_end_bytes
        peak[s] = state[s] + (acts[s] + grads[s]) + working[s]
    return MemoryPeaks(act_peak, inflight, peak, MemoryAtPeak(state, working, grads, acts))


def _stacked_memory_peaks(model: ExecutionModel, orders: StackedOrders, free_kind: int) -> MemoryPeaks:
    """`memory_peaks` with every rank's per-op working set, all ranks in one pass
    (`paraplan.sim.rank_peak.rank_peaks`)."""
    mem = model.memory

    def per_chunk(values: list[np.ndarray | None]) -> np.ndarray | None:
        if all(x is None for x in values):
            return None
        return np.stack([np.zeros(model.virtual_stages) if x is None else np.asarray(x, float) for x in values])

    chunk_bytes = per_chunk([m.activation_bytes_per_chunk for m in mem])
    assert chunk_bytes is not None
    kept = Kept(per_chunk([m.kept_output_bytes_per_chunk for m in mem]),
                per_chunk([m.kept_input_grad_bytes_per_chunk for m in mem]))
    working_per_op = np.stack([np.asarray(m.working_bytes_per_op, float) for m in mem])
    got = rank_peaks(orders, chunk_bytes, kept, per_chunk([m.lazy_gradient_bytes_per_chunk for m in mem]),
                     working_per_op, free_kind)
    acts, grads, working = got.activation_bytes, got.gradient_accumulator_bytes, got.working_bytes
    end = np.array([m.iteration_end_bytes for m in mem])
    after = end > acts + grads + working  # the moment after the last backward
    acts, grads, working = np.where(after, 0.0, acts), np.where(after, 0.0, grads), np.where(after, end, working)
    state = np.array([m.weight_state_bytes for m in mem])
    peak = state + (acts + grads) + working
    return MemoryPeaks(got.activation_peak_bytes, got.inflight_microbatches.astype(np.int64), peak,
                       MemoryAtPeak(state, working, grads, acts))
