"""The pipeline engine for many pipelines of one shape at once (a calibration's runs).

`paraplan.sim.engine.execute` runs each op of one pipeline in a Python loop. An op
starts when the ops it waits on (its inputs and its device's previous op) have ended,
and which ops those are depends on the orders alone, never on the times. So
`execute_batch` takes one order of the ops in which each comes after those it waits on
(the engine's own run with unit op times, sorted by start: the engine's wake-up logic is
the only one; cached like the engine's own preparation) and then runs each op for all R
pipelines of that shape at once, as numpy vectors of length R. Each op's start and end
are the same IEEE operations on the same numbers as in `execute` (a maximum of two
times, one addition of a duration or a transfer), so every time is byte-identical to R
separate `execute` calls (tested); only the number of Python steps changes, from R x ops
to ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

from paraplan.core.errors import StrategyError
from paraplan.sim.engine import (
    PipelineCosts,
    PipelineRun,
    Prepared,
    _OpTimes,
    _prepare_cached,
    _raise_if_stuck,
    _run_as_soon_as_possible,
)
from paraplan.sim.op_cache import OpsBoundedCache
from paraplan.sim.schedules import BWD, FWD, OpOrder

Plan = tuple[tuple[list[int], list[int], list[int], list[int], list[int]], np.ndarray, np.ndarray, np.ndarray,
             np.ndarray]
"""Kind, op index vs x n + m, virtual stage, device and position of each op, each op
after those it waits on (`_visiting_plan`), then the run's device, kind, virtual stage
and micro-batch arrays (device by device in run order, `PipelineRun`'s layout)."""
_PLANS: OpsBoundedCache[tuple[Sequence[OpOrder], Plan]] = OpsBoundedCache()


def _visiting_plan(orders: tuple[OpOrder, ...], prepared: Prepared, n: int, nv: int) -> Plan:
    """An order of the ops in which each comes after every op it waits on (its inputs and
    its device's previous op): the engine's own run (`engine._run_as_soon_as_possible`)
    with every op taking 1 s and free transfers, its ops sorted by start (an op starts at
    least 1 s after each op it waits on starts, so the sort keeps them first)."""
    kinds = prepared[0]
    p = len(kinds)
    unit = _OpTimes(([1.0] * nv, [1.0] * nv, [1.0] * nv), [0.0] * nv, [0.0] * nv)
    starts, ran = _run_as_soon_as_possible(prepared, unit, n)
    _raise_if_stuck(prepared, ran)
    device = np.repeat(np.arange(p, dtype=np.int32), [len(o) for o in orders])
    kind = np.concatenate([o.kind for o in orders]).astype(np.int8)
    vstage = np.concatenate([o.chunk * p + s for s, o in enumerate(orders)]).astype(np.int32)
    microbatch = np.concatenate([o.microbatch for o in orders]).astype(np.int32)
    position = np.argsort(np.fromiter(chain.from_iterable(starts), float, device.shape[0]), kind="stable")
    op_index = vstage.astype(np.int64) * n + microbatch
    visits = (kind[position].tolist(), op_index[position].tolist(), vstage[position].tolist(),
              device[position].tolist(), position.tolist())
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
    for k, idx, vs, d, pos in zip(*visits, strict=True):
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
