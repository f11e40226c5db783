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

Moments = tuple[tuple[int, int], ...]
"""(activations held, chunks with gradients allocated) at the moments that can be a peak."""


def _frontier(held: np.ndarray, allocated: np.ndarray) -> Moments:
    """The (held, allocated) pairs that no other pair exceeds in both counts."""
    best: dict[int, int] = {}
    for h, k in zip(held.tolist(), allocated.tolist(), strict=True):
        best[k] = max(best.get(k, h), h)
    out: list[tuple[int, int]] = []
    for k in sorted(best, reverse=True):  # more chunks allocated first: keep a pair only if it holds more
        if not out or best[k] > out[-1][0]:
            out.append((best[k], k))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def moments(schedule: str, p: int, m: int, v: int) -> tuple[Moments, Moments, Moments]:
    """The first, the last and the second stage's moments (module doc), counted after each op as
    the engine counts them: a forward adds its activations, the op that ends a
    micro-batch's backward (W where the backward is split) frees them and, the first time
    for its chunk, allocates that chunk's gradients. GPipe holds all M forwards before
    the first backward; the other schedules repeat after a few p micro-batches, so long
    runs are read on a shorter one (as `estimate._held`)."""
    if schedule == "gpipe" or p == 1:
        return ((m, 0), (m - 1, 1)), ((m, 0), (m - 1, 1)), ((m, 0), (m - 1, 1))
    sched = get_schedule(schedule)
    step = p if v > 1 else 1
    short = min(m, max(4 * p, step))
    short = max(short - short % step, step)
    free = WGT if sched.split_backward else BWD
    out = []
    for stage in (0, p - 1, 1):
        order = sched.stage_order(p, short, v, stage)
        held = np.cumsum(np.where(order.kind == FWD, 1, np.where(order.kind == free, -1, 0)))
        ends = order.kind == free
        _, first = np.unique(np.where(ends, order.chunk, -1), return_index=True)
        allocates = np.zeros(len(order), dtype=bool)
        allocates[first] = True
        out.append(_frontier(held, np.cumsum(allocates & ends)))
    return out[0], out[1], out[2]


def peak_bytes(points: Moments, act_bytes: np.ndarray, grad_chunk_bytes: np.ndarray,
               per_chunk0_bytes: np.ndarray | None = None, v: int = 1) -> np.ndarray:
    """The largest activations + gradients over `points` of candidates sharing them:
    `act_bytes` per held (micro-batch, chunk), `grad_chunk_bytes` per allocated chunk,
    `per_chunk0_bytes` once per v held, as the one chunk's share of them (the embedding's
    activations on the first stage; `estimate._peak_memory_bytes`)."""
    held = np.array([h for h, _ in points], dtype=float)
    chunks = np.array([k for _, k in points], dtype=float)
    total = held[None, :] * act_bytes[:, None] + chunks[None, :] * grad_chunk_bytes[:, None]
    if per_chunk0_bytes is not None:
        total = total + np.ceil(held / v)[None, :] * per_chunk0_bytes[:, None]
    return total.max(axis=1)
