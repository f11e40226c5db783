"""Exact search for the plan of least estimated latency (`objective.py`).

Search space, for one global batch on N devices:
- a pipeline copy of W devices (W divides N, at most `max_pipeline_devices`), repeated
  N / W times (copy c holds devices c W .. c W + W - 1);
- S contiguous layer stages; stage s runs on r_s devices of each copy, packed left to
  right (sum r_s <= W; devices left over stay idle), so a stage's replicas are R r_s
  devices and its node span follows from its offset;
- M micro-batches per copy (M divides the copy's share, micro-batch >= `min_micro_batch_size`),
  with S <= M and at least one sample per replica; every stage must fit in device memory
  with the 1F1B in-flight count;
- the gradient synchronisation: `end` for pipelines; one stage (data parallelism with M
  accumulation steps) also `overlap` or `p3`;
- and the data-parallel baselines themselves (`baselines.baseline_plans`: all N devices,
  the accumulation memory requires), so the answer is never slower than any of them.

How it stays exact and fast:
1. Closed forms first. The baselines, every one-stage plan (each width, micro-batch
   count, replica count and gradient sync; one evaluation per distinct (replicas,
   micro-batches, nodes)) and balanced even-width pipelines give the incumbent; then a
   heuristic pass (the dynamic program below, each state extending only its
   `BEAM_WIDTH` labels of least latency so far, no dominance; a label that cannot be
   among them when it is offered is never built) on the `BEAM_PAIRS` (W, M)
   pairs whose balanced pipelines are fastest finds a close pipeline, so the exact pass
   prunes from the start. It only lowers the incumbent, with real plans.
2. Pipelines of two or more stages, one (W, M) pair at a time in the order of a lower
   bound that holds for every pipeline of the pair; a pair whose bound cannot beat the
   incumbent is skipped whole. The bound: latency >= (M - 1) B + path, where the
   block B is at least the perfectly spread compute sum(var) b / W, the cheapest
   boundary transfer (a pipeline has one) and each layer's time on the most replicas a
   stage may have; the path is at least the fixed times, the spread compute and that
   transfer. So is a pair none of whose first stages passes the label bound below
   with every block floor at 0 (checked before its floors are built).
3. Dynamic programming over states (layers covered j, devices used d, stages s, "last
   stage sits in one node") whose values are Pareto sets of labels (block so far, path
   so far, the all-reduce lines that can still show in the ending, largest total stage
   count memory allows). A label is dropped when another label of its state is at
   least as good in every respect that can matter later: the latency is non-decreasing
   in the final block when S <= M (its slope is M - 1 - s* >= 0), which makes the
   dominance test sound; only final blocks up to the block cap B_cap below need
   comparing (a plan with a larger block cannot beat the incumbent). An all-reduce
   line A_t - t beta that is <= 0 at the label's block stays <= 0 (the block only
   grows), so it is dropped from the label.
   Branch and bound prunes, all with bounds that hold for every completion:
   - the stage time: M c + path so far <= incumbent;
   - the block: every plan that beats the incumbent has B <= B_cap (from the path
     bound above), so the layers after a stage need at least need[j] devices, the
     fewest that cover layers j.. with every stage at most B_cap, every boundary
     transfer at most B_cap and every stage in memory (a small dynamic program over
     layers); a stage that leaves fewer devices is not extended;
   - a label's latency: its block and path, the next boundary's transfer, the rest's
     compute spread over the devices left (and its fixed times), and the ending at the
     smallest block the plan can have.
   Transitions are vectorised over the (replica count, stop) pairs of a stage and the
   labels of a state (a stage's compute and memory per replica count and stop once per
   layer, for all states there); the dominance test runs inline in `Bucket.insert`.
The labels live in `labels.py`, the bounds in `bounds.py`, the dynamic program in
`pipelines.py`.
Tests compare the result with exhaustive enumeration on small instances.
"""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np

from paraplan.core import ConfigError, GradientSync, ParaplanError
from paraplan.plan.hybrid.baselines import baseline_plans
from paraplan.plan.hybrid.bounds import TOL, Found, Incumbent, pair_bounds
from paraplan.plan.hybrid.objective import (
    GroupAllReduce,
    data_parallel_latency_s,
    evaluate_layout,
    group_allreduce,
    make_plan,
)
from paraplan.plan.hybrid.pipelines import search_pair
from paraplan.plan.hybrid.problem import PlanProblem
from paraplan.plan.hybrid.records import HybridPlan, StageSlot

BEAM_WIDTH = 2
"""Labels per state of the heuristic pass that seeds the incumbent of the exact one."""
BEAM_PAIRS = 1
"""(W, M) pairs the heuristic pass visits: the one(s) whose balanced pipelines are fastest."""
_SYNCS: tuple[GradientSync, ...] = ("end", "overlap", "p3")


class NoFeasiblePlanError(ParaplanError):
    """No plan of the search space fits in device memory."""


