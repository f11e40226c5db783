"""Plan a model for many global batch sizes: baselines, exact hybrid search, and
verification of the best candidates with the simulator; in parallel over processes."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace

from paraplan.core import Cluster, CommModel, GradientSync, ModelProfile
from paraplan.core.limits import MAX_NUM_MICROBATCHES
from paraplan.plan.baselines import data_parallel_estimates
from paraplan.plan.problem import MemorySettings, PlanProblem
from paraplan.plan.records import HybridPlan
from paraplan.plan.search import NoFeasiblePlanError, plan_hybrid
from paraplan.plan.verify import simulate_data_parallel, simulate_plan

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
    hybrid_sim = nan
    if settings.verify:
        baselines: tuple[tuple[str, GradientSync], ...] = (
            ("dp_no_overlap", "end"), ("dp_overlap", "overlap"), ("dp_p3", "p3"))
        for key, mode in baselines:
            s = simulate_data_parallel(problem, mode)
            sim[key] = s.speedup if s is not None else nan
        best = None
        for plan in candidates:
            s = simulate_plan(problem, plan)
            if s is not None and (best is None or s.speedup > best[1]):
                best = (plan, s.speedup)
        if best is not None:
            chosen, hybrid_sim = best
    return PlanRow(
        gbs=gbs,
        dp_no_overlap=sim["dp_no_overlap"],
        dp_p3=sim["dp_p3"],
        dp_overlap=sim["dp_overlap"],
        best_hybrid=hybrid_sim,
        stages=chosen.describe() if chosen else "",
        planning_time_s=planning_s,
        best_hybrid_est=chosen.speedup if chosen else nan,
        num_microbatches=chosen.num_microbatches if chosen else 0,
        accumulation_steps=dp.accumulation_steps,
        plan=chosen,
        infeasible=infeasible,
        **est,
    )


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
