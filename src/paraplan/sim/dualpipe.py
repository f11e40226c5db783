"""DualPipe and DualPipeV: DeepSeek-V3's bidirectional pipeline schedules, their op
orders and their own event engine.

DualPipe (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv 2412.19437, Sec. 3.2.1;
the order as deepseek-ai/DualPipe's `dualpipe.py` issues it): p pipeline ranks (p even)
and M micro-batches (M even, M >= 2p), M / 2 fed from each end. Pipeline (direction) 0
runs stage k on rank k, pipeline 1 runs stage k on rank p - 1 - k, so each rank holds
two model chunks, stage r of pipeline 0 (its chunk 0) and stage p - 1 - r of pipeline 1
(its chunk 1): the model's weights twice. DualPipeV (Sea AI Lab's "cut-in-half",
`dualpipev.py`): one pipeline of 2D stages over D ranks in a V, stage g on rank g for
g < D and on rank 2D - 1 - g after (chunk 0 and 1), M >= 2D micro-batches.

Each rank runs eight steps (the repository's names: nF0, nF0F1, nB1W1F1, the main
nF0B1F1B0, nB1F1B0, nB1B0, nWB0, nW). Five kinds of op:
- F: a chunk's forward;
- B: a chunk's whole backward (input and weight gradients);
- I: the input gradient alone, its weight gradient deferred to a later W (zero bubble);
- W: the oldest deferred weight gradient of the rank (first in, first out);
- P: a pair, one micro-batch's forward overlapped with another's whole backward (the
  main step's "F&B"), on the rank's compute stream as one op.

Costs are per pipeline stage (`DualPipeCosts`): F, B, W, and, for the pair, the share
of each pass when it runs beside the other (`pair_fwd_s`, `pair_bwd_s`; a pair takes
the forward's plus the backward's share). Dependencies: F(g) needs F(g - 1) of the same
micro-batch plus the transfer across that boundary; B, I or the pair's backward at g
needs the forward at g and the backward at g + 1 plus its transfer; W follows its I
on the same rank. Transfers run on their own stream: each delays its consumer by its
cost and never holds the sender (the pair's pipeline sends, like its all-to-alls, run
beside compute; what their kernels take from it is in the op times the builder
gives). Each rank runs its ops in order, each as soon as its inputs allow.

Table 2 of the report (the repository's README): bubble (p/2 - 1)(F&B + B - 3W) for
DualPipe, where F&B is a pair's time; activations of p + 1 micro-batch chunks at most
per rank; 2x the weights of a p-stage 1F1B rank.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

import numpy as np

from paraplan.core.errors import StrategyError
from paraplan.core.run_settings_checks import check_dualpipe

DualPipeName = Literal["dualpipe", "dualpipev"]


class DualOp(IntEnum):
    """An op of a DualPipe rank's order (module doc)."""

    F = 0
    B = 1
    I = 2  # noqa: E741  (the repository's zero-bubble input gradient)
    W = 3
    P = 4


@dataclass(frozen=True)
class RankOp:
    """One op of a rank: its kind, and the model chunk and per-pipeline micro-batch it
    runs (a pair: the forward's; `chunk2`, `mb2`: the pair's backward, else -1). A W
    names the chunk and micro-batch whose deferred weight gradient it computes."""

    kind: DualOp
    chunk: int
    mb: int
    chunk2: int = -1
    mb2: int = -1


@dataclass(frozen=True)
class Layout:
    """Where a schedule puts its stages: `pipelines` pipelines of `stages` stages, each
    `per_pipeline` micro-batches; stage g of pipeline d runs on `rank_of(d, g)` as its
    chunk `chunk_of(d, g)`."""

    schedule: DualPipeName
    ranks: int
    microbatches: int

    @property
    def pipelines(self) -> int:
        return 2 if self.schedule == "dualpipe" else 1

    @property
    def stages(self) -> int:
        return self.ranks if self.schedule == "dualpipe" else 2 * self.ranks

    @property
    def per_pipeline(self) -> int:
        return self.microbatches // self.pipelines

    def rank_of(self, pipe: int, stage: int) -> int:
        if self.schedule == "dualpipe":
            return stage if pipe == 0 else self.ranks - 1 - stage
        return stage if stage < self.ranks else 2 * self.ranks - 1 - stage

    def chunk_of(self, pipe: int, stage: int) -> int:
        return pipe if self.schedule == "dualpipe" else int(stage >= self.ranks)

    def place(self, rank: int, chunk: int) -> tuple[int, int]:
        """(pipeline, stage) of a rank's chunk."""
        if self.schedule == "dualpipe":
            return chunk, rank if chunk == 0 else self.ranks - 1 - rank
        return 0, rank if chunk == 0 else 2 * self.ranks - 1 - rank

    def global_mb(self, rank: int, chunk: int, mb: int) -> int:
        """A micro-batch's number across the iteration: pipeline d's i-th is d M / 2 + i."""
        return self.place(rank, chunk)[0] * self.per_pipeline + mb


