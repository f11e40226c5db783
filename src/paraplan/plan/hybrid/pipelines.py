"""The hybrid search's dynamic program over pipelines (>= 2 stages) of one (W, M) pair
(`search.py` says what it searches and why it is exact).

States are (layers covered j, devices used d, stages s, "last stage sits in one
node"), their values sets of labels (`labels.py`). Layer by layer, every state
completes its labels with a last stage (`_finish`) and extends them with one more
stage (`_extend`), vectorised over the (replica count, stop) pairs of the new stage
and the state's labels: what a stage starting at layer j costs on each replica count
is built once per layer (`LayerCosts`), what it costs after a given state once per
state (`StageOptions`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from paraplan.plan.hybrid.bounds import (
    TOL,
    BlockFloor,
    Incumbent,
    NextStages,
    Pair,
    PairBounds,
    block_floor,
    bound_ok,
    first_stage_passes,
    inflight,
)
from paraplan.plan.hybrid.labels import ROOT, UNLIMITED, Beam, Bucket, Label, LabelArrays, envelope
from paraplan.plan.hybrid.problem import PlanProblem
from paraplan.plan.hybrid.records import StageSlot

_State = tuple[int, int, bool]  # devices used d, stages s, the last stage sits in one node


@dataclass(frozen=True, eq=False)
class LayerCosts:
    """What a stage starting at layer j costs on each replica count r = 1, 2, ...
    (rows): as the last stage (layers j..), or ending at each stop j+1..L-1 (columns)."""

    stops: np.ndarray
    end_compute_s: np.ndarray  # (r,): per micro-batch
    end_inflight: np.ndarray  # (r,): micro-batches memory holds in flight
    compute_s: np.ndarray  # (r, stops)
    inflight: np.ndarray  # (r, stops)


@dataclass(frozen=True, eq=False)
class StageOptions:
    """The next stage of one state (d devices used, s stages so far) at layer j, for
    each replica count r it may have (1..rmax): what it costs, and the least latency
    the stage time must leave room for (`cap_r`: latency >= M c + path + x)."""

    j: int
    d: int
    s: int
    rs: np.ndarray
    samples_r: np.ndarray
    x_r: np.ndarray  # the transfer into the stage (0 for the first)
    cap_r: np.ndarray
    costs: LayerCosts  # its rows cut to rmax


@dataclass(frozen=True, eq=False)
class _Extensions:
    """(label, (r, stop)) pairs that pass every bound, r-major, with what their new
    labels hold."""

    ii: np.ndarray  # label index
    kk: np.ndarray  # (r, stop) column
    r_f: np.ndarray  # per column: replicas, stop, the rest's block floor, the stage's all-reduce
    stops: np.ndarray
    rest_floor_s: np.ndarray
    allreduce_s: np.ndarray
    one_node_of: dict[int, bool]
    block_s: np.ndarray  # per (label, column) pair kept
    path_s: np.ndarray
    max_stages: np.ndarray


class PairProgram:
    """The dynamic program of one (W, M) pair; completed plans go to the incumbent.
    `beam` > 0: a heuristic pass instead (only seeds the incumbent): each state extends
    only its `beam` labels of least latency so far."""

    def __init__(self, pair: Pair, inc: Incumbent, beam: int = 0) -> None:
        problem = pair.problem
        self.pair, self.inc, self.beam = pair, inc, beam
        n_layers = problem.num_layers
        self.most_replicas = math.floor(pair.micro_batch)  # >= 1 sample per replica
        # where each copy starts inside a node
        self.residues = np.unique(np.arange(pair.copies) * pair.w % problem.cluster.devices_per_node)
        self.floor_for = math.inf
        self.floor = BlockFloor(np.zeros((n_layers + 1, pair.w + 1)))
        self.states: list[dict[_State, Bucket | Beam]] = [dict() for _ in range(n_layers + 1)]
        root = self.states[0][(0, 0, True)] = self._bucket()
        root.labels.append(ROOT)
        self.r_all = np.arange(1, min(pair.w, self.most_replicas) + 1)  # replica counts a stage may have
        self.samples_all = pair.micro_batch / self.r_all

    def _bucket(self) -> Bucket | Beam:
        return Beam(self.beam) if self.beam else Bucket()

    def run(self) -> None:
        for j in range(self.pair.problem.num_layers):
            self._layer(j)
            self.states[j] = {}  # done with this layer

    def _layer(self, j: int) -> None:
        pair, inc = self.pair, self.inc
        if inc.latency_s < self.floor_for * (1 - 1e-3):  # the incumbent improved: tighter floors
            self.floor_for = inc.latency_s
            self.floor = block_floor(pair.problem, pair.w, pair.bounds, pair.bounds.block_cap_s(pair.m, inc.latency_s))
        # no plan that beats the incumbent has a larger block
        block_cap = pair.bounds.block_cap_s(pair.m, inc.latency_s) * TOL
        costs: LayerCosts | None = None  # what layers j.. cost on each replica count (once per layer)
        for (d, s, last_one_node), bucket in self.states[j].items():
            if s >= pair.max_stages:
                continue
            labels = LabelArrays.of(bucket.ranked())
            rmax = min(pair.w - d, self.most_replicas)  # >= 1 sample per replica
            if rmax < 1:
                continue
            if costs is None:
                costs = self._layer_costs(j)
            opts = self._options(j, (d, s, last_one_node), costs, rmax, float(labels.path_s.min()))
            if s >= 1:  # the last stage: layers j.. end on r devices
                self._finish_all(labels, opts)
            if s + 2 <= pair.max_stages and costs.stops.size:
                self._extend(labels, opts, block_cap)

    def _layer_costs(self, j: int) -> LayerCosts:
        problem = self.pair.problem
        n_layers = problem.num_layers
        stops = np.arange(j + 1, n_layers)
        samples = self.samples_all
        return LayerCosts(stops, problem.compute_s(j, n_layers, samples),
                          inflight(problem, j, np.array([n_layers]), samples[:, None])[:, 0],
                          problem.compute_s(j, stops[None, :], samples[:, None]),
                          inflight(problem, j, stops[None, :], samples[:, None]))

    def _options(self, j: int, state: _State, costs: LayerCosts, rmax: int, min_path_s: float) -> StageOptions:
        pair, problem = self.pair, self.pair.problem
        d, s, last_one_node = state
        rs = self.r_all[:rmax]
        if s == 0:
            x_r = np.zeros(rmax)
        else:
            x_cut_bytes = problem.cut_bytes_per_sample[j] * pair.micro_batch
            x_in = float(problem.transfer_s(x_cut_bytes, True))
            x_out = float(problem.transfer_s(x_cut_bytes, False))
            g = problem.cluster.devices_per_node
            intra_r = _one_node(self.residues, g, d - 1, d + rs - 1) if last_one_node else np.zeros(rmax, bool)
            x_r = np.where(intra_r, x_in, x_out)
        cap_r = (self.inc.latency_s * TOL - min_path_s - x_r) / pair.m  # latency >= M c + path + x
        cut = LayerCosts(costs.stops, costs.end_compute_s[:rmax], costs.end_inflight[:rmax],
                         costs.compute_s[:rmax], costs.inflight[:rmax])
        return StageOptions(j, d, s, rs, self.samples_all[:rmax], x_r, cap_r, cut)

    def _finish_all(self, labels: LabelArrays, opts: StageOptions) -> None:
        costs = opts.costs
        last_ok = (costs.end_compute_s <= opts.cap_r) & (costs.end_inflight >= 1)
        for fi in np.flatnonzero(last_ok).tolist():
            _finish(self.pair, self.inc, labels, opts, fi)

    def _extend(self, labels: LabelArrays, opts: StageOptions, block_cap: float) -> None:
        costs, remaining = opts.costs, self.pair.w - opts.d
        rest_r = remaining - opts.rs
        floor_rs = self.floor.floor_s[costs.stops[None, :], np.maximum(rest_r, 0)[:, None]]
        ok_rs = ((costs.compute_s <= opts.cap_r[:, None]) & (rest_r >= 1)[:, None] & np.isfinite(floor_rs)
                 & (costs.inflight >= 1))
        nxt = NextStages(opts.s, opts.x_r, costs.compute_s, costs.inflight, np.maximum(rest_r, 1), costs.stops,
                         floor_rs)
        if ok_rs.any():  # the label bound below without this stage's all-reduce
            ok_rs = bound_ok(self.pair, self.inc.latency_s, labels, nxt, ok_rs)
        ri_f, si_f = np.nonzero(ok_rs)  # every (r, stop) left at once, r-major
        if not ri_f.size:
            return
        ext = self._extensions(labels, opts, nxt, ri_f, si_f)
        if ext is not None:
            self._insert(labels, opts, ext, block_cap)

    def _extensions(self, labels: LabelArrays, opts: StageOptions, nxt: NextStages, ri_f: np.ndarray,
                    si_f: np.ndarray) -> _Extensions | None:
        """The label bound over labels x the (r, stop) pairs left: block, path and the
        latency at the smallest block the plan can have (module doc of `search.py`)."""
        pair, problem, s, j, d = self.pair, self.pair.problem, opts.s, opts.j, opts.d
        n_layers, m, b = problem.num_layers, pair.m, pair.micro_batch
        fx, var, params = problem.fixed_prefix_s, problem.var_prefix_s_per_sample, problem.param_prefix_bytes
        r_f, x_f, stops = opts.rs[ri_f], opts.x_r[ri_f], nxt.stops[si_f]
        c, kmax, rest_floor = nxt.compute_s[ri_f, si_f], nxt.inflight[ri_f, si_f], nxt.floor_s[ri_f, si_f]
        rest = (pair.w - d) - r_f
        stage_limit = np.where(kmax >= m, UNLIMITED, s + kmax).astype(np.int64)
        ar = np.empty(ri_f.size)
        one_node_of: dict[int, bool] = {}
        firsts = np.flatnonzero(np.diff(ri_f, prepend=-1))
        for lo, hi in zip(firsts.tolist(), [*firsts[1:].tolist(), ri_f.size], strict=True):
            r = int(r_f[lo])
            nodes = problem.nodes_spanned(d, r, pair.w, pair.copies)
            ar[lo:hi] = np.atleast_1d(problem.allreduce_s(params[stops[lo:hi]] - params[j], pair.copies * r, nodes))
            one_node_of[r] = problem.in_one_node(d, d + r - 1, pair.w, pair.copies)
        rest_fixed = fx[n_layers] - fx[stops]
        rest_var = (var[n_layers] - var[stops]) * b
        rest_spread = rest_var / rest  # the rest's block, at least
        rest_path = rest_fixed + rest_var / np.minimum(rest, self.most_replicas)  # no stage has more replicas
        x_next = pair.bounds.transfer_lb_s[stops]
        new_block = np.maximum(np.maximum(c, x_f)[None, :], labels.block_s[:, None])
        new_path = labels.path_s[:, None] + (x_f + c)[None, :]
        new_limit = np.minimum(stage_limit[None, :], labels.max_stages[:, None])
        beta = np.maximum(np.maximum(new_block, labels.from_s[:, None]),
                          np.maximum(np.maximum(rest_spread, x_next), rest_floor)[None, :])
        ending = labels.ending_s(np.maximum(ar[None, :] - s * beta, 0.0), beta)
        lb = (m - 1) * beta + new_path + (x_next + rest_path)[None, :] + ending
        ii, kk = np.nonzero((new_limit >= s + 2) & (lb <= self.inc.latency_s * TOL))
        if not ii.size:
            return None
        order = np.lexsort((kk, ii, ri_f[kk]))  # by r, then label, then stop
        ii, kk = ii[order], kk[order]
        return _Extensions(ii, kk, r_f, stops, rest_floor, ar, one_node_of, new_block[ii, kk], new_path[ii, kk],
                           new_limit[ii, kk])

    def _scores(self, labels: LabelArrays, s: int, ext: _Extensions) -> list[float]:
        """The heuristic pass's score of each new label: its latency as if its stages
        were the whole plan, at the smallest block it can have."""
        ii, kk = ext.ii, ext.kk
        since_ik = np.maximum(np.maximum(ext.block_s, ext.rest_floor_s[kk]), labels.from_s[ii])
        ending_ik = labels.ending_s(np.maximum(ext.allreduce_s[kk] - s * since_ik, 0.0), since_ik, rows=ii)
        return ((self.pair.m - 1) * since_ik + ext.path_s + ending_ik).tolist()

    def _insert(self, labels: LabelArrays, opts: StageOptions, ext: _Extensions, block_cap: float) -> None:
        """The new labels into their states' buckets (the beam: only those it admits)."""
        pair, beam, j, d, s = self.pair, self.beam, opts.j, opts.d, opts.s
        n_layers, remaining = pair.problem.num_layers, pair.w - opts.d
        r_list, stop_list = ext.r_f.tolist(), ext.stops.tolist()
        floor_list, ar_list = ext.rest_floor_s.tolist(), ext.allreduce_s.tolist()
        scores = self._scores(labels, s, ext) if beam else []
        for n, (i, k, blk, path, limit) in enumerate(zip(ext.ii.tolist(), ext.kk.tolist(), ext.block_s.tolist(),
                                                         ext.path_s.tolist(), ext.max_stages.tolist(), strict=True)):
            r = r_list[k]
            stop = stop_list[k]
            key_to = (d + r, s + 1, ext.one_node_of[r])
            bucket_to = self.states[stop].get(key_to)
            if bucket_to is None:
                bucket_to = self.states[stop][key_to] = self._bucket()
            if isinstance(bucket_to, Beam) and not bucket_to.admits(scores[n]):
                continue
            la = labels.labels[i]
            floor_k = floor_list[k]
            since = max(blk, floor_k, la.from_s)
            lines, kinks = envelope((*la.lines, (ar_list[k], s)), since)
            # no plan has more stages than layers or devices allow: a larger memory
            # limit is worth no more than this
            most = s + 1 + min(n_layers - stop, remaining - r, pair.max_stages - s - 1)
            label = Label(blk, path, lines, kinks, since, min(limit, most), (*la.slots, StageSlot(j, stop, r, d)))
            if isinstance(bucket_to, Beam):
                bucket_to.add(label, scores[n])
            else:
                bucket_to.insert(label, floor_k, block_cap)


