"""The pipeline engine for many pipelines of one shape at once (a calibration's runs).

`paraplan.sim.engine.execute` visits each op of one pipeline in a Python loop. Which
op it visits next depends only on which ops have run, never on their times, so the
visiting order of a set of orders is fixed: `execute_batch` records it once (cached
like the engine's own preparation) and then runs each op for all R pipelines of that
shape at once, as numpy vectors of length R. Each op's start and end are the same
IEEE operations on the same numbers as in `execute` (a maximum of two times, one
addition of a duration or a transfer), so every time is byte-identical to R separate
`execute` calls (tested); only the number of Python steps changes, from R x ops to ops.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from paraplan.core.errors import StrategyError
from paraplan.sim.engine import (
    PipelineCosts,
    PipelineRun,
    Prepared,
    _prepare_cached,
    _raise_if_stuck,
)
from paraplan.sim.op_cache import OpsBoundedCache
from paraplan.sim.schedules import BWD, FWD, OpOrder

Plan = tuple[list[tuple[int, int, int, int, int]], np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""(kind, op index vs x n + m, virtual stage, device, position) per op in visiting
order, then the run's device, kind, virtual stage and micro-batch arrays (device by
device in run order, `PipelineRun`'s layout)."""
_PLANS: OpsBoundedCache[tuple[Sequence[OpOrder], Plan]] = OpsBoundedCache()


def _visiting_plan(orders: tuple[OpOrder, ...], prepared: Prepared, n: int, nv: int) -> Plan:
    """The order in which `engine._run_as_soon_as_possible` visits the ops (a device runs
    until an op waits on an input not yet produced; the producer wakes it)."""
    kinds, mbs, vss = prepared
    p = len(kinds)
    done = ([False] * (nv * n), [False] * (nv * n), [False] * (nv * n))
    offsets = np.cumsum([0, *[len(k) for k in kinds]]).tolist()
    ptr, waiting = [0] * p, [False] * p
    last_v = nv - 1
    visits: list[tuple[int, int, int, int, int]] = []
    work = list(range(p - 1, -1, -1))
    while work:
        d = work.pop()
        waiting[d] = False
        i = ptr[d]
        kd, md, vd = kinds[d], mbs[d], vss[d]
        while i < len(kd):
            k, m, vs = kd[i], md[i], vd[i]
            idx = vs * n + m
            if k == FWD:
                ready = vs == 0 or done[FWD][idx - n]
            elif k == BWD:
                ready = done[FWD][idx] and (vs == last_v or done[BWD][idx + n])
            else:
                ready = done[BWD][idx]
            if not ready:
                break
            visits.append((k, idx, vs, d, offsets[d] + i))
            done[k][idx] = True
            nb = (vs + 1) % p if k == FWD and vs < last_v else (vs - 1) % p if k == BWD and vs > 0 else -1
            if nb >= 0 and waiting[nb]:
                waiting[nb] = False
                work.append(nb)
            i += 1
        ptr[d] = i
        if i < len(kd):
            waiting[d] = True
    _raise_if_stuck(prepared, ptr)
    device = np.repeat(np.arange(p, dtype=np.int32), [len(o) for o in orders])
    kind = np.concatenate([o.kind for o in orders]).astype(np.int8)
    vstage = np.concatenate([o.chunk * p + s for s, o in enumerate(orders)]).astype(np.int32)
    microbatch = np.concatenate([o.microbatch for o in orders]).astype(np.int32)
    return visits, device, kind, vstage, microbatch


def execute_batch(orders: tuple[OpOrder, ...], costs: Sequence[PipelineCosts],
                  num_microbatches: int) -> list[PipelineRun]:
    """`[execute(orders, c, num_microbatches) for c in costs]` with the ops of all
    pipelines run together (see the module doc); `orders` is a tuple that
    `schedules.cached_orders` handed out (the plan is cached by its identity)."""
    nv = costs[0].num_virtual_stages
    if any(c.num_virtual_stages != nv for c in costs):
        raise StrategyError("pipelines run together need the same number of virtual stages")
    starts, ends, (device, kind, vstage, microbatch) = _run(
        orders, np.stack([c.fwd_s for c in costs]), np.stack([c.bwd_s for c in costs]),
        np.stack([c.wgt_s for c in costs]), np.stack([c.send_fwd_s for c in costs]).reshape(len(costs), nv - 1),
        np.stack([c.send_bwd_s for c in costs]).reshape(len(costs), nv - 1), num_microbatches)
    starts_t, ends_t = starts.T.copy(), ends.T.copy()
    p = len(orders)
    return [PipelineRun(device, kind, vstage, microbatch, starts_t[j], ends_t[j], p) for j in range(len(costs))]


def execute_batch_arrays(orders: tuple[OpOrder, ...], fwd_s: np.ndarray, bwd_s: np.ndarray, wgt_s: np.ndarray,
                         send_fwd_s: np.ndarray, send_bwd_s: np.ndarray,
                         num_microbatches: int) -> tuple[np.ndarray, np.ndarray]:
    """`execute_batch` of costs given as rows (R, V) and (R, V - 1): each op's device and
    its end time in each pipeline (ops, R), ops device by device in run order."""
    _, ends, (device, _, _, _) = _run(orders, fwd_s, bwd_s, wgt_s, send_fwd_s, send_bwd_s, num_microbatches)
    return device, ends


def _run(orders: tuple[OpOrder, ...], fwd_s: np.ndarray, bwd_s: np.ndarray, wgt_s: np.ndarray,
         send_fwd_s: np.ndarray, send_bwd_s: np.ndarray, n: int
         ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Each op's start and end (ops, R), and the run's device, kind, virtual stage and
    micro-batch per op."""
    p = len(orders)
    r, nv = fwd_s.shape
    if p < 1 or nv % p != 0:
        raise StrategyError(f"{nv} virtual stages cannot be spread over {p} pipeline devices")
    prepared = _prepare_cached(orders, n, nv)

    def make() -> tuple[tuple[Sequence[OpOrder], Plan], int]:
        return (orders, _visiting_plan(orders, prepared, n, nv)), sum(len(o) for o in orders)

    visits, device, kind, vstage, microbatch = _PLANS.get((id(orders), n, nv), make)[1]
    # per kind and virtual stage, the R pipelines' durations as one contiguous vector
    dur = np.ascontiguousarray(np.stack([fwd_s.T, bwd_s.T, wgt_s.T]), float)
    sendf = np.zeros((nv, r))  # sendf[vs]: vs -> vs + 1
    sendb = np.zeros((nv, r))  # sendb[vs]: vs -> vs - 1
    if nv > 1:
        sendf[:-1] = send_fwd_s.T
        sendb[1:] = send_bwd_s.T
    done = np.empty((3, nv * n, r))
    starts = np.empty((device.shape[0], r))
    clock = [np.zeros(r)] * p
    last_v = nv - 1
    for k, idx, vs, d, pos in visits:
        if k == FWD:
            ready = done[FWD, idx - n] + sendf[vs - 1] if vs > 0 else 0.0
        elif k == BWD:
            ready = done[FWD, idx]
            if vs < last_v:
                ready = np.maximum(ready, done[BWD, idx + n] + sendb[vs + 1])
        else:
            ready = done[BWD, idx]
        t = np.maximum(clock[d], ready)
        starts[pos] = t
        t = t + dur[k, vs]
        done[k, idx] = t
        clock[d] = t
    return starts, starts + dur[kind, vstage], (device, kind, vstage, microbatch)
