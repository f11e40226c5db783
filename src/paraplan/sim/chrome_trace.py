"""Timeline -> Chrome trace event JSON (opens in https://ui.perfetto.dev and
chrome://tracing): one process per device, one thread per stream. Events that
overlap on one stream (e.g. transfers that do not contend) go to extra lanes
("comm #2", ...) so every thread holds properly nested slices."""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from paraplan.core.timeline import KINDS, STREAMS, Timeline

_US = 1e6


def _lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Greedy lane per event so events in one lane never overlap (input in start order)."""
    lane_free: list[float] = []
    lanes = np.zeros(start.shape[0], dtype=np.int64)
    for i, (s, e) in enumerate(zip(start.tolist(), end.tolist(), strict=True)):
        for j, free in enumerate(lane_free):
            if free <= s + 1e-12:
                lane_free[j] = e
                lanes[i] = j
                break
        else:
            lanes[i] = len(lane_free)
            lane_free.append(e)
    return lanes


def to_chrome_trace(timeline: Timeline) -> dict:
    """A `{"traceEvents": [...], "displayTimeUnit": "ms"}` dict; times in microseconds.

    Slice names read like the Gantt labels: `F3` (forward of micro-batch 3, counted
    from 1 across iterations), `B3`, `Bi3`/`W3` (split backward), `allreduce`."""
    events: list[dict] = []
    tl = timeline
    order = np.lexsort((tl.start_s, tl.stream, tl.device))
    dev, stream = tl.device[order], tl.stream[order]
    kind, stage, mb = tl.kind[order], tl.stage[order], tl.microbatch[order]
    start, end = tl.start_s[order], tl.end_s[order]
    short = {"fwd": "F", "bwd": "B", "bwd_input": "Bi", "bwd_weight": "W", "send": "send", "recv": "recv"}
    tids: dict[tuple[int, int, int], int] = {}
    boundaries = np.flatnonzero(np.r_[True, (dev[1:] != dev[:-1]) | (stream[1:] != stream[:-1]), True])
    for a, b in pairwise(boundaries.tolist()):
        lanes = _lanes(start[a:b], end[a:b])
        d, st = int(dev[a]), int(stream[a])
        for i in range(a, b):
            key = (d, st, int(lanes[i - a]))
            if key not in tids:
                tids[key] = st * 1000 + int(lanes[i - a])
            k = KINDS[int(kind[i])]
            name = f"{short[k]}{int(mb[i]) + 1}" if int(mb[i]) >= 0 and k in short else k
            events.append({
                "name": name, "cat": k, "ph": "X", "pid": d, "tid": tids[key],
                "ts": float(start[i]) * _US, "dur": float(end[i] - start[i]) * _US,
                "args": {"stage": int(stage[i]), "microbatch": int(mb[i])},
            })
    meta: list[dict] = []
    for d in sorted({int(x) for x in np.unique(tl.device)}):
        meta.append({"name": "process_name", "ph": "M", "pid": d, "args": {"name": f"device {d}"}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": d, "args": {"sort_index": d}})
    for (d, st, lane), tid in sorted(tids.items()):
        label = STREAMS[st] + (f" #{lane + 1}" if lane else "")
        meta.append({"name": "thread_name", "ph": "M", "pid": d, "tid": tid, "args": {"name": label}})
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "step_time_s": tl.step_time_s, "bubble_fraction": tl.bubble_fraction,
            "schedule": tl.schedule, "microbatches": tl.microbatches, "iterations": tl.iterations,
            # a transformer run's timeline has no one-device baseline (it would not fit)
            **({"speedup": tl.speedup} if np.isfinite(tl.speedup) else {}),
        },
    }