def _finish(pair: Pair, inc: Incumbent, labels: LabelArrays, opts: StageOptions, fi: int) -> None:
    """Complete every label of a state with a last stage of layers j.. on the
    `fi`-th replica count of `opts`."""
    problem, m, s, j, d = pair.problem, pair.m, opts.s, opts.j, opts.d
    n_layers = problem.num_layers
    r = int(opts.rs[fi])
    x, c_end = float(opts.x_r[fi]), float(opts.costs.end_compute_s[fi])
    k_end = problem.stage_max_inflight(j, n_layers, float(opts.samples_r[fi]))
    limit_end = UNLIMITED if k_end >= m else s + int(k_end)
    nodes = problem.nodes_spanned(d, r, pair.w, pair.copies)
    ar_end = float(problem.allreduce_s(problem.param_prefix_bytes[n_layers] - problem.param_prefix_bytes[j],
                                       pair.copies * r, nodes))
    blk = np.maximum(labels.block_s, max(c_end, x))
    ending = labels.ending_s(np.maximum(ar_end - s * blk, 0.0), blk)
    lat = (m - 1) * blk + labels.path_s + x + c_end + ending
    ok = (np.minimum(labels.max_stages, limit_end) >= s + 1) & (lat <= inc.latency_s * TOL)
    for i in np.flatnonzero(ok):
        inc.offer(float(lat[i]), pair.w, m, (*labels.labels[i].slots, StageSlot(j, n_layers, r, d)))


def _one_node(residues: np.ndarray, devices_per_node: int, first: int, lasts: np.ndarray) -> np.ndarray:
    """For each last: devices first..last of a copy share a node in every copy
    (`PlanProblem.in_one_node`, vectorised over `lasts`); `residues`: the copies' first
    devices modulo the node size."""
    g = devices_per_node
    return ((residues[:, None] + first) // g == (residues[:, None] + lasts[None, :]) // g).all(axis=0)


def search_pair(problem: PlanProblem, w: int, m: int, inc: Incumbent, bounds: PairBounds, beam: int = 0) -> None:
    """Every pipeline (>= 2 stages) of `w` devices and `m` micro-batches that can beat
    the incumbent goes to `inc` (`beam` > 0: the heuristic pass, `PairProgram`)."""
    pair = Pair.of(problem, w, m, bounds)
    if not first_stage_passes(pair, inc.latency_s):
        return  # no plan of the pair beats the incumbent: no floors needed
    PairProgram(pair, inc, beam).run()
