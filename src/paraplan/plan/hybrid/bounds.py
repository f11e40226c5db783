"""What a plan of the hybrid search must beat and the lower bounds that prune it
(`search.py` says how they are used): the incumbent, the bounds shared by every
pipeline of one (W, M) pair, the block floors of the rest of a plan, and the label
bound over a state's labels x its next stages. Every bound holds for every completion
of what it prunes, so the search stays exact."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from paraplan.core import GradientSync
from paraplan.plan.hybrid.labels import UNLIMITED, LabelArrays
from paraplan.plan.hybrid.problem import PlanProblem
from paraplan.plan.hybrid.records import StageSlot

TOL = 1 + 1e-9
"""Relative slack of every pruning test (rounding)."""


@dataclass(frozen=True)
class Found:
    """A plan the search completed that was at least as fast as the incumbent then."""

    latency_s: float
    pipeline_devices: int
    microbatches: int
    slots: tuple[StageSlot, ...]
    gradient_sync: GradientSync = "end"


@dataclass
class Incumbent:
    """The least latency of any plan completed so far, and the plans that reached it."""

    latency_s: float = math.inf
    found: list[Found] = field(default_factory=list)

    def offer(self, latency_s: float, w: int, m: int, slots: tuple[StageSlot, ...],
              gradient_sync: GradientSync = "end") -> None:
        if latency_s <= self.latency_s * TOL:
            self.found.append(Found(latency_s, w, m, slots, gradient_sync))
        self.latency_s = min(self.latency_s, latency_s)


@dataclass(frozen=True)
class PairBounds:
    """Lower bounds shared by every pipeline (>= 2 stages) of one (W, M) pair."""

    micro_batch: float  # b, samples per micro-batch of one copy
    transfer_lb_s: np.ndarray  # per cut j (index 1..L-1): the cheaper of an intra- or inter-node transfer
    block_lb_s: float
    path_lb_s: float

    def latency_lb_s(self, microbatches: int) -> float:
        return (microbatches - 1) * self.block_lb_s + self.path_lb_s

    def block_cap_s(self, microbatches: int, incumbent_s: float) -> float:
        """The largest block a plan of this pair beating `incumbent_s` can have."""
        return (incumbent_s * TOL - self.path_lb_s) / (microbatches - 1)


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


def pair_bounds(problem: PlanProblem, w: int, m: int) -> PairBounds:
    """The bounds of the (W, M) pair: latency >= (M - 1) B + path, where the block B is
    at least the perfectly spread compute, the cheapest boundary transfer and each
    layer's time on the most replicas a stage may have; the path at least the fixed
    times, the spread compute and that transfer."""
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
    return PairBounds(b, x_lb, block, path)


@dataclass(frozen=True, eq=False)
class Pair:
    """One (W, M) pair of the search and what stays fixed over its dynamic program."""

    problem: PlanProblem
    w: int  # pipeline devices (one copy)
    m: int  # micro-batches per copy
    bounds: PairBounds
    copies: int
    max_stages: int

    @classmethod
    def of(cls, problem: PlanProblem, w: int, m: int, bounds: PairBounds) -> Pair:
        return cls(problem, w, m, bounds, problem.num_devices // w, min(m, w, problem.num_layers))

    @property
    def micro_batch(self) -> float:
        return self.bounds.micro_batch


@dataclass(frozen=True)
class BlockFloor:
    """The smallest block the layers j.. can have on `rest` devices of a copy, from
    below: `floor_s[j, rest]`, from the fewest devices that cover layers j.. with
    every stage at most B for a grid of B up to the block cap (`need[j, k]`: every
    stage's compute on its replicas and every boundary transfer at its cheaper tier at
    most B, every stage in memory with one micro-batch in flight, >= 1 sample per
    replica). need[j, k] > rest means no plan of the rest has a block <= grid[k], so
    floor = the largest such grid[k]; inf where not even the cap is reachable."""

    floor_s: np.ndarray  # (L + 1) x (W + 1)


def block_floor(problem: PlanProblem, w: int, bounds: PairBounds, block_cap_s: float,
                points: int = 48) -> BlockFloor:
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
    return BlockFloor(floor)


def inflight(problem: PlanProblem, first: int, stops: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """`PlanProblem.stage_max_inflight` broadcast over stops and samples per replica."""
    params, stash = problem.param_prefix_bytes, problem.stash_prefix_bytes_per_sample
    free = problem.memory.memory_bytes - problem.memory.model_state_factor * (params[stops] - params[first])
    per_mb = (stash[stops] - stash[first]) * samples
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.where(per_mb > 0, np.floor(free / per_mb), 1e9)
    return np.where(free < 0, -1.0, k)


@dataclass(frozen=True, eq=False)
class NextStages:
    """The stages a state (s stages so far) may add next and end before the last layer:
    replica counts r (rows) x stops (columns), with their transfer in, compute per
    micro-batch, micro-batches memory holds in flight, devices left after them, and the
    least block of the layers after them on those devices."""

    s: int
    x_r: np.ndarray  # (r,): the transfer into the stage, s
    compute_s: np.ndarray  # (r, stops)
    inflight: np.ndarray  # (r, stops)
    rest_r: np.ndarray  # (r,): devices of the copy left after the stage, at least 1
    stops: np.ndarray
    floor_s: np.ndarray  # (r, stops)


def bound_ok(pair: Pair, incumbent_s: float, labels: LabelArrays, nxt: NextStages, ok_rs: np.ndarray) -> np.ndarray:
    """The (r, stop) pairs of `ok_rs` some label may extend: the label bound of the
    dynamic program (`pipelines.py`) over labels x replica counts x stops, leaving out
    the new stage's all-reduce (>= 0), so it is never larger than the exact bound.

    In two steps, so the labels x r x stops product is never built: first with the
    labels' least block, floor, path and most stages and no ending (every term is
    non-decreasing in those, the ending is >= 0, and rounding is monotone, so this is
    at most every label's bound), then per label on the pairs left."""
    problem, m, s = pair.problem, pair.m, nxt.s
    b = pair.micro_batch
    n_layers = problem.num_layers
    fx, var = problem.fixed_prefix_s, problem.var_prefix_s_per_sample
    most_replicas = math.floor(b)
    cap = incumbent_s * TOL
    stops, rest_r, x_r, c_rs = nxt.stops, nxt.rest_r, nxt.x_r, nxt.compute_s
    rest_var = (var[n_layers] - var[stops]) * b
    rest_fixed = fx[n_layers] - fx[stops]
    rest_spread = rest_var[None, :] / rest_r[:, None]
    rest_path = rest_fixed[None, :] + rest_var[None, :] / np.minimum(rest_r, most_replicas)[:, None]
    x_next = pair.bounds.transfer_lb_s[stops][None, :]
    beta_rs = np.maximum(np.maximum(rest_spread, x_next), nxt.floor_s)
    tail_rs = x_r[:, None] + c_rs + x_next + rest_path  # this stage, the next transfer, the rest's path
    stage_limit = np.where(nxt.inflight >= m, UNLIMITED, s + nxt.inflight)
    beta0 = np.maximum(np.maximum(np.maximum(c_rs, x_r[:, None]), float(labels.block_s.min())),
                       np.maximum(float(labels.from_s.min()), beta_rs))
    ok = ok_rs & (np.minimum(stage_limit, int(labels.max_stages.max())) >= s + 2)
    ok &= (m - 1) * beta0 + float(labels.path_s.min()) + tail_rs <= cap
    ri, si = np.nonzero(ok)
    if not ri.size:
        return ok
    # per label, on the pairs left
    c, x = c_rs[ri, si], x_r[ri]
    new_block = np.maximum(np.maximum(c, x)[None, :], labels.block_s[:, None])
    beta = np.maximum(np.maximum(new_block, labels.from_s[:, None]), beta_rs[ri, si][None, :])
    ending = labels.ending_s(np.zeros_like(beta), beta)
    lb = (m - 1) * beta + labels.path_s[:, None] + tail_rs[ri, si][None, :] + ending
    ok_k = ((np.minimum(stage_limit[ri, si][None, :], labels.max_stages[:, None]) >= s + 2) & (lb <= cap)).any(axis=0)
    ok[ri, si] = ok_k
    return ok


