"""The pipeline engine: run per-device ordered op lists as soon as dependencies allow.

Semantics (one pipeline; replicas of a stage behave identically and are expanded
by the caller):
- Virtual stage `vs` (chunk c on device s is vs = c x p + s) runs on device vs % p.
- F(vs, m) needs F(vs - 1, m) plus the forward transfer vs - 1 -> vs.
- B(vs, m) needs F(vs, m) and B(vs + 1, m) plus the backward transfer vs + 1 -> vs;
  with a split backward, B is the input gradient and W(vs, m) needs B(vs, m).
- A device runs its compute ops one at a time in the given order: an op starts at
  max(the device's previous op end, its inputs' arrival).
- Transfers run on their own (communication) stream: a transfer delays its consumer by
  its cost; it does not occupy the sender's compute stream (what its kernel takes from
  the compute beside it is in the op times the builder gives, `PipelineCosts`).

The loop visits each op once (a work list of devices woken by the ops they wait
on) with plain Python lists, so a 64-stage x 1024-micro-batch 1F1B run takes a
fraction of a second. An order that can never complete raises `StrategyError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from paraplan.core.errors import StrategyError
from paraplan.sim.op_cache import OpsBoundedCache
from paraplan.sim.schedules import BWD, FWD, OP_LETTERS, WGT, OpOrder, one_f_one_b_order


@dataclass(frozen=True, eq=False)
class PipelineCosts:
    """Per virtual stage op durations and per boundary transfer times, in seconds.

    `fwd_s`, `bwd_s`, `wgt_s`: shape (V,). With a split backward, `bwd_s` is the input
    gradient (B) and `wgt_s` the weight gradient (W); otherwise `wgt_s` is unused.
    `send_fwd_s[i]` moves an activation from vs = i to i + 1, `send_bwd_s[i]` its
    gradient from i + 1 back to i: shape (V - 1,). `blocked_fwd_s` / `blocked_bwd_s`
    (shape (V,), None: none): the tail of each forward / backward op that is a blocking
    transfer the op waits for (already in `fwd_s` / `bwd_s`; timelines draw it as a send).
    `contended_fwd_s` / `contended_bwd_s` (shape (V,), None: none): what the overlapped
    transfers beside each op take from it (already in `fwd_s` / `bwd_s`,
    `paraplan.predict.pipeline_p2p.overlap_contention_s`).
    """

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    wgt_s: np.ndarray
    send_fwd_s: np.ndarray
    send_bwd_s: np.ndarray
    blocked_fwd_s: np.ndarray | None = None
    blocked_bwd_s: np.ndarray | None = None
    contended_fwd_s: np.ndarray | None = None
    contended_bwd_s: np.ndarray | None = None

    @staticmethod
    def uniform(
        num_virtual_stages: int,
        fwd_s: float,
        bwd_s: float,
        wgt_s: float = 0.0,
        send_s: float = 0.0,
    ) -> PipelineCosts:
        v = num_virtual_stages
        return PipelineCosts(
            np.full(v, float(fwd_s)),
            np.full(v, float(bwd_s)),
            np.full(v, float(wgt_s)),
            np.full(max(v - 1, 0), float(send_s)),
            np.full(max(v - 1, 0), float(send_s)),
        )

    @property
    def num_virtual_stages(self) -> int:
        return int(self.fwd_s.shape[0])


@dataclass(frozen=True, eq=False)
class PipelineRun:
    """Every compute op that ran: aligned arrays, device by device in run order."""

    device: np.ndarray  # pipeline device 0..p-1
    kind: np.ndarray  # FWD, BWD, WGT
    vstage: np.ndarray  # virtual stage
    microbatch: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    num_devices: int

    @property
    def makespan_s(self) -> float:
        return float(self.end_s.max()) if self.end_s.size else 0.0

    def busy_s(self) -> np.ndarray:
        """Compute time per device."""
        return np.bincount(self.device, weights=self.end_s - self.start_s, minlength=self.num_devices)

    def bubble_fraction(self) -> float:
        """Idle share of the devices' compute time over the makespan."""
        span = self.makespan_s
        if span <= 0:
            return 0.0
        return float(1.0 - self.busy_s().sum() / (self.num_devices * span))


