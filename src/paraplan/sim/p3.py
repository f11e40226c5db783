"""P3 (priority-based parameter propagation) gradient synchronisation on one device:
per-layer all-reduces served lowest layer first with preemption, gating the next
iteration's forward layer by layer (`paraplan.sim.strategy_sim`'s module doc has the
rules)."""

from __future__ import annotations

import numpy as np

from paraplan.core.errors import StrategyError
from paraplan.core.glossary import NO_MICROBATCH, EventKindCode, StreamCode
from paraplan.core.timeline import TimelineColumns


def p3_comm_segments(release_s: np.ndarray, work_s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Preempt-resume priority service of per-layer all-reduces on one comm stream.

    Layer l is released at `release_s[l]` and needs `work_s[l]` seconds; the stream
    always serves the lowest-numbered pending layer. Releases must not increase with
    the layer index (the backward produces the last layer's gradient first), so the
    newest pending layer is the one served: a stack, O(layers). Returns the service
    segments as (layer, start_s, end_s) arrays in time order."""
    release_s = np.asarray(release_s, dtype=float)
    work_s = np.asarray(work_s, dtype=float)
    if np.any(np.diff(release_s) > 0):
        raise StrategyError("P3 releases must come from the last layer to the first")
    segs: list[tuple[int, float, float]] = []
    stack: list[list] = []  # [layer, remaining seconds]
    clock = -np.inf
    for layer in range(release_s.shape[0] - 1, -1, -1):
        ready = float(release_s[layer])
        while stack and clock < ready:
            top = stack[-1]
            if top[1] <= ready - clock:
                segs.append((top[0], clock, clock + top[1]))
                clock += top[1]
                stack.pop()
            else:
                segs.append((top[0], clock, ready))
                top[1] -= ready - clock
                clock = ready
        clock = max(clock, ready)
        if work_s[layer] > 0:
            stack.append([layer, float(work_s[layer])])
    while stack:
        top = stack.pop()
        segs.append((top[0], clock, clock + top[1]))
        clock += top[1]
    if not segs:
        return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0)
    arr = np.array(segs, dtype=float)
    return arr[:, 0].astype(np.int64), arr[:, 1], arr[:, 2]


def p3_done_s(release_s: np.ndarray, work_s: np.ndarray) -> np.ndarray:
    """When each layer's all-reduce completes under `p3_comm_segments`' service (its
    release time when it has no work)."""
    layers, _, ends = p3_comm_segments(release_s, work_s)
    done = np.array(release_s, dtype=float)
    np.maximum.at(done, layers, ends)
    return done


class _Events:
    """Timeline events collected part by part (device 0, stage 0)."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, stream: int, kind, mb, start, end) -> None:
        start = np.atleast_1d(np.asarray(start, dtype=float))
        n = start.shape[0]
        self.parts.append((np.full(n, stream), np.broadcast_to(kind, (n,)), np.broadcast_to(mb, (n,)),
                           start, np.atleast_1d(np.asarray(end, dtype=float))))

    def columns(self) -> TimelineColumns:
        stream, kind, mb, start, end = (np.concatenate(c) for c in zip(*self.parts, strict=True))
        n = start.shape[0]
        return TimelineColumns(device=np.zeros(n, dtype=np.int32), stream=stream.astype(np.int8),
                               kind=kind.astype(np.int8), stage=np.zeros(n, dtype=np.int32),
                               microbatch=mb.astype(np.int32), start_s=start, end_s=end)


def _gated_forward(events: _Events, f: np.ndarray, synced_s: np.ndarray, bwd_end_s: float, microbatch: int) -> float:
    """The next iteration's first forward, layer l starting only once layers 0..l are
    synchronised (`synced_s`) and the last backward has ended; one op per stretch
    without waiting. Returns when it ends."""
    f_cum = np.cumsum(f)
    f_before = f_cum - f
    gate = np.maximum.accumulate(np.maximum(bwd_end_s, np.maximum.accumulate(synced_s) - f_before))
    # layer l of the next forward runs in [gate_l + f_before_l, gate_l + f_cum_l]; gate
    # rises where it waits
    first = np.flatnonzero(np.concatenate(([True], gate[1:] > gate[:-1])))
    last = np.append(first[1:] - 1, f.shape[0] - 1)
    events.add(StreamCode.COMPUTE, EventKindCode.FWD, microbatch, gate[first] + f_before[first],
               gate[last] + f_cum[last])
    return float(gate[-1] + f_cum[-1])


def p3_steady_state(fwd_s: np.ndarray, bwd_s: np.ndarray, allreduce_s: np.ndarray, microbatches: int,
                    iterations: int = 2) -> tuple[TimelineColumns, float]:
    """Data parallelism with P3 gradient synchronisation on one (pipeline) device.

    `fwd_s`, `bwd_s`: per layer and micro-batch; `allreduce_s`: per layer (0: nothing
    to synchronise); `microbatches`: gradient accumulation steps k (micro-batch i of an
    iteration runs F then B; only the first forward of an iteration waits for the
    previous iteration's all-reduces). Simulates `iterations` (>= 2) iterations and
    returns the timeline columns (device 0, stage 0) and the period of the last one
    (from the start of one iteration's last backward to the next's)."""
    if iterations < 2:
        raise StrategyError(f"P3's steady state needs >= 2 iterations, got {iterations}")
    f = np.asarray(fwd_s, dtype=float)
    b = np.asarray(bwd_s, dtype=float)
    k = int(microbatches)
    f_tot, b_tot = float(f.sum()), float(b.sum())
    b_from = np.cumsum(b[::-1])[::-1]  # backward from the last layer down to layer l
    # the ops between an iteration's first forward and its last backward:
    # B0, F1, B1, ..., F(k-1); then B(k-1)
    mid_dur = np.tile([b_tot, f_tot], k - 1)
    mid_kind = np.tile([EventKindCode.BWD, EventKindCode.FWD], k - 1)
    mid_mb = np.repeat(np.arange(k - 1), 2) + np.tile([0, 1], k - 1)
    events = _Events()
    fwd0_end = f_tot  # iteration 0: nothing to wait for
    events.add(StreamCode.COMPUTE, EventKindCode.FWD, 0, 0.0, f_tot)
    last_bwd = np.zeros(iterations)
    for e in range(iterations):
        base = e * k
        mid_start = fwd0_end + np.cumsum(mid_dur) - mid_dur
        events.add(StreamCode.COMPUTE, mid_kind, base + mid_mb, mid_start, mid_start + mid_dur)
        s = fwd0_end + (k - 1) * (f_tot + b_tot)
        last_bwd[e] = s
        events.add(StreamCode.COMPUTE, EventKindCode.BWD, base + k - 1, s, s + b_tot)
        release = s + b_from
        layer, seg_start, seg_end = p3_comm_segments(release, allreduce_s)
        events.add(StreamCode.COMM, EventKindCode.ALLREDUCE, NO_MICROBATCH, seg_start, seg_end)
        if e == iterations - 1:
            break
        synced = release.copy()
        np.maximum.at(synced, layer, seg_end)
        fwd0_end = _gated_forward(events, f, synced, s + b_tot, base + k)
    return events.columns(), float(last_bwd[-1] - last_bwd[-2])
