"""The transformer planner's estimate of the activations and gradients a pipeline stage
holds at once when its sharded gradients accumulate unsharded over the micro-batches
(ZeRO-3 under pipelines, `space.ZERO3_PIPELINED`; `paraplan.predict.fsdp_ops.accumulates_unsharded`).

Autograd allocates a model chunk's unsharded gradients at its first backward and keeps
them to the reduce-scatter after the last micro-batch, so they join the activations
only from then on: the engine takes the largest sum over every moment of the stage's
op order (`paraplan.sim.execution`). Here each moment is two counts, the (micro-batch,
chunk) activations held and the chunks whose gradients are allocated, read once per
(schedule, p, M, v) from the same op orders; only the moments no other moment exceeds
in both counts can be the peak (`moments`), a handful per schedule, so the peak of
every candidate is a maximum over a few points (`peak_bytes`)."""

from __future__ import annotations

import functools

import numpy as np

from paraplan.sim.schedules import BWD, FWD, WGT, get_schedule

Moments = tuple[tuple[int, int, int], ...]
"""(activations held, chunks with gradients allocated, activations held of the stage's end
chunk: chunk 0 on the first stage, which holds the embedding's, the last chunk on the last
stage, which holds the head's) at the moments that can be a peak."""


def _frontier(points: np.ndarray) -> Moments:
    """The distinct rows of `points` that no other row reaches or exceeds in every count."""
    unique = np.unique(points, axis=0)
    ge = np.asarray((unique[None, :, :] >= unique[:, None, :]).all(axis=2))  # ge[i, j]: row j reaches row i
    np.fill_diagonal(ge, False)
    kept = unique[~ge.any(axis=1)]
    return tuple((int(h), int(k), int(e)) for h, k, e in kept.tolist())


@functools.lru_cache(maxsize=4096)
def moments(schedule: str, p: int, m: int, v: int) -> tuple[Moments, Moments, Moments]:
    """The first, the last and the second stage's moments (module doc), counted after each
    op as the engine counts them: a forward adds its activations, the op that ends a
    micro-batch's backward (W where the backward is split) frees them and, the first time
    for its chunk, allocates that chunk's gradients. GPipe holds all M forwards before
    the first backward; the other schedules repeat after a few p micro-batches, so long
    runs are read on a shorter one (as `estimate._held`)."""
    if schedule == "gpipe" or p == 1:
        ends = ((m, 0, m), (m - 1, 1, m - 1))
        return ends, ends, ends
    sched = get_schedule(schedule)
    step = p if v > 1 else 1
    short = min(m, max(4 * p, step))
    short = max(short - short % step, step)
    free = WGT if sched.split_backward else BWD
    out = []
    for stage, end_chunk in ((0, 0), (p - 1, v - 1), (1, -1)):
        order = sched.stage_order(p, short, v, stage)
        delta = np.where(order.kind == FWD, 1, np.where(order.kind == free, -1, 0))
        ends = order.kind == free
        _, first = np.unique(np.where(ends, order.chunk, -1), return_index=True)
        allocates = np.zeros(len(order), dtype=bool)
        allocates[first] = True
        points = np.stack([np.cumsum(delta), np.cumsum(allocates & ends),
                           np.cumsum(np.where(order.chunk == end_chunk, delta, 0))], axis=1)
        out.append(_frontier(points))
    return out[0], out[1], out[2]


def peak_bytes(points: Moments, act_bytes: np.ndarray, grad_chunk_bytes: np.ndarray,
               end_chunk_bytes: np.ndarray | None = None) -> np.ndarray:
    """The largest activations + gradients over `points` of candidates sharing them:
    `act_bytes` per held (micro-batch, chunk), `grad_chunk_bytes` per allocated chunk,
    `end_chunk_bytes` more per held micro-batch of the end chunk (the embedding's or the
    head's activations; `estimate._peak_memory_bytes`)."""
    held, chunks, end = (np.array([pt[j] for pt in points], dtype=float) for j in range(3))
    total = held[None, :] * act_bytes[:, None] + chunks[None, :] * grad_chunk_bytes[:, None]
    if end_chunk_bytes is not None:
        total = total + end[None, :] * end_chunk_bytes[:, None]
    return total.max(axis=1)