Prepared = tuple[list[list[int]], list[list[int]], list[list[int]], list[list[int]], list[list[int]],
                 list[list[int]]]
"""Per device, per op in its order: kind, micro-batch, virtual stage vs, op index vs x n + m, the op
index it waits on besides its own forward (F: F(vs - 1); B: B(vs + 1); W: B(vs); -1: none) and the
device it may wake (-1: none)."""
_PREPARED: OpsBoundedCache[tuple[Sequence[OpOrder], Prepared]] = OpsBoundedCache()


def _prepare_cached(orders: tuple[OpOrder, ...], n: int, nv: int) -> Prepared:
    """`_prepare`, cached (bounded by operations) for the tuples `schedules.cached_orders`
    hands out, which a calibration runs thousands of times; keyed by the tuple's
    identity, which the entry keeps alive."""
    def make() -> tuple[tuple[Sequence[OpOrder], Prepared], int]:
        return (orders, _prepare(orders, n, nv)), sum(len(o) for o in orders)

    return _PREPARED.get((id(orders), n, nv), make)[1]


def _prepare(orders: Sequence[OpOrder], n: int, nv: int) -> Prepared:
    """The orders as plain lists (kind, micro-batch, virtual stage per op), checked."""
    p = len(orders)
    for s, o in enumerate(orders):
        if o.microbatch.size and (o.microbatch.min() < 0 or o.microbatch.max() >= n):
            raise StrategyError(f"device {s}: micro-batch outside 0..{n - 1} in its order")
        if o.chunk.size and (o.chunk.min() < 0 or o.chunk.max() * p + s >= nv):
            raise StrategyError(f"device {s}: model chunk outside the {nv // p} chunks per device")
    kinds = [o.kind.tolist() for o in orders]
    mbs = [o.microbatch.tolist() for o in orders]
    vss = [(o.chunk * p + s).tolist() for s, o in enumerate(orders)]
    idxs, deps, wakes = [], [], []
    last_v = nv - 1
    for s, o in enumerate(orders):
        vs = o.chunk.astype(np.int64) * p + s
        idx = vs * n + o.microbatch
        fwd, bwd = o.kind == FWD, o.kind == BWD
        dep = np.where(fwd, np.where(vs > 0, idx - n, -1), np.where(bwd, np.where(vs < last_v, idx + n, -1), idx))
        wake = np.where(fwd & (vs < last_v), (vs + 1) % p, np.where(bwd & (vs > 0), (vs - 1) % p, -1))
        idxs.append(idx.tolist())
        deps.append(dep.tolist())
        wakes.append(wake.tolist())
    return kinds, mbs, vss, idxs, deps, wakes


def execute(orders: Sequence[OpOrder], costs: PipelineCosts, num_microbatches: int) -> PipelineRun:
    """Run `orders` (one per pipeline device) as soon as possible; see the module doc.

    `num_microbatches` counts all micro-batches in the orders (across iterations).
    """
    p = len(orders)
    nv = costs.num_virtual_stages
    if p < 1 or nv % p != 0:
        raise StrategyError(f"{nv} virtual stages cannot be spread over {p} pipeline devices")
    n = num_microbatches
    prepared = _prepare_cached(orders, n, nv) if isinstance(orders, tuple) else _prepare(orders, n, nv)
    starts, ran = _run_as_soon_as_possible(prepared, _OpTimes.of(costs), n)
    _raise_if_stuck(prepared, ran)
    return _run_from_starts(orders, costs, starts)


NOT_DONE = -1.0
"""An op's end time before it has run (real end times are >= 0)."""


@dataclass(frozen=True)
class _OpTimes:
    """The costs as the event loop reads them: plain lists, indexed by op kind and
    virtual stage; `send_fwd[vs]` moves vs -> vs + 1, `send_bwd[vs]` vs -> vs - 1."""

    duration: tuple[list[float], list[float], list[float]]  # FWD, BWD, WGT
    send_fwd: list[float]
    send_bwd: list[float]

    @staticmethod
    def of(costs: PipelineCosts) -> _OpTimes:
        return _OpTimes((costs.fwd_s.tolist(), costs.bwd_s.tolist(), costs.wgt_s.tolist()),
                        [*costs.send_fwd_s.tolist(), 0.0], [0.0, *costs.send_bwd_s.tolist()])


