"""Data-parallel baselines printed beside the hybrid plan (planner estimates; the
simulator re-times all three, `plan/verify.py`).

All devices hold the whole model; a device that cannot hold its share of the batch
at once accumulates gradients over k micro-steps, k = ceil((gbs / N) / max samples),
max samples = (memory - model state) / activation bytes per sample (DAPPLE's
ResNet-50: (16e9 - 2 x 102 MB) / 7e7 = 225).

- no overlap: k (F + B) on gbs / (N k) samples, then one all-reduce of all parameters;
- normal overlap (DDP / Horovod): each layer's all-reduce starts when its backward of the
  last micro-step ends, one after another on the network, hiding behind the rest of
  that backward only;
- P3 (priority-based parameter propagation): all-reduces may also overlap the next
  iteration's forward, earliest layers first. Steady-state estimate: the period is
  at least the compute plus the first layer's all-reduce (its gradient is the last to
  appear and the first needed) and at least the network time of all layers.
"""

from __future__ import annotations

import math

import numpy as np

from paraplan.plan.problem import PlanProblem
from paraplan.plan.records import DataParallelEstimate


def accumulation_steps(problem: PlanProblem) -> int:
    """Micro-steps per iteration memory requires; 0 when the model does not fit at all."""
    fit = problem.max_samples_per_device()
    if fit < 1:
        return 0
    per_device = problem.global_batch_size / problem.num_devices
    return max(1, math.ceil(per_device / fit))


def data_parallel_estimates(problem: PlanProblem) -> DataParallelEstimate:
    """The three baselines' iteration times; NaN when the model state does not fit one
    device (no data-parallel plan exists)."""
    k = accumulation_steps(problem)
    single = problem.single_device_s
    if k == 0:
        nan = math.nan
        return DataParallelEstimate(0, nan, nan, nan, single)
    prof = problem.profile
    n = problem.num_devices
    sub = problem.global_batch_size / (n * k)
    fwd = prof.fwd_s_at(sub)
    bwd = prof.bwd_s_at(sub)
    step = float(fwd.sum() + bwd.sum())
    compute = k * step
    nodes = problem.cluster.nodes
    ar_layers = np.atleast_1d(problem.allreduce_s(prof.param_bytes, n, nodes)).astype(float)
    ar_all = float(problem.allreduce_s(prof.total_param_bytes, n, nodes))
    no_overlap = compute + ar_all

    # last micro-step's backward runs from the last layer to the first
    bwd_start = compute - float(bwd.sum())
    ready = bwd_start + np.cumsum(bwd[::-1])  # layer L-1 first
    clock = bwd_start
    for rdy, dur in zip(ready, ar_layers[::-1], strict=True):
        clock = max(clock, float(rdy)) + float(dur)
    overlap = max(compute, clock)

    first_layer_ar = float(ar_layers[0]) if ar_layers.size else 0.0
    p3 = min(overlap, max(compute + first_layer_ar, float(ar_layers.sum())))
    return DataParallelEstimate(k, no_overlap, overlap, p3, single)