# ---- one stage: data parallelism in closed form ----

def _single_stage(problem: PlanProblem, pairs: list[tuple[int, int]], inc: Incumbent,
                  syncs: tuple[GradientSync, ...]) -> None:
    """Every one-stage plan of the search space in every gradient sync; plans with the
    same replicas, micro-batches and node span are one plan (evaluated once)."""
    n_layers = problem.num_layers
    seen: set[tuple[int, int, int]] = set()
    ar_cache: dict[tuple[int, int], GroupAllReduce] = {}
    for w, m in pairs:
        copies = problem.num_devices // w
        b = problem.global_batch_size / (copies * m)
        r = np.arange(1, min(w, math.floor(b)) + 1)
        if r.size == 0:
            continue
        samples = b / r
        compute = m * problem.compute_s(0, n_layers, samples)
        for k in np.flatnonzero(compute <= inc.latency_s * TOL):
            width = int(r[k])
            if problem.stage_max_inflight(0, n_layers, float(samples[k])) < 1:
                continue
            nodes = problem.nodes_spanned(0, width, w, copies)
            key = (copies * width, m, nodes)
            if key in seen:
                continue
            seen.add(key)
            group = (copies * width, nodes)
            if group not in ar_cache:
                ar_cache[group] = group_allreduce(problem, *group)
            slots = (StageSlot(0, n_layers, width, 0),)
            for sync in syncs:
                lat = data_parallel_latency_s(problem, copies * width, nodes, m, float(samples[k]), sync,
                                              ar_cache[group])
                inc.offer(lat, w, m, slots, sync)


# ---- pipelines: a first bound ----

def _seed_incumbent(problem: PlanProblem, pairs: list[tuple[int, int]],
                    inc: Incumbent) -> dict[tuple[int, int], float]:
    """A first bound for branch and bound: for every (W, M), every stage count S >= 2
    dividing W, S stages of W / S devices over compute-balanced layer ranges. Bounds
    only; the exact pass finds these plans again if they are optimal. Returns each
    pair's best such latency (the heuristic pass's order)."""
    n_layers = problem.num_layers
    best: dict[tuple[int, int], float] = {}
    work = problem.var_prefix_s_per_sample + problem.fixed_prefix_s
    for w, m in pairs:
        for num_stages in range(2, min(w, m, n_layers) + 1):
            if w % num_stages:
                continue
            targets = work[-1] * np.arange(1, num_stages) / num_stages
            cuts = np.searchsorted(work, targets).clip(1, n_layers - 1)
            bounds = [0, *sorted(set(int(c) for c in cuts)), n_layers]
            if len(bounds) != num_stages + 1:
                continue
            width = w // num_stages
            slots = tuple(StageSlot(bounds[s], bounds[s + 1], width, s * width) for s in range(num_stages))
            plan = evaluate_layout(problem, w, m, slots)
            if plan is not None:
                inc.offer(plan.latency_s, w, m, slots)
                best[w, m] = min(best.get((w, m), math.inf), plan.latency_s)
    return best



