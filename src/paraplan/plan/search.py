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
   layer, for all states there); the dominance test runs inline in `_Bucket.insert`.
Tests compare the result with exhaustive enumeration on small instances.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from paraplan.core import ConfigError, GradientSync, ParaplanError
from paraplan.plan.baselines import baseline_plans
from paraplan.plan.objective import (
    GroupAllReduce,
    data_parallel_latency_s,
    evaluate_layout,
    group_allreduce,
    make_plan,
)
from paraplan.plan.problem import PlanProblem
from paraplan.plan.records import HybridPlan, StageSlot

_UNLIMITED = 1 << 30
_TOL = 1 + 1e-9  # relative slack of every pruning test (rounding)
BEAM_WIDTH = 2
"""Labels per state of the heuristic pass that seeds the incumbent of the exact one."""
BEAM_PAIRS = 1
"""(W, M) pairs the heuristic pass visits: the one(s) whose balanced pipelines are fastest."""
_SYNCS: tuple[GradientSync, ...] = ("end", "overlap", "p3")


class NoFeasiblePlanError(ParaplanError):
    """No plan of the search space fits in device memory."""


@dataclass(slots=True)  # not frozen (faster to build); never changed once built
class _Label:
    block_s: float
    path_s: float
    # the ending max(0, max_t A_t - t beta) for beta >= from_s: the lines of the stages
    # so far that show in it, in the order they do, and the kinks (where the next line
    # takes over; the last: where it reaches 0, inf for a stage-0 line)
    lines: tuple[tuple[float, int], ...]
    kinks: tuple[float, ...]
    from_s: float  # every completion's block is >= this (the block so far, the state's floor)
    max_stages: int  # total stage count every stage so far can hold in memory (and the state allows)
    slots: tuple[StageSlot, ...]


def _envelope(lines, beta0: float) -> tuple[tuple[tuple[float, int], ...], tuple[float, ...]]:
    """The lines of max(0, max_i a_i - t_i beta) that show for beta >= beta0, in order,
    and the kinks. A line <= 0 at beta0 stays <= 0 (t >= 0); lines with a smaller t take
    over as beta grows."""
    live = []
    cur, best = None, (0.0, 0)
    for line in lines:  # the live lines, and the highest at beta0 (of those, the flattest; the first)
        value = line[0] - line[1] * beta0
        if value > 0:
            live.append(line)
            if cur is None or (value, -line[1]) > best:
                cur, best = line, (value, -line[1])
    if cur is None:
        return (), ()
    env, kinks = [cur], []
    while cur[1] > 0:
        a, t = cur
        at, nxt = a / t, None  # where cur reaches 0, and who takes over before that
        for a2, t2 in live:
            if t2 < t:
                x = (a - a2) / (t - t2)
                if x < at or (x == at and nxt is not None and t2 < nxt[1]):
                    at, nxt = x, (a2, t2)
        kinks.append(at)
        if nxt is None:
            break
        env.append(nxt)
        cur = nxt
    if cur[1] == 0:
        kinks.append(math.inf)
    return tuple(env), tuple(kinks)


def _ending(lines: tuple[tuple[float, int], ...], block_s: float) -> float:
    """The ending max(0, max_i a_i - t_i beta) of `lines` at beta = `block_s` (s)."""
    ending = 0.0
    for a, t in lines:
        value = a - t * block_s
        if value > ending:
            ending = value
    return ending


