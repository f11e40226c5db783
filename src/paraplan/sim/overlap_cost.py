"""What an overlapped collective costs the compute beside it (the engine's side of
"overlap is not free", docs/execution-model.md).

NCCL runs every collective, point-to-point transfers included, as CUDA kernels on the
GPU's SMs (one thread block per channel), reading and writing HBM, so the kernels beside
it run slower. A collective of time c beside compute of time g takes, as a pair,

    max(c, g) + share x min(c, g)

with `share` in [0, 1] (0: hidden for free, 1: no overlap at all; which share applies
where: `paraplan.predict.overlap_share`), the rule `paraplan.predict.pass_cost.PassCost.comm_s`
applies to the overlaps inside a pass. Here it is applied where the engine itself overlaps a
collective with compute: the data-parallel gradient buckets on the communication stream
(`paraplan.sim.execution`, `paraplan.sim.dualpipe_iteration`). The overlap is measured
on the run itself: the time a bucket spends beside one of the rank's compute ops. The
compute it slows is the rank's last ops of the iteration, so the added time lands on the
rank's end, as a pair's would: max(compute end, reduction end) + share x overlap. It is
not passed on to the ranks upstream that wait for those ops (exact with one pipeline
rank, or where only the first rank's buckets run beside its compute; a lower bound
otherwise, docs/execution-model.md).
"""

from __future__ import annotations

import numpy as np


def pair_added_s(comm_s: float | np.ndarray, compute_s: float | np.ndarray, share: float) -> np.ndarray:
    """What a collective of `comm_s` beside compute of `compute_s` adds to the compute:
    the part of it the compute cannot hide plus the contention share of the overlap,
    max(c - g, 0) + share x min(c, g)."""
    c, g = np.asarray(comm_s, dtype=float), np.asarray(compute_s, dtype=float)
    return np.maximum(c - g, 0.0) + share * np.minimum(c, g)


def overlap_with_ops_s(start_s: np.ndarray, end_s: np.ndarray, op_start_s: np.ndarray, op_end_s: np.ndarray) -> float:
    """Seconds of the intervals [start_s, end_s) that some op [op_start_s, op_end_s) of one
    device covers: the ops of a device never overlap each other, nor do the buckets of one
    communication stream, so the sum over pairs counts each moment once."""
    if start_s.size == 0 or op_start_s.size == 0:
        return 0.0
    later = op_end_s > start_s.min()  # the rest end before the first bucket starts
    a, b = op_start_s[later], op_end_s[later]
    inside = np.minimum(end_s[:, None], b[None, :]) - np.maximum(start_s[:, None], a[None, :])
    return float(np.maximum(inside, 0.0).sum())


def contended_end_s(clock_end_s: float, compute_end_s: float, overlap_s: float, share: float) -> float:
    """A rank's end once its reduction (ending at `clock_end_s`) and compute (ending at
    `compute_end_s`) are done, the compute slowed by `share` x the `overlap_s` the two ran
    side by side."""
    return max(compute_end_s, clock_end_s) + share * overlap_s