def first_stage_passes(pair: Pair, incumbent_s: float) -> bool:
    """Whether some first stage passes the tests of the dynamic program at the root
    (stage time, memory, the label bound of `bound_ok`) with every block floor at 0.
    A floor only raises the bound, so when none passes, no plan of the pair beats the
    incumbent, and the block floors (`block_floor`, the costly part of a pair that
    yields nothing) need not be built."""
    problem, w, m = pair.problem, pair.w, pair.m
    b = pair.micro_batch
    rs = np.arange(1, min(w, math.floor(b)) + 1)
    samples_r = b / rs
    stops = np.arange(1, problem.num_layers)
    x_r = np.zeros(rs.size)
    cap_r = (incumbent_s * TOL - 0.0 - x_r) / m
    c_rs = problem.compute_s(0, stops[None, :], samples_r[:, None])
    kmax_rs = inflight(problem, 0, stops[None, :], samples_r[:, None])
    rest_r = w - rs
    ok_rs = (c_rs <= cap_r[:, None]) & (rest_r >= 1)[:, None] & (kmax_rs >= 1)
    if not ok_rs.any():
        return False
    root = LabelArrays(labels=[], block_s=np.zeros(1), from_s=np.zeros(1), path_s=np.zeros(1),
                       max_stages=np.array([UNLIMITED]), line_a_s=np.full((1, 1), -np.inf), line_t=np.zeros((1, 1)))
    nxt = NextStages(0, x_r, c_rs, kmax_rs, np.maximum(rest_r, 1), stops, np.zeros(c_rs.shape))
    return bool(bound_ok(pair, incumbent_s, root, nxt, ok_rs).any())