def _beats(a: _Label, b: _Label, beta0: float, slack: float, hi: float, b_at0: float, b_at_hi: float) -> bool:
    """Whether label a dominates label b of the same state (`_Bucket.insert` checks the
    cheap conditions first: a's block <= beta0, a's path <= b's, a's stage limit >= b's):
    every completion of b that can matter is at least as slow with a's prefix instead.
    beta0 = max(b's from, the state's floor), slack = b's path - a's, hi = max(block
    cap, beta0) (`_PairBounds.block_cap_s`: no completion with a larger block beats the
    incumbent), b_at0 and b_at_hi: b's ending at beta0 and at hi.

    For a completion F, b's final block is beta >= beta0; a's is at most beta when a's
    block <= beta0, and a evaluated at beta is no faster than at its own final block
    (the latency does not decrease with the block), so it suffices that path_a +
    ending_a(beta) <= path_b + ending_b(beta) for every beta in [beta0, hi], and path_a
    <= path_b (for when F's own all-reduce sets the ending). Beyond the cap b + F is
    slower than the incumbent (latency >= (M - 1) beta + the pair's path bound),
    whatever a + F is. The incumbent only improves, so a cap that held when b was
    dropped holds for every plan that can still beat it; the two endings are piecewise
    linear, so the test at beta0, at hi and at the kinks between them is exact."""
    a_lines = a.lines
    ending_a = _ending(a_lines, beta0)
    if ending_a <= slack:  # a's ending only falls
        return True
    if ending_a > slack + b_at0 or _ending(a_lines, hi) > slack + b_at_hi:
        return False
    b_lines = b.lines
    for kinks in (a.kinks, b.kinks):
        for k in kinks:
            if beta0 < k < hi and _ending(a_lines, k) > slack + _ending(b_lines, k):
                return False
    return True


class _Bucket:
    """The labels of one state, and the largest block floor known for it (every floor
    is a lower bound on the final block of the state's completions)."""

    __slots__ = ("floor_s", "labels", "paths")

    def __init__(self) -> None:
        self.floor_s = 0.0
        self.labels: list[_Label] = []
        self.paths: list[float] = []  # the labels' paths (`insert` keeps them sorted)

    def insert(self, label: _Label, floor_s: float, cap_s: float) -> None:
        """Add `label` unless a label of the bucket dominates it; drop those it dominates
        (`_beats` with the block cap `cap_s`). The labels stay sorted by
        path: only a shorter path can dominate."""
        floor_s = self.floor_s = max(self.floor_s, floor_s)
        labels = self.labels
        path, stages, block, lines = label.path_s, label.max_stages, label.block_s, label.lines
        at = bisect.bisect_right(self.paths, path)
        beta0 = label.from_s if label.from_s > floor_s else floor_s
        hi = cap_s if cap_s > beta0 else beta0
        if at:
            at0, at_hi = _ending(lines, beta0), _ending(lines, hi)
            for other in labels[:at]:
                if other.block_s <= beta0 and other.max_stages >= stages and _beats(
                        other, label, beta0, path - other.path_s, hi, at0, at_hi):
                    return
        kept = labels[:at]
        kept.append(label)
        for o in labels[at:]:
            if (block <= o.from_s or block <= floor_s) and stages >= o.max_stages:
                beta_o = o.from_s if o.from_s > floor_s else floor_s
                hi_o = cap_s if cap_s > beta_o else beta_o
                o_lines = o.lines
                if _beats(label, o, beta_o, o.path_s - path, hi_o, _ending(o_lines, beta_o), _ending(o_lines, hi_o)):
                    continue
            kept.append(o)
        if len(kept) == len(labels) + 1:
            self.paths.insert(at, path)
        else:
            self.paths = [la.path_s for la in kept]
        self.labels = kept


class _Beam:
    """The labels of one state in the heuristic pass: of all labels offered, the
    `width` of least score (the latency of the stages so far as if they were the whole
    plan, s; ties: the first offered), in the order they were offered while no more
    than `width` were, else by score."""

    __slots__ = ("labels", "offered", "scores", "width")

    def __init__(self, width: int) -> None:
        self.width = width
        self.offered = 0
        self.labels: list[_Label] = []
        self.scores: list[float] = []

    def admits(self, score: float) -> bool:
        """Whether a label of `score` offered now would be kept (counts the offer)."""
        self.offered += 1
        return len(self.labels) < self.width or score < max(self.scores)

    def add(self, label: _Label, score: float) -> None:
        """Keep `label` (after `admits`), dropping the worst kept label (the last
        offered of the highest score) when there are too many."""
        self.labels.append(label)
        self.scores.append(score)
        if len(self.labels) > self.width:
            worst = max(range(len(self.scores)), key=lambda i: (self.scores[i], i))
            del self.labels[worst], self.scores[worst]

    def ranked(self) -> list[_Label]:
        if self.offered <= self.width:
            return self.labels
        order = sorted(range(len(self.labels)), key=lambda i: self.scores[i])  # stable: the first offered first
        return [self.labels[i] for i in order]


