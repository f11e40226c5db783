"""Re-time plans with the simulator (`paraplan.sim.simulate`): the speedups a plan
reports are simulated; the planner's own estimates sit beside them.

The simulator's memory model counts parameters + gradients + optimizer state x
parameters, so the planner's `model_state_factor` (weights, gradients and optimizer
state, in parameter bytes) maps to the simulator's `optimizer_state_factor =
model_state_factor - 2` (one parameter copy for the weights, one for the gradients).

The three data-parallel baselines run as `Strategy.gradient_sync` "end" (no overlap),
"overlap" (DDP buckets) and "p3" (per-layer all-reduces, lowest layer first,
overlapping the next iteration's forward), with the estimate's gradient accumulation
(`accumulation_steps` micro-batches); beyond `MAX_NUM_MICROBATCHES` micro-steps the
step time is extrapolated from two short runs (it is affine in the micro-step count),
so a huge global batch costs no more to verify than a small one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from paraplan.core import Strategy, StrategyError
from paraplan.core.glossary import GradientSync
from paraplan.core.limits import MAX_NUM_MICROBATCHES
from paraplan.plan.hybrid.baselines import accumulation_steps
from paraplan.plan.hybrid.problem import PlanProblem
from paraplan.plan.hybrid.records import HybridPlan

WEIGHTS_AND_GRADIENTS = 2.0  # parameter copies of model state besides the optimizer's


@dataclass(frozen=True)
class SimulatedStep:
    """One simulated configuration: its step time, speedup and peak device memory."""

    step_time_s: float
    speedup: float
    peak_mem_bytes: float


def _simulate(problem: PlanProblem, strategy: Strategy, global_batch_size: float | None = None) -> SimulatedStep | None:
    from paraplan.sim import simulate

    batch = problem.global_batch_size if global_batch_size is None else global_batch_size
    try:
        tl = simulate(problem.profile, problem.cluster, problem.comm, strategy, batch,  # type: ignore[arg-type]
                      optimizer_state_factor=max(0.0, problem.memory.model_state_factor - WEIGHTS_AND_GRADIENTS))
    except StrategyError:
        return None
    peak = max(tl.peak_mem_bytes) if tl.peak_mem_bytes else math.nan
    return SimulatedStep(tl.step_time_s, tl.speedup, peak)


def simulate_plan(problem: PlanProblem, plan: HybridPlan) -> SimulatedStep | None:
    return _simulate(problem, plan.strategy)


def simulate_data_parallel(problem: PlanProblem, gradient_sync: GradientSync) -> SimulatedStep | None:
    """Pure data parallelism on every device with `gradient_sync` ("end", "overlap",
    "p3"); None when the model state does not fit one device."""
    k = accumulation_steps(problem)
    if k == 0:
        return None
    if k <= MAX_NUM_MICROBATCHES:
        return _simulate(problem, _data_parallel(problem, k, gradient_sync))
    # Beyond the simulation bound: with one stage, each further micro-step adds one
    # forward and backward on every device and changes nothing else, so the step time
    # is affine in k (exactly: the simulator's k = 1..50 lie on one line to 1e-14).
    # Two small runs at the same micro-step size give the line.
    per_step = problem.global_batch_size / k
    runs = [_simulate(problem, _data_parallel(problem, j, gradient_sync), per_step * j) for j in _ANCHORS]
    if runs[0] is None or runs[1] is None:
        return None
    slope = runs[1].step_time_s - runs[0].step_time_s
    step = runs[1].step_time_s + (k - _ANCHORS[1]) * slope
    return SimulatedStep(step, problem.single_device_s / step, runs[1].peak_mem_bytes)


_ANCHORS = (3, 4)


def _data_parallel(problem: PlanProblem, accumulation: int, gradient_sync: GradientSync) -> Strategy:
    return Strategy(data_parallel_size=problem.num_devices, pipeline_model_parallel_size=1,
                    num_microbatches=accumulation, gradient_sync=gradient_sync)
