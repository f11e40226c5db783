"""What one pipeline rank holds as its op order runs, and at which moment its memory
peaks (`paraplan.sim.execution` reports it): the activations each op allocates or frees,
the gradients allocated lazily by each chunk's first backward, and the working set of the
op running (`RankMemory.working_bytes_per_op`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from paraplan.sim.op_cache import OpsBoundedCache
from paraplan.sim.schedules import BWD, FWD, OpOrder, cached_orders

if TYPE_CHECKING:
    from paraplan.sim.execution import RankMemory


@dataclass(frozen=True, eq=False)
class Kept:
    """Per model chunk: bytes a forward (`output`) or a backward (`input_grad`) allocates
    and the iteration holds to its end (`RankMemory.kept_*_bytes_per_chunk`)."""

    output: np.ndarray | None = None
    input_grad: np.ndarray | None = None

    @staticmethod
    def of(mem: RankMemory) -> Kept:
        out, grad = mem.kept_output_bytes_per_chunk, mem.kept_input_grad_bytes_per_chunk
        return Kept(None if out is None else np.asarray(out, float), None if grad is None else np.asarray(grad, float))


def activation_peak(order: OpOrder, chunk_bytes: np.ndarray, free_kind: int,
                     kept: Kept = Kept()) -> tuple[float, int]:
    """Peak activation bytes (with what is kept to the end) and micro-batch count held
    as `order` runs."""
    if not len(order):
        return 0.0, 0
    held, count = _held(order, chunk_bytes, free_kind, kept)
    return float(held.max()), int(count.max())


def held_steps(order: OpOrder, chunk_bytes: np.ndarray, free_kind: int, kept: Kept = Kept()) -> np.ndarray:
    """What each op of `order` adds to the activations held (negative: frees)."""
    is_fwd = order.kind == FWD
    is_free = order.kind == free_kind
    act = chunk_bytes[order.chunk]
    out = 0.0 if kept.output is None else kept.output[order.chunk]  # by the forward, never freed
    grad = 0.0 if kept.input_grad is None else np.where(order.kind == BWD, kept.input_grad[order.chunk], 0.0)
    return np.where(is_fwd, act + out, np.where(is_free, -act, 0.0)) + grad


def _held(order: OpOrder, chunk_bytes: np.ndarray, free_kind: int,
          kept: Kept = Kept()) -> tuple[np.ndarray, np.ndarray]:
    held = np.cumsum(held_steps(order, chunk_bytes, free_kind, kept))
    count = np.cumsum(np.where(order.kind == FWD, 1, np.where(order.kind == free_kind, -1, 0)))
    return held, count


def first_gradient_steps(order: OpOrder, grad_bytes: np.ndarray, free_kind: int) -> np.ndarray:
    """What each op allocates of the lazily allocated gradients: a chunk's all, at its
    first weight-gradient op (`peak_with_lazy_gradients`)."""
    is_grad = order.kind == free_kind
    first = np.zeros(len(order), dtype=bool)
    _, index = np.unique(np.where(is_grad, order.chunk, -1), return_index=True)
    first[index] = True
    first &= is_grad
    return np.where(first, grad_bytes[order.chunk], 0.0)


def peak_at_ops(order: OpOrder, chunk_bytes: np.ndarray, grad_bytes: np.ndarray | None,
                 working: np.ndarray, free_kind: int, kept: Kept = Kept()) -> tuple[float, float, float]:
    """Activations, gradient accumulators and working set at the rank's peak moment: the
    largest, over ops, of what is held at an op's end (a forward's activations all
    allocated by then, the loss's transient then) and at a backward's start (its
    activations not yet freed, its gradients not yet allocated) plus the op's working
    set (`RankMemory.working_bytes_per_op`). Inside an op the activations held and the
    gradients allocated move layer by layer from one end's value to the other's, so
    with each layer's working set alike the peak is at one of the two ends; between
    ops nothing is added, which an op's end covers."""
    step = held_steps(order, chunk_bytes, free_kind, kept)
    held = np.cumsum(step)
    alloc = np.zeros(len(order)) if grad_bytes is None else first_gradient_steps(order, grad_bytes, free_kind)
    grads = np.cumsum(alloc)
    is_fwd = order.kind == FWD
    work = working[np.where(is_fwd, 0, 1), order.chunk]
    end = held + grads + work
    start = np.where(is_fwd, -np.inf, (held - step) + (grads - alloc) + work)
    at_end, at_start = int(np.argmax(end)), int(np.argmax(start))
    if start[at_start] > end[at_end]:
        return float(held[at_start] - step[at_start]), float(grads[at_start] - alloc[at_start]), float(work[at_start])
    return float(held[at_end]), float(grads[at_end]), float(work[at_end])