@dataclass(frozen=True)
class _Found:
    latency_s: float
    pipeline_devices: int
    microbatches: int
    slots: tuple[StageSlot, ...]
    gradient_sync: GradientSync = "end"


@dataclass
class _Incumbent:
    latency_s: float = math.inf
    found: list[_Found] = field(default_factory=list)

    def offer(self, latency_s: float, w: int, m: int, slots: tuple[StageSlot, ...],
              gradient_sync: GradientSync = "end") -> None:
        if latency_s <= self.latency_s * _TOL:
            self.found.append(_Found(latency_s, w, m, slots, gradient_sync))
        self.latency_s = min(self.latency_s, latency_s)


# ---- one stage: data parallelism in closed form ----

def _single_stage(problem: PlanProblem, pairs: list[tuple[int, int]], inc: _Incumbent,
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
        for k in np.flatnonzero(compute <= inc.latency_s * _TOL):
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


# ---- pipelines: seeds and bounds ----

def _seed_incumbent(problem: PlanProblem, pairs: list[tuple[int, int]],
                    inc: _Incumbent) -> dict[tuple[int, int], float]:
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


@dataclass(frozen=True)
class _PairBounds:
    """Lower bounds shared by every pipeline (>= 2 stages) of one (W, M) pair."""

    micro_batch: float  # b, samples per micro-batch of one copy
    transfer_lb_s: np.ndarray  # per cut j (index 1..L-1): the cheaper of an intra- or inter-node transfer
    block_lb_s: float
    path_lb_s: float

    def latency_lb_s(self, microbatches: int) -> float:
        return (microbatches - 1) * self.block_lb_s + self.path_lb_s

    def block_cap_s(self, microbatches: int, incumbent_s: float) -> float:
        """The largest block a plan of this pair beating `incumbent_s` can have."""
        return (incumbent_s * _TOL - self.path_lb_s) / (microbatches - 1)


def _transfer_lb_s(problem: PlanProblem, cut_bytes: np.ndarray) -> np.ndarray:
    def both(intra: bool) -> np.ndarray:
        try:
            t = np.asarray(problem.transfer_s(cut_bytes, intra), dtype=float)
            if t.shape == cut_bytes.shape:
                return t
        except Exception:  # a model that only takes scalars
            pass
        return np.array([float(problem.transfer_s(float(x), intra)) for x in cut_bytes])

    return np.minimum(both(True), both(False))


def _pair_bounds(problem: PlanProblem, w: int, m: int) -> _PairBounds:
    n_layers = problem.num_layers
    copies = problem.num_devices // w
    b = problem.global_batch_size / (copies * m)
    fx, vr = problem.fixed_prefix_s, problem.var_prefix_s_per_sample
    cut_bytes = problem.cut_bytes_per_sample * b
    x_lb = np.full(n_layers + 1, np.inf)
    if n_layers > 1:
        x_lb[1:n_layers] = _transfer_lb_s(problem, cut_bytes[1:n_layers])
    x_min = float(x_lb.min())
    spread = float(vr[-1]) * b / w
    widest = max(1, min(w - 1, math.floor(b)))  # a stage of a pipeline has at most W - 1 devices
    layer = float(np.max(np.diff(fx) + np.diff(vr) * b / widest))
    block = max(spread, x_min, layer)
    path = float(fx[-1]) + float(vr[-1]) * b / widest + x_min
    return _PairBounds(b, x_lb, block, path)


@dataclass(frozen=True)
class _BlockFloor:
    """The smallest block the layers j.. can have on `rest` devices of a copy, from
    below: `floor_s[j, rest]`, from the fewest devices that cover layers j.. with
    every stage at most B for a grid of B up to the block cap (`need[j, k]`: every
    stage's compute on its replicas and every boundary transfer at its cheaper tier at
    most B, every stage in memory with one micro-batch in flight, >= 1 sample per
    replica). need[j, k] > rest means no plan of the rest has a block <= grid[k], so
    floor = the largest such grid[k]; inf where not even the cap is reachable."""

    floor_s: np.ndarray  # (L + 1) x (W + 1)

    def at(self, stops, rest):
        return self.floor_s[stops, rest]


def _block_floor(problem: PlanProblem, w: int, bounds: _PairBounds, block_cap_s: float,
                 points: int = 48) -> _BlockFloor:
    n_layers = problem.num_layers
    b = bounds.micro_batch
    lo = max(bounds.block_lb_s, 1e-300)
    hi = max(block_cap_s, lo)
    grid = np.geomspace(lo, hi, points) if hi > lo else np.array([lo])
    fx, vr = problem.fixed_prefix_s, problem.var_prefix_s_per_sample
    params, stash = problem.param_prefix_bytes, problem.stash_prefix_bytes_per_sample
    mem = problem.memory
    most = min(w, math.floor(b))
    cut_ok = bounds.transfer_lb_s[:, None] <= grid[None, :]
    need = np.full((n_layers + 1, grid.size), np.inf)
    need[n_layers] = 0.0
    shrink = 1 - 1e-12  # never round a device count up past the exact one
    with np.errstate(divide="ignore", invalid="ignore"):
        for j in range(n_layers - 1, -1, -1):
            stops = np.arange(j + 1, n_layers + 1)
            var = ((vr[stops] - vr[j]) * b)[:, None]
            room = grid[None, :] - (fx[stops] - fx[j])[:, None]
            r_time = np.where(var > 0, np.ceil(var / room * shrink), 1.0)
            r_time[(room < 0) | ((room == 0) & (var > 0))] = np.inf
            free = mem.memory_bytes - mem.model_state_factor * (params[stops] - params[j])
            act = (stash[stops] - stash[j]) * b
            r_mem = np.where(act > 0, np.ceil(act / free * shrink), 1.0)
            r_mem[(free < 0) | ((free == 0) & (act > 0))] = np.inf
            r = np.maximum(r_time, r_mem[:, None])
            r[r > most] = np.inf
            tail = np.where(cut_ok[stops], need[stops], np.inf)
            tail[-1] = 0.0  # stop == L: no boundary after the last stage
            need[j] = np.min(r + tail, axis=0)
    rest = np.arange(w + 1)
    floor = np.empty((n_layers + 1, w + 1))
    padded = np.concatenate([[0.0], grid, [np.inf]])
    for j in range(n_layers + 1):
        first_ok = np.searchsorted(-need[j], -rest, side="left")  # need is non-increasing in B
        floor[j] = padded[first_ok]
    return _BlockFloor(floor)


# ---- pipelines: the exact dynamic program ----

def _search_width_microbatches(problem: PlanProblem, w: int, m: int, inc: _Incumbent,
                               bounds: _PairBounds, beam: int = 0) -> None:
    """Exact search over pipelines (>= 2 stages) of `w` devices with `m` micro-batches;
    completed plans go to `inc`. `beam` > 0: a heuristic pass instead (only seeds the
    incumbent): each state extends only its `beam` labels of least latency so far."""
    n_layers = problem.num_layers
    copies = problem.num_devices // w
    b = bounds.micro_batch
    max_stages = min(m, w, n_layers)
    fx, var = problem.fixed_prefix_s, problem.var_prefix_s_per_sample
    params = problem.param_prefix_bytes
    x_lb = bounds.transfer_lb_s
    stops_all = np.arange(n_layers + 1)
    most_replicas = math.floor(b)  # >= 1 sample per replica
    g = problem.cluster.devices_per_node
    residues = np.unique(np.arange(copies) * w % g)  # where each copy starts inside a node
    if not _first_stage_passes(problem, inc, w, m, bounds):
        return  # no plan of the pair beats the incumbent: no floors needed
    floor_for = math.inf
    floor = _BlockFloor(np.zeros((n_layers + 1, w + 1)))
    states: list[dict[tuple[int, int, bool], _Bucket | _Beam]] = [dict() for _ in range(n_layers + 1)]
    root = states[0][(0, 0, True)] = _Beam(beam) if beam else _Bucket()
    root.labels.append(_Label(0.0, 0.0, (), (), 0.0, _UNLIMITED, ()))
    r_all = np.arange(1, min(w, most_replicas) + 1)  # replica counts a stage may have
    samples_all = b / r_all
    for j in range(n_layers):
        if inc.latency_s < floor_for * (1 - 1e-3):  # the incumbent improved: tighter floors
            floor_for = inc.latency_s
            floor = _block_floor(problem, w, bounds, bounds.block_cap_s(m, floor_for))
        block_cap = bounds.block_cap_s(m, inc.latency_s) * _TOL  # no plan that beats the incumbent has a larger block
        stops_ext = stops_all[j + 1:n_layers]
        per_r: tuple[np.ndarray, ...] = ()  # what layers j.. cost on each replica count (once per layer)
        for (d, s, last_one_node), bucket in states[j].items():
            if s >= max_stages:
                continue
            labels = bucket.ranked() if isinstance(bucket, _Beam) else bucket.labels
            remaining = w - d
            x_cut_bytes = problem.cut_bytes_per_sample[j] * b
            blocks = np.array([la.block_s for la in labels])
            froms = np.array([la.from_s for la in labels])
            paths = np.array([la.path_s for la in labels])
            limits = np.array([la.max_stages for la in labels])
            width = max(1, max(len(la.lines) for la in labels))
            line_a = np.full((len(labels), width), -np.inf)
            line_t = np.zeros((len(labels), width))
            for i, la in enumerate(labels):
                for k, (a, t) in enumerate(la.lines):
                    line_a[i, k], line_t[i, k] = a, t
            min_path = float(paths.min())
            extend = s + 2 <= max_stages
            rmax = min(remaining, most_replicas)  # >= 1 sample per replica
            if rmax < 1:
                continue
            # every replica count r at once: transfer in, compute, memory, the rest's floor
            if not per_r:
                per_r = (problem.compute_s(j, n_layers, samples_all),
                         _inflight(problem, j, np.array([n_layers]), samples_all[:, None])[:, 0],
                         problem.compute_s(j, stops_ext[None, :], samples_all[:, None]),
                         _inflight(problem, j, stops_ext[None, :], samples_all[:, None]))
            c_end_r, k_end_r, c_rs, kmax_rs = (a[:rmax] for a in per_r)
            rs = r_all[:rmax]
            samples_r = samples_all[:rmax]
            if s == 0:
                x_r = np.zeros(rmax)
            else:
                x_in = float(problem.transfer_s(x_cut_bytes, True))
                x_out = float(problem.transfer_s(x_cut_bytes, False))
                intra_r = _one_node(residues, g, d - 1, d + rs - 1) if last_one_node else np.zeros(rmax, bool)
                x_r = np.where(intra_r, x_in, x_out)
            cap_r = (inc.latency_s * _TOL - min_path - x_r) / m  # latency >= M c + path + x
            if s >= 1:  # the last stage: layers j.. end on r devices
                for fi in np.flatnonzero((c_end_r <= cap_r) & (k_end_r >= 1)).tolist():
                    r = int(rs[fi])
                    _finish(problem, inc, labels, blocks, paths, limits, line_a, line_t, w, m, j, d, r, s,
                            float(x_r[fi]), float(c_end_r[fi]), float(samples_r[fi]),
                            problem.nodes_spanned(d, r, w, copies), copies)
            if not extend or stops_ext.size == 0:
                continue
            rest_r = remaining - rs
            floor_rs = floor.floor_s[stops_ext[None, :], np.maximum(rest_r, 0)[:, None]]
            ok_rs = ((c_rs <= cap_r[:, None]) & (rest_r >= 1)[:, None] & np.isfinite(floor_rs) & (kmax_rs >= 1))
            if ok_rs.any():  # the label bound below without this stage's all-reduce
                ok_rs = _bound_ok(problem, inc, m, s, blocks, froms, paths, limits, line_a, line_t, x_r, c_rs,
                                  kmax_rs, floor_rs, np.maximum(rest_r, 1), stops_ext, x_lb, b, ok_rs)
            # every (r, stop) left at once, r-major: (r, stop) pairs in the columns
            ri_f, si_f = np.nonzero(ok_rs)
            if not ri_f.size:
                continue
            r_f, x_f, stops = rs[ri_f], x_r[ri_f], stops_ext[si_f]
            c, kmax, rest_floor = c_rs[ri_f, si_f], kmax_rs[ri_f, si_f], floor_rs[ri_f, si_f]
            rest = remaining - r_f
            stage_limit = np.where(kmax >= m, _UNLIMITED, s + kmax).astype(np.int64)
            ar = np.empty(ri_f.size)
            one_node_of: dict[int, bool] = {}
            firsts = np.flatnonzero(np.diff(ri_f, prepend=-1))
            for lo, hi in zip(firsts.tolist(), [*firsts[1:].tolist(), ri_f.size], strict=True):
                r = int(r_f[lo])
                nodes = problem.nodes_spanned(d, r, w, copies)
                ar[lo:hi] = np.atleast_1d(problem.allreduce_s(params[stops[lo:hi]] - params[j], copies * r, nodes))
                one_node_of[r] = problem.in_one_node(d, d + r - 1, w, copies)
            rest_fixed = fx[n_layers] - fx[stops]
            rest_var = (var[n_layers] - var[stops]) * b
            rest_spread = rest_var / rest  # the rest's block, at least
            rest_path = rest_fixed + rest_var / np.minimum(rest, most_replicas)  # no stage has more replicas
            x_next = x_lb[stops]
            # labels x (r, stop): block, path and the bound at the smallest block the plan can have
            new_block = np.maximum(np.maximum(c, x_f)[None, :], blocks[:, None])
            new_path = paths[:, None] + (x_f + c)[None, :]
            new_limit = np.minimum(stage_limit[None, :], limits[:, None])
            beta = np.maximum(np.maximum(new_block, froms[:, None]),
                              np.maximum(np.maximum(rest_spread, x_next), rest_floor)[None, :])
            ending = np.maximum(ar[None, :] - s * beta, 0.0)
            for k in range(line_a.shape[1]):
                ending = np.maximum(ending, line_a[:, k, None] - line_t[:, k, None] * beta)
            lb = (m - 1) * beta + new_path + (x_next + rest_path)[None, :] + ending
            ok = (new_limit >= s + 2) & (lb <= inc.latency_s * _TOL)
            ii, kk = np.nonzero(ok)
            if not ii.size:
                continue
            order = np.lexsort((kk, ii, ri_f[kk]))  # by r, then label, then stop
            ii, kk = ii[order], kk[order]
            r_list, stop_list, floor_list, ar_list = r_f.tolist(), stops.tolist(), rest_floor.tolist(), ar.tolist()
            blk_ik, path_ik = new_block[ii, kk], new_path[ii, kk]
            if beam:  # no dominance: each state keeps its labels of least score (`_Beam`)
                since_ik = np.maximum(np.maximum(blk_ik, rest_floor[kk]), froms[ii])
                ending_ik = np.maximum(ar[kk] - s * since_ik, 0.0)
                for k in range(line_a.shape[1]):
                    ending_ik = np.maximum(ending_ik, line_a[ii, k] - line_t[ii, k] * since_ik)
                scores = ((m - 1) * since_ik + path_ik + ending_ik).tolist()
            for n, (i, k, blk, path, limit) in enumerate(zip(ii.tolist(), kk.tolist(), blk_ik.tolist(),
                                                             path_ik.tolist(), new_limit[ii, kk].tolist(),
                                                             strict=True)):
                r = r_list[k]
                stop = stop_list[k]
                key_to = (d + r, s + 1, one_node_of[r])
                bucket_to = states[stop].get(key_to)
                if bucket_to is None:
                    bucket_to = states[stop][key_to] = _Beam(beam) if beam else _Bucket()
                if beam and not bucket_to.admits(scores[n]):
                    continue
                la = labels[i]
                floor_k = floor_list[k]
                since = max(blk, floor_k, la.from_s)
                lines, kinks = _envelope((*la.lines, (ar_list[k], s)), since)
                # no plan has more stages than layers or devices allow: a larger memory
                # limit is worth no more than this
                most = s + 1 + min(n_layers - stop, remaining - r, max_stages - s - 1)
                label = _Label(blk, path, lines, kinks, since, min(limit, most), (*la.slots, StageSlot(j, stop, r, d)))
                if beam:
                    bucket_to.add(label, scores[n])
                else:
                    bucket_to.insert(label, floor_k, block_cap)
        states[j] = {}  # done with this layer


def _first_stage_passes(problem: PlanProblem, inc: _Incumbent, w: int, m: int, bounds: _PairBounds) -> bool:
    """Whether some first stage passes the tests of `_search_width_microbatches` at the
    root (stage time, memory, the label bound of `_bound_ok`) with every block floor at 0.
    A floor only raises the bound, so when none passes, no plan of the pair beats the
    incumbent, and the block floors (`_block_floor`, the costly part of a pair that
    yields nothing) need not be built."""
    b = bounds.micro_batch
    rs = np.arange(1, min(w, math.floor(b)) + 1)
    samples_r = b / rs
    stops = np.arange(1, problem.num_layers)
    x_r = np.zeros(rs.size)
    cap_r = (inc.latency_s * _TOL - 0.0 - x_r) / m
    c_rs = problem.compute_s(0, stops[None, :], samples_r[:, None])
    kmax_rs = _inflight(problem, 0, stops[None, :], samples_r[:, None])
    rest_r = w - rs
    ok_rs = (c_rs <= cap_r[:, None]) & (rest_r >= 1)[:, None] & (kmax_rs >= 1)
    if not ok_rs.any():
        return False
    zero = np.zeros(1)
    ok_rs = _bound_ok(problem, inc, m, 0, zero, zero, zero, np.array([_UNLIMITED]), np.full((1, 1), -np.inf),
                      np.zeros((1, 1)), x_r, c_rs, kmax_rs, np.zeros(c_rs.shape), np.maximum(rest_r, 1), stops,
                      bounds.transfer_lb_s, b, ok_rs)
    return bool(ok_rs.any())


def _one_node(residues: np.ndarray, devices_per_node: int, first: int, lasts: np.ndarray) -> np.ndarray:
    """For each last: devices first..last of a copy share a node in every copy
    (`PlanProblem.in_one_node`, vectorised over `lasts`); `residues`: the copies' first
    devices modulo the node size."""
    g = devices_per_node
    return ((residues[:, None] + first) // g == (residues[:, None] + lasts[None, :]) // g).all(axis=0)


def _inflight(problem: PlanProblem, first: int, stops: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """`PlanProblem.stage_max_inflight` broadcast over stops and samples per replica."""
    params, stash = problem.param_prefix_bytes, problem.stash_prefix_bytes_per_sample
    free = problem.memory.memory_bytes - problem.memory.model_state_factor * (params[stops] - params[first])
    per_mb = (stash[stops] - stash[first]) * samples
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.where(per_mb > 0, np.floor(free / per_mb), 1e9)
    return np.where(free < 0, -1.0, k)


def _bound_ok(problem: PlanProblem, inc: _Incumbent, m: int, s: int, blocks: np.ndarray, froms: np.ndarray,
              paths: np.ndarray, limits: np.ndarray, line_a: np.ndarray, line_t: np.ndarray, x_r: np.ndarray,
              c_rs: np.ndarray, kmax_rs: np.ndarray, floor_rs: np.ndarray, rest_r: np.ndarray, stops: np.ndarray,
              x_lb: np.ndarray, b: float, ok_rs: np.ndarray) -> np.ndarray:
    """The (r, stop) pairs of `ok_rs` some label may extend: the label bound of
    `_search_width_microbatches` over labels x replica counts x stops, leaving out the
    new stage's all-reduce (>= 0), so it is never larger than the exact bound.

    In two steps, so the labels x r x stops product is never built: first with the
    labels' least block, floor, path and most stages and no ending (every term is
    non-decreasing in those, the ending is >= 0, and rounding is monotone, so this is
    at most every label's bound), then per label on the pairs left."""
    n_layers = problem.num_layers
    fx, var = problem.fixed_prefix_s, problem.var_prefix_s_per_sample
    most_replicas = math.floor(b)
    cap = inc.latency_s * _TOL
    rest_var = (var[n_layers] - var[stops]) * b
    rest_fixed = fx[n_layers] - fx[stops]
    rest_spread = rest_var[None, :] / rest_r[:, None]
    rest_path = rest_fixed[None, :] + rest_var[None, :] / np.minimum(rest_r, most_replicas)[:, None]
    x_next = x_lb[stops][None, :]
    beta_rs = np.maximum(np.maximum(rest_spread, x_next), floor_rs)
    tail_rs = x_r[:, None] + c_rs + x_next + rest_path  # this stage, the next transfer, the rest's path
    stage_limit = np.where(kmax_rs >= m, _UNLIMITED, s + kmax_rs)
    beta0 = np.maximum(np.maximum(np.maximum(c_rs, x_r[:, None]), float(blocks.min())),
                       np.maximum(float(froms.min()), beta_rs))
    ok = ok_rs & (np.minimum(stage_limit, int(limits.max())) >= s + 2)
    ok &= (m - 1) * beta0 + float(paths.min()) + tail_rs <= cap
    ri, si = np.nonzero(ok)
    if not ri.size:
        return ok
    # per label, on the pairs left
    c, x = c_rs[ri, si], x_r[ri]
    new_block = np.maximum(np.maximum(c, x)[None, :], blocks[:, None])
    beta = np.maximum(np.maximum(new_block, froms[:, None]), beta_rs[ri, si][None, :])
    ending = np.zeros_like(beta)
    for k in range(line_a.shape[1]):
        ending = np.maximum(ending, line_a[:, k, None] - line_t[:, k, None] * beta)
    lb = (m - 1) * beta + paths[:, None] + tail_rs[ri, si][None, :] + ending
    ok_k = ((np.minimum(stage_limit[ri, si][None, :], limits[:, None]) >= s + 2) & (lb <= cap)).any(axis=0)
    ok[ri, si] = ok_k
    return ok


def _finish(problem: PlanProblem, inc: _Incumbent, labels: list[_Label], blocks: np.ndarray, paths: np.ndarray,
            limits: np.ndarray, line_a: np.ndarray, line_t: np.ndarray, w: int, m: int, j: int, d: int, r: int,
            s: int, x: float, c_end: float, samples: float, nodes: int, copies: int) -> None:
    """Complete every label of a state with a last stage of layers j.. on r devices."""
    n_layers = problem.num_layers
    k_end = problem.stage_max_inflight(j, n_layers, samples)
    limit_end = _UNLIMITED if k_end >= m else s + int(k_end)
    ar_end = float(problem.allreduce_s(problem.param_prefix_bytes[n_layers] - problem.param_prefix_bytes[j],
                                       copies * r, nodes))
    blk = np.maximum(blocks, max(c_end, x))
    ending = np.maximum(ar_end - s * blk, 0.0)
    for k in range(line_a.shape[1]):
        ending = np.maximum(ending, line_a[:, k] - line_t[:, k] * blk)
    lat = (m - 1) * blk + paths + x + c_end + ending
    ok = (np.minimum(limits, limit_end) >= s + 1) & (lat <= inc.latency_s * _TOL)
    for i in np.flatnonzero(ok):
        inc.offer(float(lat[i]), w, m, (*labels[i].slots, StageSlot(j, n_layers, r, d)))


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
    inc = _Incumbent()
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
    ordered = sorted(((_pair_bounds(problem, w, m), w, m) for w, m in pipelines),
                     key=lambda item: item[0].latency_lb_s(item[2]))
    # a heuristic pass for a close incumbent, the pairs whose balanced pipelines are
    # fastest first (a close incumbent early prunes the rest of it), then the exact one
    promising = sorted(ordered, key=lambda item: seeds.get((item[1], item[2]), math.inf))
    for bounds, w, m in promising[:BEAM_PAIRS]:
        if bounds.latency_lb_s(m) <= inc.latency_s * _TOL:
            _search_width_microbatches(problem, w, m, inc, bounds, BEAM_WIDTH)
    for bounds, w, m in ordered:
        if bounds.latency_lb_s(m) > inc.latency_s * _TOL:
            break
        _search_width_microbatches(problem, w, m, inc, bounds)
    if not inc.found:
        raise NoFeasiblePlanError(_nothing_fits(problem))
    return _ranked(problem, inc.found, candidates)


def _ranked(problem: PlanProblem, found: list[_Found], candidates: int) -> list[HybridPlan]:
    """Best first; near-ties (within 1e-9): fewer stages, fewer micro-batches, then the
    simpler gradient sync first."""
    best = min(f.latency_s for f in found)

    def key(f: _Found):
        tied = f.latency_s <= best * _TOL
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