def search_space(problem: PlanProblem) -> list[tuple[int, int]]:
    """(pipeline devices W, micro-batches M) pairs, widest pipelines first."""
    pairs = []
    for w in sorted(problem.pipeline_widths(), reverse=True):
        for m in problem.microbatch_counts(problem.num_devices // w):
            pairs.append((w, m))
    return pairs


def plan_hybrid(problem: PlanProblem, candidates: int = 3,
                gradient_syncs: tuple[GradientSync, ...] = _SYNCS) -> list[HybridPlan]:
    """The best plan first, then up to `candidates - 1` runners-up the search completed
    (pipelines, data parallelism in each gradient sync, the data-parallel baselines).
    `gradient_syncs`: those one-stage plans may use; ("end",) is DAPPLE's own space (its
    planner's objective, no overlap). Raises `NoFeasiblePlanError` when no plan fits and
    `ConfigError` for a candidate count below 1 or an unknown or empty gradient sync set."""
    if candidates < 1:
        raise ConfigError("candidates", f"must be >= 1, got {candidates}")
    unknown = [sync for sync in gradient_syncs if sync not in _SYNCS]
    if unknown or not gradient_syncs:
        raise ConfigError("gradient_syncs", f"must be a non-empty subset of {_SYNCS}, got {tuple(gradient_syncs)}")
    inc = Incumbent()
    pairs = search_space(problem)
    baselines = {k: p for k, p in baseline_plans(problem).items() if p.strategy.gradient_sync in gradient_syncs}
    for plan in baselines.values():
        inc.offer(plan.latency_s, plan.pipeline_devices, plan.num_microbatches,
                  (StageSlot(0, problem.num_layers, plan.pipeline_devices, 0),), plan.strategy.gradient_sync)
    if not pairs and not baselines:
        raise NoFeasiblePlanError(
            f"global batch {problem.global_batch_size} cannot be split into micro-batches of "
            f">= {problem.min_micro_batch_size} samples on any pipeline width of {problem.num_devices} devices"
        )
    _single_stage(problem, pairs, inc, gradient_syncs)
    seeds = _seed_incumbent(problem, pairs, inc)
    pipelines = [(w, m) for w, m in pairs if min(m, w, problem.num_layers) >= 2]
    ordered = sorted(((pair_bounds(problem, w, m), w, m) for w, m in pipelines),
                     key=lambda item: item[0].latency_lb_s(item[2]))
    # a heuristic pass for a close incumbent, the pairs whose balanced pipelines are
    # fastest first (a close incumbent early prunes the rest of it), then the exact one
    promising = sorted(ordered, key=lambda item: seeds.get((item[1], item[2]), math.inf))
    for bounds, w, m in promising[:BEAM_PAIRS]:
        if bounds.latency_lb_s(m) <= inc.latency_s * TOL:
            search_pair(problem, w, m, inc, bounds, BEAM_WIDTH)
    for bounds, w, m in ordered:
        if bounds.latency_lb_s(m) > inc.latency_s * TOL:
            break
        search_pair(problem, w, m, inc, bounds)
    if not inc.found:
        raise NoFeasiblePlanError(_nothing_fits(problem))
    return _ranked(problem, inc.found, candidates)


def _ranked(problem: PlanProblem, found: list[Found], candidates: int) -> list[HybridPlan]:
    """Best first; near-ties (within 1e-9): fewer stages, fewer micro-batches, then the
    simpler gradient sync first."""
    best = min(f.latency_s for f in found)

    def key(f: Found):
        tied = f.latency_s <= best * TOL
        return (not tied, 0.0 if tied else f.latency_s, len(f.slots), f.microbatches, _SYNCS.index(f.gradient_sync))

    ranked = sorted(found, key=key)
    plans: list[HybridPlan] = []
    seen = set()
    for f in ranked:
        plan = make_plan(problem, f.pipeline_devices, f.microbatches, f.slots, f.latency_s, f.gradient_sync)
        tag = (plan.describe(), f.microbatches)  # copies of one layout differ only in placement
        if tag in seen:
            continue
        seen.add(tag)
        plans.append(plan)
        if len(plans) >= candidates:
            break
    # the best single-stage plan (data parallelism with accumulation) is always re-timed
    single = [f for f in ranked if len(f.slots) == 1]
    if single and all(p.num_stages > 1 for p in plans):
        f = single[0]
        plans.append(make_plan(problem, f.pipeline_devices, f.microbatches, f.slots, f.latency_s, f.gradient_sync))
    return plans


def _nothing_fits(problem: PlanProblem) -> str:
    mem = problem.memory
    return (
        f"no plan fits in {mem.memory_bytes / 1e9:g} GB per device for global batch "
        f"{problem.global_batch_size} on {problem.num_devices} devices (model state "
        f"{mem.model_state_factor:g} x {problem.profile.total_param_bytes / 1e9:.3g} GB of parameters "
        f"plus activations); use more devices, a larger --memory-gb or a smaller batch"
    )


def enumerate_hybrid(problem: PlanProblem, gradient_syncs: tuple[GradientSync, ...] = _SYNCS) -> HybridPlan:
    """Every plan of the search space (every layout, each one-stage layout in every
    gradient sync of `gradient_syncs`, the data-parallel baselines with those syncs),
    evaluated one by one (small instances only: tests compare it with `plan_hybrid`)."""
    best: HybridPlan | None = None
    for plan in baseline_plans(problem).values():
        if plan.gradient_sync in gradient_syncs and (best is None or plan.latency_s < best.latency_s):
            best = plan
    n_layers = problem.num_layers
    for w, m in search_space(problem):
        for num_stages in range(1, min(m, w, n_layers) + 1):
            syncs = gradient_syncs if num_stages == 1 else ("end",)
            for cuts in combinations(range(1, n_layers), num_stages - 1):
                bounds = (0, *cuts, n_layers)
                for widths in _compositions_at_most(w, num_stages):
                    slots, offset = [], 0
                    for s in range(num_stages):
                        slots.append(StageSlot(bounds[s], bounds[s + 1], widths[s], offset))
                        offset += widths[s]
                    for sync in syncs:
                        found = evaluate_layout(problem, w, m, slots, sync)
                        if found is not None and (best is None or found.latency_s < best.latency_s):
                            best = found
    if best is None:
        raise NoFeasiblePlanError(_nothing_fits(problem))
    return best


def _compositions_at_most(total: int, parts: int):
    """Tuples of `parts` integers >= 1 with sum <= total."""
    if parts == 0:
        yield ()
        return
    for first in range(1, total - parts + 2):
        for rest in _compositions_at_most(total - first, parts - 1):
            yield (first, *rest)


__all__ = ["NoFeasiblePlanError", "enumerate_hybrid", "plan_hybrid", "search_space"]