def _run_as_soon_as_possible(prepared: Prepared, times: _OpTimes, n: int) -> tuple[list[list[float]], list[int]]:
    """Each op's start time, device by device, and how many ops of each device ran (all
    of them unless the orders deadlock). A device runs its ops in order until one
    waits on an input not yet produced; the op that produces it wakes the device.
    (The hot loop of the planner's re-timing: each op's index, dependency and the
    device it wakes are read from `prepared`, computed once per order.)"""
    kinds, _, vss, idxs, deps, wakes = prepared
    p, nv = len(kinds), len(times.duration[0])
    dur_f, dur_b, dur_w = times.duration
    sendf, sendb = times.send_fwd, times.send_bwd
    done_f, done_b = [NOT_DONE] * (nv * n), [NOT_DONE] * (nv * n)
    starts: list[list[float]] = [[0.0] * len(k) for k in kinds]
    ptr, clock, waiting = [0] * p, [0.0] * p, [False] * p
    work = list(range(p - 1, -1, -1))
    while work:
        d = work.pop()
        waiting[d] = False
        i, t = ptr[d], clock[d]
        kd, vd, xd, dd, wd, st = kinds[d], vss[d], idxs[d], deps[d], wakes[d], starts[d]
        end = len(kd)
        while i < end:
            k = kd[i]
            j = dd[i]
            if k == FWD:
                if j >= 0:
                    r = done_f[j]
                    if r < 0:
                        break
                    r += sendf[vd[i] - 1]
                    if r > t:
                        t = r
                elif t < 0.0:
                    t = 0.0
                st[i] = t
                t += dur_f[vd[i]]
                done_f[xd[i]] = t
            elif k == BWD:
                own = done_f[xd[i]]
                if own < 0:
                    break
                if j >= 0:
                    r = done_b[j]
                    if r < 0:
                        break
                    r += sendb[vd[i] + 1]
                    if own > r:
                        r = own
                else:
                    r = own
                if r > t:
                    t = r
                st[i] = t
                t += dur_b[vd[i]]
                done_b[xd[i]] = t
            else:  # W(vs, m) waits on B(vs, m); nothing waits on it
                r = done_b[j]
                if r < 0:
                    break
                if r > t:
                    t = r
                st[i] = t
                t += dur_w[vd[i]]
            # wake the neighbour that may wait on this op: F feeds vs + 1, B feeds vs - 1
            nb = wd[i]
            if nb >= 0 and waiting[nb]:
                waiting[nb] = False
                work.append(nb)
            i += 1
        ptr[d], clock[d] = i, t
        if i < end:
            waiting[d] = True
    return starts, ptr


def _raise_if_stuck(prepared: Prepared, ran: list[int]) -> None:
    """`StrategyError` naming the first device whose order could not complete."""
    kinds, mbs, vss = prepared[:3]
    stuck = [d for d in range(len(kinds)) if ran[d] < len(kinds[d])]
    if stuck:
        d = stuck[0]
        i = ran[d]
        op = f"{OP_LETTERS[kinds[d][i]]}(stage {vss[d][i]}, micro-batch {mbs[d][i]})"
        raise StrategyError(
            f"pipeline order deadlocks: device {d} waits forever at op {i}, {op}; "
            "its inputs come after it in some device's order"
        )


def _run_from_starts(orders: Sequence[OpOrder], costs: PipelineCosts, starts: list[list[float]]) -> PipelineRun:
    """The run's arrays, device by device in run order, from each op's start time."""
    p = len(orders)
    sizes = [len(o) for o in orders]
    kind = np.concatenate([o.kind for o in orders]).astype(np.int8)
    vstage = np.concatenate([o.chunk * p + s for s, o in enumerate(orders)]).astype(np.int32)
    start = np.array([x for st in starts for x in st], dtype=float)
    dur_table = np.stack([costs.fwd_s, costs.bwd_s, costs.wgt_s]).astype(float)
    return PipelineRun(
        device=np.repeat(np.arange(p, dtype=np.int32), sizes),
        kind=kind,
        vstage=vstage,
        microbatch=np.concatenate([o.microbatch for o in orders]).astype(np.int32),
        start_s=start,
        end_s=start + dur_table[kind, vstage],
        num_devices=p,
    )


