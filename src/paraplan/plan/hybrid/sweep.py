"""Plan a model for many global batch sizes: baselines, exact search, and
verification of the best candidates with the simulator; in parallel over processes.

The reported plan (`best_hybrid`, `stages`) is the fastest simulated of the search's
best candidates and the three data-parallel baselines, which are candidates of the
same search: it is never slower than a baseline beside it. A pure data-parallel
answer reads `[0-175]x16 sync=p3` (every layer on 16 devices, P3)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace

from paraplan.core import Cluster, CommModel, ModelProfile, Strategy
from paraplan.core.limits import MAX_NUM_MICROBATCHES
from paraplan.plan.hybrid.baselines import BASELINES, baseline_plans, data_parallel_estimates
from paraplan.plan.hybrid.problem import MemorySettings, PlanProblem
from paraplan.plan.hybrid.records import HybridPlan
from paraplan.plan.hybrid.search import NoFeasiblePlanError, plan_hybrid
from paraplan.plan.hybrid.verify import simulate_data_parallel, simulate_plan

COLUMNS: tuple[str, ...] = (
    "gbs", "dp_no_overlap", "dp_p3", "dp_overlap", "best_hybrid", "stages", "planning_time_s",
    "dp_no_overlap_est", "dp_p3_est", "dp_overlap_est", "best_hybrid_est",
)


@dataclass(frozen=True)
class PlanSettings:
    """Everything but the batch size."""

    profile: ModelProfile
    cluster: Cluster
    comm: CommModel
    memory: MemorySettings
    min_micro_batch_size: int = 1
    max_pipeline_devices: int = 0
    candidates: int = 3  # plans re-timed with the simulator
    verify: bool = True

    def problem(self, gbs: int) -> PlanProblem:
        return PlanProblem(self.profile, self.cluster, self.comm, self.memory, gbs,
                           self.min_micro_batch_size, self.max_pipeline_devices)


@dataclass(frozen=True)
class PlanRow:
    """One batch size: speedups (simulated and estimated), the chosen plan, timing."""

    gbs: int
    dp_no_overlap: float
    dp_p3: float
    dp_overlap: float
    best_hybrid: float
    stages: str
    planning_time_s: float
    dp_no_overlap_est: float
    dp_p3_est: float
    dp_overlap_est: float
    best_hybrid_est: float
    num_microbatches: int = 0
    accumulation_steps: int = 0
    plan: HybridPlan | None = None
    infeasible: str = ""  # why no hybrid plan fits (empty when one does)

    def as_record(self) -> dict[str, object]:
        return {c: getattr(self, c) for c in COLUMNS}

    @property
    def hybrid_est_vs_sim(self) -> float:
        """Estimate / simulation - 1 for the chosen hybrid plan."""
        if not (self.best_hybrid > 0 and self.best_hybrid_est > 0):
            return math.nan
        return self.best_hybrid_est / self.best_hybrid - 1.0


def slower_than_one_device(row: PlanRow, profile_batch_size: int) -> str | None:
    """Why the best plan of `row` is no speedup at all (below 1x one device), for a
    warning; None when it is one (or there is no plan). Below the profile's batch size
    the per-sample times are the profile's scaled down linearly, and the few samples
    each device gets cannot pay for the gradient exchange."""
    if not row.best_hybrid < 1.0:  # also NaN: no plan
        return None
    what = (f"gbs {row.gbs}: the best plan ({row.stages}) runs at {row.best_hybrid:.2f}x one device, slower than "
            "one device: ")
    if row.gbs < profile_batch_size:
        return what + (f"the global batch is below the profile's batch size ({profile_batch_size}), so each device "
                       "computes a few samples (their times scaled down linearly from the profile) and exchanging "
                       f"gradients costs more than it saves; plan global batches >= {profile_batch_size}, or profile "
                       "at a smaller batch")
    return what + "exchanging gradients and activations costs more than splitting the compute saves at this batch"


def plan_batch(settings: PlanSettings, gbs: int) -> PlanRow:
    """Baselines and the best hybrid plan at one global batch size."""
    problem = settings.problem(gbs)
    start = time.perf_counter()
    dp = data_parallel_estimates(problem)
    infeasible = ""
    try:
        candidates = plan_hybrid(problem, max(1, settings.candidates))
    except NoFeasiblePlanError as exc:
        candidates = []
        infeasible = str(exc) + _microbatch_cap_note(problem)
    planning_s = time.perf_counter() - start
    nan = math.nan
    est = {
        "dp_no_overlap_est": dp.speedup(dp.no_overlap_s),
        "dp_overlap_est": dp.speedup(dp.overlap_s),
        "dp_p3_est": dp.speedup(dp.p3_s),
    }
    sim = {"dp_no_overlap": nan, "dp_overlap": nan, "dp_p3": nan}
    chosen = candidates[0] if candidates else None
    best_sim = nan
    if settings.verify:
        chosen, best_sim, sim = _verify(problem, candidates)
    return PlanRow(
        gbs=gbs,
        dp_no_overlap=sim["dp_no_overlap"],
        dp_p3=sim["dp_p3"],
        dp_overlap=sim["dp_overlap"],
        best_hybrid=best_sim,
        stages=chosen.describe() if chosen else "",
        planning_time_s=planning_s,
        best_hybrid_est=chosen.speedup if chosen else nan,
        num_microbatches=chosen.num_microbatches if chosen else 0,
        accumulation_steps=dp.accumulation_steps,
        plan=chosen,
        infeasible=infeasible,
        **est,
    )


def _verify(problem: PlanProblem, candidates: list[HybridPlan]
            ) -> tuple[HybridPlan | None, float, dict[str, float]]:
    """Simulate the baselines and the candidates; the fastest (the earliest candidate on
    a tie) is the answer. Returns it, its simulated speedup and the baselines' speedups."""
    nan = math.nan
    baselines = baseline_plans(problem)
    sim: dict[str, float] = {}
    known: dict[Strategy, float] = {}
    for key, mode in BASELINES:
        s = simulate_data_parallel(problem, mode)
        sim[key] = s.speedup if s is not None else nan
        if s is not None and key in baselines:
            known[baselines[key].strategy] = s.speedup
    timed: list[tuple[HybridPlan, float]] = []
    for plan in candidates:
        speedup = known.get(plan.strategy)
        if speedup is None:
            s = simulate_plan(problem, plan)
            speedup = s.speedup if s is not None else None
        if speedup is not None:
            timed.append((plan, speedup))
    timed += [(baselines[key], sim[key]) for key, _ in BASELINES if baselines.get(key) and not math.isnan(sim[key])]
    if not timed:
        return (candidates[0] if candidates else None), nan, sim
    best = max(range(len(timed)), key=lambda i: (timed[i][1], -i))
    return timed[best][0], timed[best][1], sim