def peak_with_lazy_gradients(order: OpOrder, chunk_bytes: np.ndarray, grad_bytes: np.ndarray,
                              free_kind: int, kept: Kept = Kept()) -> tuple[float, float]:
    """Activations and gradients held at the peak of their sum, the gradients being
    those each chunk allocates at its first weight-gradient op (the backward; ZB-H1's W)
    and holds to the end: after that op, which frees its own micro-batch's activations."""
    held, _ = _held(order, chunk_bytes, free_kind, kept)
    grads = np.cumsum(first_gradient_steps(order, grad_bytes, free_kind))
    at = int(np.argmax(held + grads))
    return float(held[at]), float(grads[at])


@dataclass(frozen=True, eq=False)
class StackedOrders:
    """Every rank's op order as [rank, op] arrays (flushed schedules give every rank the
    same number of ops), for `rank_peaks`."""

    kind: np.ndarray
    chunk: np.ndarray

    @staticmethod
    def of(orders: tuple[OpOrder, ...]) -> StackedOrders | None:
        """None where the ranks' orders differ in length."""
        if len({len(o) for o in orders}) != 1:
            return None
        return StackedOrders(np.stack([o.kind for o in orders]), np.stack([o.chunk for o in orders]))


_STACKED: OpsBoundedCache[StackedOrders | None] = OpsBoundedCache()


def stacked_orders(name: str, p: int, m: int, v: int) -> StackedOrders | None:
    """`StackedOrders.of(cached_orders(...))` for one iteration, cached like the orders."""
    def make() -> tuple[StackedOrders | None, int]:
        orders = cached_orders(name, p, m, 1, v)
        return StackedOrders.of(orders), sum(len(o) for o in orders)

    return _STACKED.get((name, p, m, v), make)


@dataclass(frozen=True, eq=False)
class RankPeaks:
    """Per rank: the activation peak and micro-batches held then, and at the peak moment
    the activations, gradient accumulators and working set (`peak_at_ops`)."""

    activation_peak_bytes: np.ndarray
    inflight_microbatches: np.ndarray
    activation_bytes: np.ndarray
    gradient_accumulator_bytes: np.ndarray
    working_bytes: np.ndarray


def rank_peaks(orders: StackedOrders, chunk_bytes: np.ndarray, kept: Kept, grad_bytes: np.ndarray | None,
               working: np.ndarray, free_kind: int) -> RankPeaks:
    """`activation_peak` and `peak_at_ops` of every rank at once ([rank, chunk] arrays,
    `working` [rank, kind, chunk]): one pass of numpy over [rank, op] arrays, since the
    per-rank calls cost more in numpy's per-call overhead than in their work."""
    kind, chunk = orders.kind, orders.chunk
    rows = np.arange(kind.shape[0])[:, None]
    is_fwd, is_free = kind == FWD, kind == free_kind
    act = chunk_bytes[rows, chunk]
    step = np.where(is_fwd, act, np.where(is_free, -act, 0.0))
    if kept.output is not None:
        step += np.where(is_fwd, kept.output[rows, chunk], 0.0)
    if kept.input_grad is not None:
        step += np.where(kind == BWD, kept.input_grad[rows, chunk], 0.0)
    held = np.cumsum(step, axis=1)
    count = np.cumsum(np.where(is_fwd, 1, np.where(is_free, -1, 0)), axis=1)
    alloc = np.zeros(kind.shape)
    if grad_bytes is not None:
        for c in range(chunk_bytes.shape[1]):  # a chunk's gradients at its first weight-gradient op
            mine = is_free & (chunk == c)
            alloc += np.where(mine & (np.cumsum(mine, axis=1) == 1), grad_bytes[:, c:c + 1], 0.0)
    grads = np.cumsum(alloc, axis=1)
    work = working[rows, np.where(is_fwd, 0, 1), chunk]
    end = held + grads + work
    start = np.where(is_fwd, -np.inf, (held - step) + (grads - alloc) + work)
    at_end, at_start = np.argmax(end, axis=1), np.argmax(start, axis=1)
    r = rows[:, 0]
    use_start = start[r, at_start] > end[r, at_end]
    at = np.where(use_start, at_start, at_end)
    acts = np.where(use_start, held[r, at] - step[r, at], held[r, at])
    grads_at = np.where(use_start, grads[r, at] - alloc[r, at], grads[r, at])
    return RankPeaks(held.max(axis=1), count.max(axis=1), acts, grads_at, work[r, at])
