"""The labels of the hybrid search's dynamic program (`search.py`): one partial plan
(the stages so far) per label, the Pareto set of labels of one state (`Bucket`), the
heuristic pass's few labels of least latency (`Beam`), and a state's labels as aligned
arrays (`LabelArrays`) for the vectorised transitions.

A label's ending is max(0, max_t A_t - t beta) over the all-reduce lines (A_t, t) of
its stages at the final block beta: only the lines that can still show (the upper
envelope for blocks >= the label's `from_s`) are kept, with the kinks where the next
line takes over."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from paraplan.plan.hybrid.records import StageSlot

UNLIMITED = 1 << 30
"""A stage limit memory does not bound (more stages than any plan has)."""


@dataclass(slots=True)  # not frozen (faster to build); never changed once built
class Label:
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


ROOT = Label(0.0, 0.0, (), (), 0.0, UNLIMITED, ())
"""The empty plan: no stage yet."""


def envelope(lines, beta0: float) -> tuple[tuple[tuple[float, int], ...], tuple[float, ...]]:
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


def ending(lines: tuple[tuple[float, int], ...], block_s: float) -> float:
    """The ending max(0, max_i a_i - t_i beta) of `lines` at beta = `block_s` (s)."""
    out = 0.0
    for a, t in lines:
        value = a - t * block_s
        if value > out:
            out = value
    return out


def _beats(a: Label, b: Label, beta0: float, slack: float, hi: float, b_at0: float, b_at_hi: float) -> bool:
    """Whether label a dominates label b of the same state (`Bucket.insert` checks the
    cheap conditions first: a's block <= beta0, a's path <= b's, a's stage limit >= b's):
    every completion of b that can matter is at least as slow with a's prefix instead.
    beta0 = max(b's from, the state's floor), slack = b's path - a's, hi = max(block
    cap, beta0) (`bounds.PairBounds.block_cap_s`: no completion with a larger block
    beats the incumbent), b_at0 and b_at_hi: b's ending at beta0 and at hi.

    For a completion F, b's final block is beta >= beta0; a's is at most beta when a's
    block <= beta0, and a evaluated at beta is no faster than at its own final block
    (the latency does not decrease with the block), so it suffices that path_a +
    ending_a(beta) <= path_b + ending_b(beta) for every beta in [beta0, hi], and path_a
    <= path_b (for when F's own all-reduce sets the ending). Beyond the cap b + F is
    slower than the incumbent (latency >= (M - 1) beta + the pair's path bound),
    whatever a + F is. The incumbent only improves,
    so a cap that held when b was dropped holds for every plan that can still beat it;
    the two endings are piecewise linear, so the test at beta0, at hi and at the kinks
    between them is exact."""
    a_lines = a.lines
    ending_a = ending(a_lines, beta0)
    if ending_a <= slack:  # a's ending only falls
        return True
    if ending_a > slack + b_at0 or ending(a_lines, hi) > slack + b_at_hi:
        return False
    b_lines = b.lines
    for kinks in (a.kinks, b.kinks):
        for k in kinks:
            if beta0 < k < hi and ending(a_lines, k) > slack + ending(b_lines, k):
                return False
    return True


class Bucket:
    """The labels of one state, and the largest block floor known for it (every floor
    is a lower bound on the final block of the state's completions)."""

    __slots__ = ("floor_s", "labels", "paths")

    def __init__(self) -> None:
        self.floor_s = 0.0
        self.labels: list[Label] = []
        self.paths: list[float] = []  # the labels' paths (`insert` keeps them sorted)

    def ranked(self) -> list[Label]:
        return self.labels

    def insert(self, label: Label, floor_s: float, cap_s: float) -> None:
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
            at0, at_hi = ending(lines, beta0), ending(lines, hi)
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
                if _beats(label, o, beta_o, o.path_s - path, hi_o, ending(o_lines, beta_o), ending(o_lines, hi_o)):
                    continue
            kept.append(o)
        if len(kept) == len(labels) + 1:
            self.paths.insert(at, path)
        else:
            self.paths = [la.path_s for la in kept]
        self.labels = kept


class Beam:
    """The labels of one state in the heuristic pass: of all labels offered, the
    `width` of least score (the latency of the stages so far as if they were the whole
    plan, s; ties: the first offered), in the order they were offered while no more
    than `width` were, else by score."""

    __slots__ = ("labels", "offered", "scores", "width")

    def __init__(self, width: int) -> None:
        self.width = width
        self.offered = 0
        self.labels: list[Label] = []
        self.scores: list[float] = []

    def admits(self, score: float) -> bool:
        """Whether a label of `score` offered now would be kept (counts the offer)."""
        self.offered += 1
        return len(self.labels) < self.width or score < max(self.scores)

    def add(self, label: Label, score: float) -> None:
        """Keep `label` (after `admits`), dropping the worst kept label (the last
        offered of the highest score) when there are too many."""
        self.labels.append(label)
        self.scores.append(score)
        if len(self.labels) > self.width:
            worst = max(range(len(self.scores)), key=lambda i: (self.scores[i], i))
            del self.labels[worst], self.scores[worst]

    def ranked(self) -> list[Label]:
        if self.offered <= self.width:
            return self.labels
        order = sorted(range(len(self.labels)), key=lambda i: self.scores[i])  # stable: the first offered first
        return [self.labels[i] for i in order]


@dataclass(frozen=True, eq=False)
class LabelArrays:
    """The labels of one state as aligned arrays, one entry per label (a struct of
    arrays for the vectorised transitions); the all-reduce lines padded with (-inf, 0)
    to a common count (at least 1)."""

    labels: list[Label]
    block_s: np.ndarray
    from_s: np.ndarray
    path_s: np.ndarray
    max_stages: np.ndarray
    line_a_s: np.ndarray  # (labels, lines): each line's A_t
    line_t: np.ndarray  # (labels, lines): each line's stage index t

    @classmethod
    def of(cls, labels: list[Label]) -> LabelArrays:
        width = max(1, max(len(la.lines) for la in labels))
        line_a = np.full((len(labels), width), -np.inf)
        line_t = np.zeros((len(labels), width))
        for i, la in enumerate(labels):
            for k, (a, t) in enumerate(la.lines):
                line_a[i, k], line_t[i, k] = a, t
        return cls(labels, np.array([la.block_s for la in labels]), np.array([la.from_s for la in labels]),
                   np.array([la.path_s for la in labels]), np.array([la.max_stages for la in labels]),
                   line_a, line_t)

    def ending_s(self, start: np.ndarray, block_s: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """max(`start`, the labels' lines at `block_s`): `block_s` is (labels, ...) with
        one row per label, or per entry of `rows` (label indices) when given."""
        a, t = (self.line_a_s, self.line_t) if rows is None else (self.line_a_s[rows], self.line_t[rows])
        extra = (None,) * (block_s.ndim - 1)
        out = start
        for k in range(a.shape[1]):
            out = np.maximum(out, a[(slice(None), k, *extra)] - t[(slice(None), k, *extra)] * block_s)
        return out