def _microbatch_cap_note(problem: PlanProblem) -> str:
    """Why a huge batch may find no plan: the search's micro-batch bound."""
    if not any(problem.microbatch_cap_binds(problem.num_devices // w) for w in problem.pipeline_widths()):
        return ""
    return (f" (the search takes at most {MAX_NUM_MICROBATCHES:,} micro-batches per pipeline copy, and at this "
            "batch each of them is larger than a stage holds)")


def _plan_batch_star(args: tuple[PlanSettings, int]) -> PlanRow:
    return plan_batch(*args)


def plan_sweep(settings: PlanSettings, batch_sizes: Sequence[int], jobs: int = 0,
               on_done: Callable[[int], object] | None = None) -> list[PlanRow]:
    """`plan_batch` for every batch size, over `jobs` processes (0: all cores);
    `on_done(1)` after each batch size (progress)."""
    jobs = jobs or os.cpu_count() or 1
    work = [(settings, g) for g in batch_sizes]
    done = on_done or (lambda n: None)
    if jobs == 1 or len(work) == 1:
        rows_in_order = []
        for w in work:
            rows_in_order.append(plan_batch(*w))
            done(1)
        return rows_in_order
    # big batches first: they take longest, so the pool ends evenly
    order = sorted(range(len(work)), key=lambda i: -work[i][1])
    rows: list[PlanRow | None] = [None] * len(work)
    with ProcessPoolExecutor(max_workers=min(jobs, len(work))) as pool:
        futures = {pool.submit(_plan_batch_star, work[i]): i for i in order}
        for future in as_completed(futures):
            rows[futures[future]] = future.result()
            done(1)
    return [r for r in rows if r is not None]


__all__ = ["COLUMNS", "PlanRow", "PlanSettings", "plan_batch", "plan_sweep", "replace"]
