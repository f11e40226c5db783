"""Exact search for the hybrid plan of least estimated latency (`objective.py`).

Search space, for one global batch on N devices:
- a pipeline copy of W devices (W divides N, at most `max_pipeline_devices`), repeated
  N / W times (copy c holds devices c W .. c W + W - 1);
- S contiguous stages of layers, stage s on r_s >= 1 devices of the copy, packed left to
  right (sum r_s <= W; devices left over stay idle), so a stage's replicas are R r_s
  devices and its node span follows from its offset;
- M micro-batches per copy (M divides the copy's share, micro-batch >= `min_micro_batch_size`),
  with S <= M and at least one sample per replica; every stage must fit in device memory with the 1F1B in-flight count.

Dynamic programming over states (layers covered j, devices used d, stages s, "last
stage sits in one node") whose values are Pareto sets of labels (block so far, path so
far, all-reduce times, largest total stage count memory allows). A label is dropped when
another label of its state is at least as good in every respect that can matter later:
the latency is non-decreasing in the final block when S <= M (its slope is M - 1 - s*
>= 0), which makes the dominance test below sound, so the result equals exhaustive
enumeration's optimum (tests check this on small instances). Branch and bound prunes a
label whose lower bound (remaining compute spread over the remaining devices, the
all-reduces known so far at the smallest possible block) cannot beat the best complete
plan found so far, seeded with balanced even-width layouts.

Cost: fine for tens of devices per pipeline copy (ResNet-50's 176 layers on 16 GPUs:
~0.1-0.3 s per batch size); the label sets grow fast on wide, communication-bound
pipelines, so very large clusters should cap `max_pipeline_devices` (e.g. one machine)
and get their width from copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from paraplan.core import ParaplanError
from paraplan.plan.objective import evaluate_layout, make_plan
from paraplan.plan.problem import PlanProblem
from paraplan.plan.records import HybridPlan, StageSlot

_UNLIMITED = 1 << 30


class NoFeasiblePlanError(ParaplanError):
    """No plan of the search space fits in device memory."""


@dataclass(frozen=True)
class _Label:
    block_s: float
    path_s: float
    allreduce_s: tuple[float, ...]  # per stage so far, front first
    max_stages: int  # total stage count every stage so far can hold in memory
    slots: tuple[StageSlot, ...]

    def ending_s(self, block_s: float) -> float:
        return max(0.0, max(a - s * block_s for s, a in enumerate(self.allreduce_s)))


def _dominates(a: _Label, b: _Label) -> bool:
    """Every completion of b is at least as slow with a's prefix instead.

    For a completion F, b's final block is beta >= b.block; a evaluated at that beta is no
    faster than at its own final block (the latency does not decrease with the block), so
    it suffices that path_a + ending_a(beta) <= path_b + ending_b(beta) for every
    beta >= b.block, and path_a <= path_b (for when F's own all-reduce sets the ending).
    Two cheap sufficient tests of the first condition (ending_b >= its never-hidden
    stage-0 all-reduce; or stage by stage with the path slack), then the exact one."""
    if a.block_s > b.block_s or a.path_s > b.path_s or a.max_stages < b.max_stages:
        return False
    slack = b.path_s - a.path_s
    if a.ending_s(b.block_s) <= slack + max(0.0, b.allreduce_s[0]):
        return True
    if all(x - y <= slack for x, y in zip(a.allreduce_s, b.allreduce_s, strict=True)):
        return True
    return _ending_below(a.allreduce_s, b.allreduce_s, slack, b.block_s)


def _ending_below(ars_a: tuple[float, ...], ars_b: tuple[float, ...], slack: float, beta0: float) -> bool:
    """ending_a(beta) <= slack + ending_b(beta) for every beta >= beta0 (exact): both
    sides are piecewise linear, so checking beta0, every breakpoint beyond it and the
    limit (only the constant stage-0 lines remain) suffices."""
    if max(0.0, ars_a[0]) > slack + max(0.0, ars_b[0]):
        return False
    points = {beta0}
    for ars in (ars_a, ars_b):
        lines = [(0.0, 0)] + [(a, t) for t, a in enumerate(ars)]
        for i, (a1, t1) in enumerate(lines):
            for a2, t2 in lines[i + 1:]:
                if t1 != t2:
                    x = (a1 - a2) / (t1 - t2)
                    if x > beta0:
                        points.add(x)
    for beta in points:
        ea = max(0.0, max(a - t * beta for t, a in enumerate(ars_a)))
        eb = max(0.0, max(a - t * beta for t, a in enumerate(ars_b)))
        if ea > slack + eb:
            return False
    return True


def _insert(bucket: list[_Label], label: _Label) -> None:
    for other in bucket:
        if _dominates(other, label):
            return
    bucket[:] = [o for o in bucket if not _dominates(label, o)]
    bucket.append(label)


@dataclass
class _Incumbent:
    latency_s: float = math.inf
    found: list = field(default_factory=list)  # (latency, pipeline_devices, microbatches, slots)

    def offer(self, latency_s: float, w: int, m: int, slots: tuple[StageSlot, ...]) -> None:
        if latency_s <= self.latency_s * (1 + 1e-9):
            self.found.append((latency_s, w, m, slots))
        self.latency_s = min(self.latency_s, latency_s)


def _search_width_microbatches(problem: PlanProblem, w: int, m: int, inc: _Incumbent) -> None:
    """Exact search over pipelines of `w` devices with `m` micro-batches; completed plans
    go to `inc`."""
    n_layers = problem.num_layers
    copies = problem.num_devices // w
    b = problem.global_batch_size / (copies * m)
    max_stages = min(m, w, n_layers)
    var = problem.var_prefix_s_per_sample
    params = problem.param_prefix_bytes
    stops_all = np.arange(n_layers + 1)
    tol = 1 + 1e-9
    states: list[dict[tuple[int, int, bool], list[_Label]]] = [dict() for _ in range(n_layers + 1)]
    states[0][(0, 0, True)] = [_Label(0.0, 0.0, (), _UNLIMITED, ())]
    for j in range(n_layers):
        for (d, s, last_one_node), labels in states[j].items():
            if s >= max_stages:
                continue
            remaining = w - d
            x_cut_bytes = problem.cut_bytes_per_sample[j] * b
            min_path = min(la.path_s for la in labels)
            extend = s + 2 <= max_stages
            for r in range(1, min(remaining, int(b)) + 1):  # >= 1 sample per replica
                samples = b / r
                if s == 0:
                    x = 0.0
                else:
                    intra = last_one_node and problem.in_one_node(d - 1, d + r - 1, w, copies)
                    x = float(problem.transfer_s(x_cut_bytes, intra))
                nodes = problem.nodes_spanned(d, r, w, copies)
                cap = (inc.latency_s - min_path - x) / m  # latency >= M c + path + x
                # the last stage: layers j.. end on r devices (scalars)
                c_end = float(problem.compute_s(j, n_layers, samples))
                if c_end <= cap:
                    k_end = problem.stage_max_inflight(j, n_layers, samples)
                    if k_end >= 1:
                        limit_end = _UNLIMITED if k_end >= m else s + int(k_end)
                        ar_end = float(problem.allreduce_s(params[n_layers] - params[j], copies * r, nodes))
                        for la in labels:
                            if s + 1 > min(limit_end, la.max_stages):
                                continue
                            blk = max(la.block_s, c_end, x)
                            ars = (*la.allreduce_s, ar_end)
                            lat = (m - 1) * blk + la.path_s + x + c_end + max(
                                0.0, max(a - t * blk for t, a in enumerate(ars)))
                            if lat <= inc.latency_s * tol:
                                inc.offer(lat, w, m, (*la.slots, StageSlot(j, n_layers, r, d)))
                rest = remaining - r
                if not extend or rest <= 0:
                    continue
                stops = stops_all[j + 1:n_layers]
                c = problem.compute_s(j, stops, samples)
                hi = int(np.searchsorted(c, cap, side="right"))
                if hi == 0:
                    continue
                stops, c = stops[:hi], c[:hi]
                kmax = problem.stage_max_inflight(j, stops, samples)
                ok = kmax >= 1
                if not ok.all():
                    if not ok.any():
                        continue
                    stops, c, kmax = stops[ok], c[ok], kmax[ok]
                stage_limit = np.where(kmax >= m, _UNLIMITED, s + kmax).astype(np.int64)
                ar = np.atleast_1d(problem.allreduce_s(params[stops] - params[j], copies * r, nodes))
                lb_block = (var[n_layers] - var[stops]) * b / rest
                one_node = problem.in_one_node(d, d + r - 1, w, copies)
                for la in labels:
                    new_block = np.maximum(np.maximum(c, x), la.block_s)
                    new_path = la.path_s + x + c
                    new_limit = np.minimum(stage_limit, la.max_stages)
                    # (M-1) beta + ending(beta) does not decrease with beta, so evaluating the
                    # stages known so far at the smallest possible final block bounds it
                    beta = np.maximum(new_block, lb_block)
                    ending = np.maximum(ar - s * beta, 0.0)
                    for t, a in enumerate(la.allreduce_s):
                        ending = np.maximum(ending, a - t * beta)
                    lb = (m - 1) * beta + new_path + lb_block + ending
                    keep = (new_limit >= s + 2) & (lb <= inc.latency_s * tol)
                    for k in np.flatnonzero(keep):
                        stop = int(stops[k])
                        label = _Label(float(new_block[k]), float(new_path[k]),
                                       (*la.allreduce_s, float(ar[k])), int(new_limit[k]),
                                       (*la.slots, StageSlot(j, stop, r, d)))
                        _insert(states[stop].setdefault((d + r, s + 1, one_node), []), label)
        states[j] = {}  # done with this layer


def _seed_incumbent(problem: PlanProblem, pairs: list[tuple[int, int]], inc: _Incumbent) -> None:
    """A first bound for branch and bound: for every (W, M), every stage count S dividing
    W, S stages of W / S devices over compute-balanced layer ranges. Bounds only; the
    exact pass finds these plans again if they are optimal."""
    n_layers = problem.num_layers
    work = problem.var_prefix_s_per_sample + problem.fixed_prefix_s
    for w, m in pairs:
        for num_stages in range(1, min(w, m, n_layers) + 1):
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


def search_space(problem: PlanProblem) -> list[tuple[int, int]]:
    """(pipeline devices W, micro-batches M) pairs, widest pipelines first."""
    pairs = []
    for w in sorted(problem.pipeline_widths(), reverse=True):
        for m in problem.microbatch_counts(problem.num_devices // w):
            pairs.append((w, m))
    return pairs


def plan_hybrid(problem: PlanProblem, candidates: int = 3) -> list[HybridPlan]:
    """The best plan first, then up to `candidates - 1` runners-up the search completed.
    Raises `NoFeasiblePlanError` when no plan fits."""
    inc = _Incumbent()
    pairs = search_space(problem)
    if not pairs:
        raise NoFeasiblePlanError(
            f"global batch {problem.global_batch_size} cannot be split into micro-batches of "
            f">= {problem.min_micro_batch_size} samples on any pipeline width of {problem.num_devices} devices"
        )
    _seed_incumbent(problem, pairs, inc)
    for w, m in pairs:
        _search_width_microbatches(problem, w, m, inc)
    if not inc.found:
        raise NoFeasiblePlanError(_nothing_fits(problem))
    # near-ties (within 1e-9): fewer stages, then fewer micro-batches, first
    best = min(f[0] for f in inc.found)
    ranked = sorted(inc.found, key=lambda f: (f[0] > best * (1 + 1e-9), f[0] if f[0] > best * (1 + 1e-9) else 0.0,
                                              len(f[3]), f[2]))
    plans: list[HybridPlan] = []
    seen = set()
    for lat, w, m, slots in ranked:
        plan = make_plan(problem, w, m, slots, lat)
        key = (plan.describe(), m)  # copies of one layout differ only in placement
        if key in seen:
            continue
        seen.add(key)
        plans.append(plan)
        if len(plans) >= candidates:
            break
    # the best single-stage plan (data parallelism with accumulation) is always re-timed
    single = [f for f in ranked if len(f[3]) == 1]
    if single and all(p.num_stages > 1 for p in plans):
        lat, w, m, slots = single[0]
        plans.append(make_plan(problem, w, m, slots, lat))
    return plans


def _nothing_fits(problem: PlanProblem) -> str:
    mem = problem.memory
    return (
        f"no plan fits in {mem.memory_bytes / 1e9:g} GB per device for global batch "
        f"{problem.global_batch_size} on {problem.num_devices} devices (model state "
        f"{mem.model_state_factor:g} x {problem.profile.total_param_bytes / 1e9:.3g} GB of parameters "
        f"plus activations); use more devices, a larger --memory-gb or a smaller batch"
    )


def enumerate_hybrid(problem: PlanProblem) -> HybridPlan:
    """Every layout of the search space, evaluated one by one (small instances only:
    tests compare it with `plan_hybrid`)."""
    from itertools import combinations

    best: HybridPlan | None = None
    n_layers = problem.num_layers
    for w, m in search_space(problem):
        for num_stages in range(1, min(m, w, n_layers) + 1):
            for cuts in combinations(range(1, n_layers), num_stages - 1):
                bounds = (0, *cuts, n_layers)
                for widths in _compositions_at_most(w, num_stages):
                    slots, offset = [], 0
                    for s in range(num_stages):
                        slots.append(StageSlot(bounds[s], bounds[s + 1], widths[s], offset))
                        offset += widths[s]
                    plan = evaluate_layout(problem, w, m, slots)
                    if plan is not None and (best is None or plan.latency_s < best.latency_s):
                        best = plan
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
