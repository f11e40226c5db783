"""Re-time plans with the simulator (`paraplan.sim.simulate`): the speedups a plan
reports are simulated; the planner's own estimates sit beside them.

The simulator's memory model counts parameters + gradients + optimizer state x
parameters, so the planner's `model_state_factor` (weights, gradients and optimizer
state, in parameter bytes) maps to the simulator's `optimizer_state_factor =
model_state_factor - 2` (one parameter copy for the weights, one for the gradients).

The three data-parallel baselines run as `Strategy.gradient_sync` "end" (no overlap),
"overlap" (DDP buckets) and "p3" (per-layer all-reduces, lowest layer first,
overlapping the next iteration's forward), with the estimate's gradient accumulation
(`accumulation_steps` micro-batches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from paraplan.core import Strategy, StrategyError
from paraplan.core.glossary import GradientSync
from paraplan.plan.baselines import accumulation_steps
from paraplan.plan.problem import PlanProblem
from paraplan.plan.records import HybridPlan

WEIGHTS_AND_GRADIENTS = 2.0  # parameter copies of model state besides the optimizer's


@dataclass(frozen=True)
class SimulatedStep:
    """One simulated configuration: its step time, speedup and peak device memory."""

    step_time_s: float
    speedup: float
    peak_mem_bytes: float


def _simulate(problem: PlanProblem, strategy: Strategy) -> SimulatedStep | None:
    from paraplan.sim import simulate

    try:
        tl = simulate(problem.profile, problem.cluster, problem.comm, strategy, problem.global_batch_size,
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
    strategy = Strategy(data_parallel_size=problem.num_devices, pipeline_model_parallel_size=1, num_microbatches=k,
                        gradient_sync=gradient_sync)
    return _simulate(problem, strategy)
