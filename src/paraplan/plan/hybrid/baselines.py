"""Data-parallel baselines printed beside the best plan (planner estimates; the
simulator re-times all three, `plan/verify.py`). They are candidates of the search
too (`baseline_plans`): a reported best is never slower than any of them.

All devices hold the whole model; a device that cannot hold its share of the batch
at once accumulates gradients over k micro-steps, k = ceil((gbs / N) / max samples),
max samples = (memory - model state) / activation bytes per sample (DAPPLE's
ResNet-50: (16e9 - 2 x 102 MB) / 7e7 = 225).

- no overlap: k (F + B) on gbs / (N k) samples, then one all-reduce of all parameters;
- normal overlap (DDP / Horovod): 25 MB gradient buckets, each all-reduced when the
  backward of the last micro-step has produced it, one after another on the network,
  hiding behind the rest of that backward only;
- P3 (priority-based parameter propagation): per-layer all-reduces, earliest layers
  first, may also overlap the next iteration's first forward, which runs each layer
  once its gradients are synchronised.
The formulas are the objective's for one stage (`objective.data_parallel_latency_s`).
"""

from __future__ import annotations

import math

from paraplan.core import GradientSync
from paraplan.plan.hybrid.objective import data_parallel_latency_s, group_allreduce, make_plan
from paraplan.plan.hybrid.problem import PlanProblem
from paraplan.plan.hybrid.records import DataParallelEstimate, HybridPlan, StageSlot

BASELINES: tuple[tuple[str, GradientSync], ...] = (
    ("dp_no_overlap", "end"), ("dp_overlap", "overlap"), ("dp_p3", "p3"))
"""The baseline columns of the plan CSV and the gradient sync each runs with."""


def accumulation_steps(problem: PlanProblem) -> int:
    """Micro-steps per iteration memory requires; 0 when the model does not fit at all."""
    fit = problem.max_samples_per_device()
    if fit < 1:
        return 0
    per_device = problem.global_batch_size / problem.num_devices
    return max(1, math.ceil(per_device / fit))


def _latencies(problem: PlanProblem, k: int) -> dict[GradientSync, float]:
    n = problem.num_devices
    nodes = problem.cluster.nodes
    samples = problem.global_batch_size / (n * k)
    ar = group_allreduce(problem, n, nodes)
    return {sync: data_parallel_latency_s(problem, n, nodes, k, samples, sync, ar) for _, sync in BASELINES}


def data_parallel_estimates(problem: PlanProblem) -> DataParallelEstimate:
    """The three baselines' iteration times; NaN when the model state does not fit one
    device (no data-parallel plan exists)."""
    k = accumulation_steps(problem)
    single = problem.single_device_s
    if k == 0:
        nan = math.nan
        return DataParallelEstimate(0, nan, nan, nan, single)
    lat = _latencies(problem, k)
    return DataParallelEstimate(k, lat["end"], lat["overlap"], lat["p3"], single)


def baseline_plans(problem: PlanProblem) -> dict[str, HybridPlan]:
    """Each baseline as a plan of the search (one stage on all devices, k accumulation
    steps), keyed by its CSV column; empty when the model state does not fit one device
    or a device would get less than one sample per micro-step."""
    k = accumulation_steps(problem)
    n = problem.num_devices
    if k == 0 or problem.global_batch_size < n * k:
        return {}
    lat = _latencies(problem, k)
    slots = (StageSlot(0, problem.num_layers, n, 0),)
    return {column: make_plan(problem, n, k, slots, lat[sync], sync) for column, sync in BASELINES}