def rank_order(layout: Layout, rank: int) -> list[RankOp]:
    """The ops of one rank in the order the repository's `step` runs them (module doc)."""
    p = layout.ranks
    if layout.schedule == "dualpipe":
        half_ranks, half_rank = p // 2, min(rank, p - 1 - rank)
        flip, middle = int(rank >= p // 2), half_rank == p // 2 - 1
    else:
        half_ranks, half_rank, flip, middle = p, rank, 0, rank == p - 1
    n = layout.per_pipeline
    next_f, next_b = [0, 0], [0, 0]
    deferred: list[tuple[int, int]] = []
    out: list[RankOp] = []

    def fwd(phase: int) -> None:
        c = phase ^ flip
        out.append(RankOp(DualOp.F, c, next_f[c]))
        next_f[c] += 1

    def bwd(phase: int, zero_bubble: bool = False) -> None:
        c = phase ^ flip
        out.append(RankOp(DualOp.I if zero_bubble else DualOp.B, c, next_b[c]))
        if zero_bubble:
            deferred.append((c, next_b[c]))
        next_b[c] += 1

    def pair(phase0: int, phase1: int) -> None:
        cf, cb = phase0 ^ flip, phase1 ^ flip
        out.append(RankOp(DualOp.P, cf, next_f[cf], cb, next_b[cb]))
        next_f[cf] += 1
        next_b[cb] += 1

    def weight() -> None:
        c, m = deferred.pop(0)
        out.append(RankOp(DualOp.W, c, m))

    rest = half_ranks - half_rank - 1
    for _ in range(2 * rest):  # 1: nF0
        fwd(0)
    for _ in range(half_rank + 1):  # 2: nF0F1
        fwd(0)
        fwd(1)
    for _ in range(rest):  # 3: nB1W1F1
        bwd(1, zero_bubble=True)
        weight()
        fwd(1)
    for i in range(n - 2 * half_ranks + half_rank + 1):  # 4: nF0B1F1B0
        if i == 0 and middle:  # the repository runs these two apart, "to further reduce bubble size"
            fwd(0)
            bwd(1)
        else:
            pair(0, 1)
        pair(1, 0)
    for _ in range(rest):  # 5: nB1F1B0
        bwd(1)
        pair(1, 0)
    zero_bubble = False
    for i in range(half_rank + 1):  # 6: nB1B0, zero bubble from the middle on
        if i == (half_rank + 1) // 2 and half_rank % 2 == 1:
            zero_bubble = True
        bwd(1, zero_bubble)
        if i == (half_rank + 1) // 2 and half_rank % 2 == 0:
            zero_bubble = True
        bwd(0, zero_bubble)
    for _ in range(rest):  # 7: nWB0
        weight()
        bwd(0, zero_bubble=True)
    for _ in range(half_rank + 1):  # 8: nW
        weight()
    if deferred or any(f != n for f in next_f[: 2]) or any(b != n for b in next_b[: 2]):
        raise AssertionError(f"{layout.schedule} order of rank {rank} does not run every micro-batch once")
    return out


def orders(schedule: str, ranks: int, microbatches: int) -> tuple[tuple[RankOp, ...], ...]:
    """Every rank's order, checked (`check_dualpipe`); computed once per (schedule, ranks,
    micro-batches) while it is in the cache (z6-plansearch: the planner runs many DualPipe
    iterations of one shape; the ops are frozen)."""
    check_dualpipe(schedule, ranks, microbatches)
    return _orders(schedule, ranks, microbatches)


@functools.lru_cache(maxsize=16)
def _orders(schedule: str, ranks: int, microbatches: int) -> tuple[tuple[RankOp, ...], ...]:
    layout = Layout(schedule, ranks, microbatches)  # type: ignore[arg-type]
    return tuple(tuple(rank_order(layout, r)) for r in range(ranks))


@dataclass(frozen=True, eq=False)
class DualPipeCosts:
    """Per pipeline stage (shape (S,): S = p for DualPipe, 2D for DualPipeV), the time of
    a forward, a whole backward and its weight-gradient part, and each pass's share of a
    pair; per stage boundary (shape (S - 1,)) the transfer between stage g and g + 1
    (the same in both pipelines of DualPipe, which cross the same links)."""

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    wgt_s: np.ndarray
    pair_fwd_s: np.ndarray
    pair_bwd_s: np.ndarray
    send_s: np.ndarray
    contended_s: np.ndarray | None = None
    """Per stage: what the transfers' kernels take from its forward and backward together
    (already in `fwd_s`, `bwd_s` and the pair's; `paraplan.predict.dualpipe_build`); None: none."""

    @staticmethod
    def uniform(stages: int, fwd_s: float, bwd_s: float, wgt_s: float = 0.0, pair_s: float | None = None,
                send_s: float = 0.0) -> DualPipeCosts:
        """Equal stages; a pair of `pair_s` split between its passes in proportion to F
        and B (default: F + B, no overlap gain)."""
        total = fwd_s + bwd_s if pair_s is None else pair_s
        share = fwd_s / (fwd_s + bwd_s) if fwd_s + bwd_s > 0 else 0.5
        full = np.full
        return DualPipeCosts(full(stages, float(fwd_s)), full(stages, float(bwd_s)), full(stages, float(wgt_s)),
                             full(stages, total * share), full(stages, total * (1 - share)),
                             full(max(stages - 1, 0), float(send_s)))

    @property
    def stages(self) -> int:
        return int(self.fwd_s.shape[0])


@dataclass(frozen=True, eq=False)
class DualPipeRun:
    """Every op that ran, in each rank's order: aligned arrays. A pair is two rows, its
    forward then its backward (`pair` True on both), each over its share of the pair."""

    rank: np.ndarray
    kind: np.ndarray  # DualOp (F, B, I, W); a pair's rows are F and B
    chunk: np.ndarray
    microbatch: np.ndarray  # across the iteration (`Layout.global_mb`)
    pair: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    ranks: int

    @property
    def makespan_s(self) -> float:
        return float(self.end_s.max()) if self.end_s.size else 0.0

    def busy_s(self) -> np.ndarray:
        return np.bincount(self.rank, weights=self.end_s - self.start_s, minlength=self.ranks)

    def bubble_s(self) -> np.ndarray:
        """Per rank: idle time of its compute stream before its last op ends."""
        last = np.zeros(self.ranks)
        np.maximum.at(last, self.rank, self.end_s)
        return last - self.busy_s()

    def last_weight_grad(self, rank: int, chunk: int) -> tuple[float, float]:
        """(start, end) of the rank's last op computing `chunk`'s weight gradient (a W,
        a whole backward, or a pair's backward)."""
        sel = (self.rank == rank) & (self.chunk == chunk) & np.isin(self.kind, (DualOp.B, DualOp.W))
        i = int(np.flatnonzero(sel)[-1])
        return float(self.start_s[i]), float(self.end_s[i])


@dataclass(frozen=True, eq=False)
class _Compiled:
    """A schedule's ops in one order that respects every dependency, each with what it
    waits for, and where its rows go in a `DualPipeRun`. Which op can run next depends on
    the orders alone (an input is there or not), never on the costs, so one symbolic run
    of the engine's sweep serves every set of costs: `execute` then times the ops in one
    pass (z7-dualpipe: was one sweep of readiness checks per call, 40-90 ms at 16 ranks
    and 512 micro-batches)."""

    rank: list[int]
    code: list[int]  # DualOp
    stage: list[int]  # the op's stage (a pair: its forward's)
    stage2: list[int]  # a pair's backward's stage; else -1
    deps: list[tuple[int, int, int, int, int, int]]  # up to three (op, transfer) pairs it waits for; op -1: none,
    # transfer -1: none (the costs' transfers with a 0 appended)
    rows: list[tuple[int, int]]  # its row in the run (a pair: its forward's row, its backward's)
    row_rank: np.ndarray
    row_kind: np.ndarray
    row_chunk: np.ndarray
    row_mb: np.ndarray
    row_pair: np.ndarray


@functools.lru_cache(maxsize=16)
def _compiled(schedule: str, ranks: int, microbatches: int) -> _Compiled:
    plan = orders(schedule, ranks, microbatches)
    layout = Layout(schedule, ranks, microbatches)  # type: ignore[arg-type]
    nd, ns, n = layout.pipelines, layout.stages, layout.per_pipeline
    f_op = np.full((nd, ns, n), -1, dtype=np.int64)  # the op whose end is the forward's output
    b_op = np.full((nd, ns, n), -1, dtype=np.int64)
    places = [[layout.place(r, c) for c in (0, 1)] for r in range(ranks)]
    op_rank: list[int] = []
    op_code: list[int] = []
    op_stage: list[int] = []
    op_stage2: list[int] = []
    op_deps: list[tuple[int, int, int, int, int, int]] = []
    op_rows: list[tuple[int, int]] = []
    raw_rows: list[tuple[int, int, int, int, bool]] = []  # rank, kind, chunk, global micro-batch, pair

    def f_dep(r: int, c: int, m: int) -> tuple[int, int] | None:
        """(op, transfer) the forward waits for; (-1, -1) at the first stage; None: not yet run."""
        d, g = places[r][c]
        if g == 0:
            return -1, -1
        up = int(f_op[d, g - 1, m])
        return None if up < 0 else (up, g - 1)

    def b_dep(r: int, c: int, m: int) -> tuple[int, int, int, int] | None:
        d, g = places[r][c]
        own = int(f_op[d, g, m])
        if own < 0:
            return None
        if g == ns - 1:
            return own, -1, -1, -1
        down = int(b_op[d, g + 1, m])
        return None if down < 0 else (own, -1, down, g)

    ptr = [0] * ranks
    progress = True
    while progress:
        progress = False
        for r in range(ranks):
            order = plan[r]
            while ptr[r] < len(order):
                op = order[ptr[r]]
                d, g = places[r][op.chunk]
                deps: tuple[int, int, int, int, int, int] = (-1, -1, -1, -1, -1, -1)
                if op.kind == DualOp.F:
                    a = f_dep(r, op.chunk, op.mb)
                    if a is None:
                        break
                    deps = (*a, -1, -1, -1, -1)
                elif op.kind in (DualOp.B, DualOp.I):
                    b = b_dep(r, op.chunk, op.mb)
                    if b is None:
                        break
                    deps = (*b, -1, -1)
                elif op.kind == DualOp.P:
                    a, b = f_dep(r, op.chunk, op.mb), b_dep(r, op.chunk2, op.mb2)
                    if a is None or b is None:
                        break
                    deps = (*a, *b)
                i = len(op_rank)
                op_rank.append(r)
                op_code.append(int(op.kind))
                op_stage.append(g)
                op_deps.append(deps)
                mb = layout.global_mb(r, op.chunk, op.mb)
                if op.kind == DualOp.P:
                    d2, g2 = places[r][op.chunk2]
                    f_op[d, g, op.mb] = b_op[d2, g2, op.mb2] = i  # both outputs are sent once the pair ends
                    op_stage2.append(g2)
                    op_rows.append((len(raw_rows), len(raw_rows) + 1))
                    raw_rows.append((r, DualOp.F, op.chunk, mb, True))
                    raw_rows.append((r, DualOp.B, op.chunk2, layout.global_mb(r, op.chunk2, op.mb2), True))
                else:
                    if op.kind == DualOp.F:
                        f_op[d, g, op.mb] = i
                    elif op.kind in (DualOp.B, DualOp.I):
                        b_op[d, g, op.mb] = i
                    op_stage2.append(-1)
                    op_rows.append((len(raw_rows), -1))
                    raw_rows.append((r, int(op.kind), op.chunk, mb, False))
                ptr[r] += 1
                progress = True
    stuck = [r for r in range(ranks) if ptr[r] < len(plan[r])]
    if stuck:
        raise AssertionError(f"{schedule} order deadlocks at rank {stuck[0]}, op {ptr[stuck[0]]}")
    cols = list(zip(*raw_rows, strict=True))
    rank = np.array(cols[0], dtype=np.int32)
    by_rank = np.argsort(rank, kind="stable")  # rows were made sweep by sweep; a run lists them rank by rank
    position = np.empty_like(by_rank)
    position[by_rank] = np.arange(by_rank.size)
    rows = [(int(position[a]), int(position[b]) if b >= 0 else -1) for a, b in op_rows]
    columns: list[np.ndarray] = [rank[by_rank], np.array(cols[1], dtype=np.int8)[by_rank],
                                 np.array(cols[2], dtype=np.int32)[by_rank],
                                 np.array(cols[3], dtype=np.int32)[by_rank], np.array(cols[4], dtype=bool)[by_rank]]
    for column in columns:  # shared by every run of this shape: read-only
        column.flags.writeable = False
    return _Compiled(op_rank, op_code, op_stage, op_stage2, op_deps, rows, *columns)


def execute(schedule: str, ranks: int, microbatches: int, costs: DualPipeCosts) -> DualPipeRun:
    """Run every rank's order as soon as its inputs allow (module doc): each op starts at
    the later of its rank's previous op's end and its inputs' arrival."""
    layout = Layout(schedule, ranks, microbatches)  # type: ignore[arg-type]
    check_dualpipe(schedule, ranks, microbatches)
    if costs.stages != layout.stages or costs.send_s.shape != (max(layout.stages - 1, 0),):
        raise StrategyError(f"{schedule} over {ranks} ranks runs {layout.stages} stages; the costs describe "
                            f"{costs.stages} stages and {costs.send_s.shape[0]} boundaries")
    c = _compiled(schedule, ranks, microbatches)
    fwd, bwd, wgt = costs.fwd_s.tolist(), costs.bwd_s.tolist(), costs.wgt_s.tolist()
    pf, pb = costs.pair_fwd_s.tolist(), costs.pair_bwd_s.tolist()
    send = [*costs.send_s.tolist(), 0.0]  # index -1: no transfer
    ends = [0.0] * len(c.rank)
    clock = [0.0] * ranks
    start_s, end_s = np.empty(c.row_rank.size), np.empty(c.row_rank.size)
    starts, finishes = start_s.tolist(), end_s.tolist()
    for i, (r, code, g, (a, sa, b, sb, e, se), (row, row2)) in enumerate(
            zip(c.rank, c.code, c.stage, c.deps, c.rows, strict=True)):
        t = clock[r]
        if a >= 0 and ends[a] + send[sa] > t:
            t = ends[a] + send[sa]
        if b >= 0 and ends[b] + send[sb] > t:
            t = ends[b] + send[sb]
        if e >= 0 and ends[e] + send[se] > t:
            t = ends[e] + send[se]
        if code == DualOp.F:
            end = t + fwd[g]
        elif code == DualOp.B:
            end = t + bwd[g]
        elif code == DualOp.I:
            end = t + bwd[g] - wgt[g]
        elif code == DualOp.W:
            end = t + wgt[g]
        else:
            mid = t + pf[g]
            end = mid + pb[c.stage2[i]]
            starts[row2], finishes[row2] = mid, end
            finishes[row] = mid
        starts[row] = t
        if code != DualOp.P:
            finishes[row] = end
        ends[i] = clock[r] = end
    return DualPipeRun(c.row_rank, c.row_kind, c.row_chunk, c.row_mb, c.row_pair, np.array(starts),
                       np.array(finishes), ranks)


def inflight_peak(schedule: str, ranks: int, microbatches: int) -> np.ndarray:
    """Per rank: the most micro-batch chunks whose activations it holds at once (held
    from a chunk's forward to the end of its backward: the whole backward, or the W of
    a deferred one)."""
    peaks = np.zeros(ranks, dtype=np.int64)
    for r, order in enumerate(orders(schedule, ranks, microbatches)):
        held = peak = 0
        for op in order:
            if op.kind in (DualOp.F, DualOp.P):
                held += 1
                peak = max(peak, held)
            if op.kind in (DualOp.B, DualOp.W, DualOp.P):
                held -= 1
        peaks[r] = peak
    return peaks


def table2_bubble_s(ranks: int, fwd_s: float, bwd_s: float, wgt_s: float, pair_s: float) -> float:
    """Table 2 of the DeepSeek-V3 report: DualPipe's bubble (p/2 - 1)(F&B + B - 3W), p
    pipeline stages (the ranks), F&B a pair's time."""
    return (ranks / 2 - 1) * (pair_s + bwd_s - 3 * wgt_s)
