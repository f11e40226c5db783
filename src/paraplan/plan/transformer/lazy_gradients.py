"""The transformer planner's estimate of the activations and gradients a pipeline stage
holds at once when its sharded gradients accumulate unsharded over the micro-batches
(ZeRO-3 under pipelines, `space.ZERO3_PIPELINED`; `paraplan.predict.fsdp_ops.accumulates_unsharded`).

Autograd allocates a model chunk's unsharded gradients at its first backward and keeps
them to the reduce-scatter after the last micro-batch, so they join the activations
only from then on: the engine takes the largest sum over every moment of the stage's
op order (`paraplan.sim.execution`). Here each moment is three counts, the (micro-batch,
chunk) activations held, the chunks whose gradients are allocated and the micro-batches
held of the stage's end chunk (the embedding's or the head's), read once per
(schedule, p, M, v) from the same op orders; only the moments no other moment exceeds
in every count can be the peak (`moments`), a handful per schedule, so the peak of
every candidate is a maximum over a few points (`peak_bytes`, `moment_peaks`)."""

from __future__ import annotations

import functools

import numpy as np

from paraplan.plan.transformer.columns import CandidateColumns, StageLayers, StageParams
from paraplan.plan.transformer.layer_table import LayerTable
from paraplan.plan.transformer.space import SCHEDULES
from paraplan.plan.transformer.unique_rows import unique_rows
from paraplan.predict.build import Precision
from paraplan.sim.schedules import BWD, FWD, WGT, get_schedule

Moments = tuple[tuple[int, int, int], ...]
"""(activations held, chunks with gradients allocated, activations held of the stage's end
chunk: chunk 0 on the first stage, which holds the embedding's, the last chunk on the last
stage, which holds the head's) at the moments that can be a peak."""


def _frontier(points: np.ndarray) -> Moments:
    """The rows of `points` (held, allocated, end chunk's held) that can be a peak: among
    the rows of each allocated count, those no row holds more of in both other counts (a
    sweep down the end chunk's count; deep pipelines have thousands of moments, so no
    comparison of every pair)."""
    order = np.lexsort((-points[:, 0], -points[:, 2], points[:, 1]))  # by allocated, then end's, held: most first
    out: list[tuple[int, int, int]] = []
    chunks, most = -1, -1
    for h, k, e in points[order].tolist():
        if k != chunks:
            chunks, most = k, -1
        if h > most:
            out.append((int(h), int(k), int(e)))
            most = h
    return tuple(out)


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


def moment_peaks(cols: CandidateColumns, layers: StageLayers, table: LayerTable, params: StageParams,
                 params_second: np.ndarray, prec: Precision, lazy: np.ndarray, chosen: np.ndarray,
                 acts: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first, last and second stage's activations (`acts`) where `chosen`, as the
    largest sum over the schedule's moments (`lazy_gradients`) of the activations held,
    the end chunk's own (chunk 0's embedding, the last chunk's head; a layer fewer there
    where the embedding / loss count as layers) and, where `lazy`, the unsharded gradients
    each chunk allocates at its first backward (the stage's over its v chunks); the
    last stage's include the head's."""
    row, v, acc = cols.row, cols.v, cols.cand.acc
    first_b, last_b, second_b = (a.copy() for a in acts)
    index = np.flatnonzero(chosen)
    keys = np.stack([cols.cand.schedule[index], cols.cand.p[index], np.round(cols.m[index]).astype(np.int64),
                     cols.cand.v[index]], axis=1)
    unique, group = unique_rows(keys)
    grad = np.where(lazy, prec.grad_bytes, 0.0)
    layer = table.act_layer[row]
    counted = acc > 0
    unit_first = np.where(counted, layers.n_mid, layers.n_chunk) * layer
    unit_last = np.where(counted, layers.n_mid, layers.n_last) * layer
    end_first = table.act_emb[row] - (acc & 1) * layer
    end_last = table.act_head[row] - (acc >> 1) * layer
    stage_first = (params.first + params.first_experts * (cols.edp > 1)) * grad / v
    stage_last = (params.last + params.last_experts * (cols.edp > 1)) * grad / v
    for g, (sched, p, m, vv) in enumerate(unique.tolist()):
        i = index[group.ravel() == g]
        first, last, second = moments(SCHEDULES[sched], p, m, vv)
        first_b[i] = peak_bytes(first, unit_first[i], stage_first[i], end_first[i])
        last_b[i] = peak_bytes(last, unit_last[i], stage_last[i], end_last[i])
        second_b[i] = peak_bytes(second, layers.n_mid[i] * layer[i], params_second[i] * grad[i] / v[i])
    return first_b, last_b, second_b