def inflight_peak(orders: Sequence[OpOrder], split_backward: bool) -> np.ndarray:
    """Peak number of micro-batch activations held per device (per chunk counted
    separately): +1 at each F, -1 when the last backward op of that micro-batch
    frees it (W when the backward is split, B otherwise)."""
    free_kind = WGT if split_backward else BWD
    peaks = np.zeros(len(orders), dtype=np.int64)
    for s, o in enumerate(orders):
        delta = np.where(o.kind == FWD, 1, np.where(o.kind == free_kind, -1, 0))
        peaks[s] = int(np.cumsum(delta).max()) if delta.size else 0
    return peaks


def execute_flushed(num_stages: int, num_microbatches: int, costs: PipelineCosts, gpipe: bool = False) -> PipelineRun:
    """`execute` for 1F1B (`gpipe=False`) or GPipe with one model chunk per device, as
    an array recurrence over steps instead of an event loop (same answer, tested).

    Forward F(s, m) happens at step m + s: it waits for its device's previous op and
    for F(s - 1, m), which happened at the previous step. All backwards of micro-batch
    m happen in one half-step (1F1B: after step p - 1 + m, right behind each device's
    forward of that step; GPipe: after every forward), from the last stage to the
    first: B(s, m) ends at y_s = max(c_s + B_s, y_{s+1} + b_s + B_s), c_s being the
    device's clock, a max-plus chain solved for all devices at once with a reversed
    cumulative maximum. About 2M + p numpy steps instead of 2pM Python events."""
    p, n = num_stages, num_microbatches
    if costs.num_virtual_stages != p:
        raise StrategyError(f"{costs.num_virtual_stages} virtual stages for {p} devices: one chunk per device only")
    fwd = costs.fwd_s.astype(float)
    bwd = costs.bwd_s.astype(float)
    sendf = np.concatenate([[0.0], costs.send_fwd_s.astype(float)])  # into stage s from s - 1
    hop = np.concatenate([costs.send_bwd_s.astype(float) + bwd[:-1], [0.0]])  # b_s + B_s, s < p - 1
    suffix = np.cumsum(hop[::-1])[::-1]  # G_s = sum_{k=s}^{p-2} (b_k + B_k)
    f_start = np.zeros((p, n))
    b_start = np.zeros((p, n))
    clock = np.zeros(p)
    f_end_prev = np.zeros(p)  # F(s, t - 1 - s) of the previous step, by device
    stages = np.arange(p)
    first_b = (n + p - 2) if gpipe else (p - 1)  # the step after which micro-batch 0's backward runs
    for t in range(n + p - 1):
        m = t - stages
        ok = (m >= 0) & (m < n)
        upstream = np.concatenate([[0.0], f_end_prev[:-1]]) + sendf
        ready = np.where(stages > 0, upstream, 0.0)
        start = np.maximum(clock, ready)
        f_start[stages[ok], m[ok]] = start[ok]
        end = start + fwd
        clock = np.where(ok, end, clock)
        f_end_prev = np.where(ok, end, f_end_prev)
        mb = t - first_b
        if 0 <= mb < n:
            own = clock + bwd - suffix
            y = suffix + np.maximum.accumulate(own[::-1])[::-1]
            b_start[:, mb] = y - bwd
            clock = y
    for mb in range(max(n + p - 1 - first_b, 0), n):  # GPipe: backwards after the last forward step
        own = clock + bwd - suffix
        y = suffix + np.maximum.accumulate(own[::-1])[::-1]
        b_start[:, mb] = y - bwd
        clock = y
    orders = [one_f_one_b_order(n, n if gpipe else min(p - s - 1, n)) for s in range(p)]
    starts = [np.where(o.kind == FWD, f_start[s, o.microbatch], b_start[s, o.microbatch]).tolist()
              for s, o in enumerate(orders)]
    return _run_from_starts(orders, costs, starts)
