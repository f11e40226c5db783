"""What one pipeline rank holds as its op order runs, and at which moment its memory
peaks (`paraplan.sim.execution` reports it): the activations each op allocates or frees,
the gradients allocated lazily by each chunk's first backward, and the working set of the
op running (`RankMemory.working_bytes_per_op`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from paraplan.sim.schedules import BWD, FWD, OpOrder

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
