"""The transformer planner's estimate (`estimate.py`) of a pipeline's time per iteration,
by schedule, from its stages' op times (the module doc of `estimate.py` states the closed
forms; y3 checked them against the engine's op orders, `tests/unit/test_plan_estimate_terms.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from paraplan.plan.transformer.columns import CandidateColumns

if TYPE_CHECKING:  # the estimate's own stage times (estimate.py imports this module)
    from paraplan.plan.transformer.estimate import _StageTimes as StageTimes


def pipeline_s(cols: CandidateColumns, st: StageTimes, send: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pipeline's time per iteration by schedule, and the busy time of an average
    rank (for the bubble)."""
    p, m, v = cols.p, cols.m, cols.v
    # one chunk per stage: every stage's forward and backward once (the first micro-batch's way there
    # and back), each stage from its own dense and MoE layers (`stage_kinds`), with the blocking
    # transfers it sends (`estimate._stage_times`: the first stage's forward and the last's backward
    # send one, the others two, so the fill and drain cross every boundary twice), + the steps of the
    # other M - 1 micro-batches on the longest path through the schedule's op order:
    stages_sum = st.first + st.last + st.middle_sum
    slowest = np.maximum(np.maximum(st.first, st.last), st.mid)
    flushed = stages_sum + (m - 1) * slowest  # at most the slowest stage's M - 1 more F + B (ZB-H1's base)
    # GPipe: every forward before any backward: M - 1 steps at the slowest forward, then M - 1 at the
    # slowest backward (the first stage's forward and the last's backward: the embedding, the head)
    sched = cols.schedule
    gp = np.flatnonzero((sched == "gpipe") & ~cols.single)  # each schedule's closed form on its own rows
    gpipe = np.zeros(len(p))
    gpipe[gp] = stages_sum[gp] + (m[gp] - 1) * (_slowest(st, gp, st.first_fwd, st.last_fwd, st.middle_fwd)
                                                + _slowest(st, gp, st.first_bwd, st.last_bwd, st.middle_bwd))
    of = np.flatnonzero((sched == "1f1b") & ~cols.single)
    onef1b = np.zeros(len(p))
    onef1b[of] = stages_sum[of] + _one_f_one_b_steps_s(st, of, p[of], m[of])
    # interleaved: M x a rank's work per micro-batch (its v chunks, the embedding or the head on the
    # first / last) + the fill and drain through one chunk of each other rank (the first rank's first,
    # the last rank's last), the latest over the first, the last and a middle rank; the first
    # micro-batch's forward and the last one's backward cross every one of the p v - 1 virtual-stage
    # boundaries: 2 (p v - 1) transfers (y3: against the engine's op order, uniform and uneven ends)
    rank_first = (v - 1) * st.chunk_first + st.first
    rank_last = (v - 1) * st.chunk_last + st.last
    through_middle = np.where(p >= 3, m * v * st.mid + st.first + st.last + (p - 3) * st.mid, 0.0)
    interleaved = (np.maximum(np.maximum(m * rank_first + st.last, m * rank_last + st.first) + (p - 2) * st.mid,
                              through_middle) + 2 * (p * v - 1) * send)
    # ZB-H1's bubble is (p - 1)(F + B - W) where 1F1B's is (p - 1)(F + B + W) (Qi et al. 2023,
    # Zero Bubble Pipeline Parallelism, section 2): a middle stage's weight gradients leave the fill
    # and the drain, those of the drain into gaps of a forward (as the engine runs the schedule's op
    # order, y3: min(M - 1, p - 1) of them, each at most F)
    zb = (flushed - (p - 1) * st.weight_grad_mid
          - np.minimum(m - 1, p - 1) * np.minimum(st.weight_grad_mid, st.forward_mid))
    pipe = np.where(sched == "interleaved_1f1b", interleaved,
                    np.where(sched == "zb_h1", zb, np.where(sched == "gpipe", gpipe, onef1b)))
    pipe = np.where(cols.single, m * st.whole, pipe)
    busy = m * np.where(cols.single, st.whole,
                        (st.first + st.last + st.middle_sum) / np.maximum(p, 1))
    return pipe, busy


def _slowest(st: StageTimes, rows: np.ndarray, first: np.ndarray, last: np.ndarray, middle: np.ndarray) -> np.ndarray:
    """The largest of one op over the stages of candidates `rows` (middle entries held by no
    stage apart)."""
    held = np.where(st.middle_count[rows] > 0, middle[rows], -np.inf).max(axis=1)
    return np.maximum(np.maximum(first[rows], last[rows]), held)


def _one_f_one_b_steps_s(st: StageTimes, rows: np.ndarray, p: np.ndarray, m: np.ndarray) -> np.ndarray:
    """What 1F1B's other M - 1 micro-batches add to the first one's way there and back: the
    longest of the paths that turn at one stage k (0-based) of the p (candidates `rows`). Stage k runs
    min(p - k, M) forwards before its first backward (Megatron's p - k - 1 warm-up and one
    more), which run while the first micro-batch goes to the last stage and back, then its
    M backwards and the M - p + k forwards left between them: (M - 1) B_k + max(M - p + k, 0)
    F_k (the last stage's (M - 1)(F + B)); or its first min(p - k, M) forwards in a row, then
    the last of them on to the last stage and back: (min(p - k, M) - 1) F_k. Each is a path
    of the engine's op order, so the iteration is at least their longest; with uniform stages
    it is (M + p - 1)(F + B) exactly. Against the engine on 300 random stages shaped as the
    planner's (an uneven split, the embedding on the first and the head on the last stage,
    blocking transfers) the pipeline is within -4.1% and 0% (mean -0.3%); `flushed` (M - 1
    times the slowest stage's F + B) was within 0% and +18.5%, up to +9% on Llama 3 70B's PP 32
    plans with fewer micro-batches than stages. A middle entry takes its highest stage in
    the first path (longer with k) and its lowest in the second."""

    def turn(fwd: np.ndarray, bwd: np.ndarray, k_late: np.ndarray | float, k_early: np.ndarray | float) -> np.ndarray:
        return np.maximum((m - 1) * bwd + np.maximum(m - p + k_late, 0.0) * fwd,
                          (np.minimum(p - k_early, m) - 1) * fwd)

    ends = np.maximum(turn(st.first_fwd[rows], st.first_bwd[rows], 0.0, 0.0),
                      turn(st.last_fwd[rows], st.last_bwd[rows], p - 1, p - 1))
    pm, mm, fwd, bwd = p[:, None], m[:, None], st.middle_fwd[rows], st.middle_bwd[rows]
    middle = np.maximum((mm - 1) * bwd + np.maximum(mm - pm + st.middle_high[rows], 0.0) * fwd,
                        (np.minimum(pm - st.middle_low[rows], mm) - 1) * fwd)
    return np.maximum(ends, np.where(st.middle_count[rows] > 0, middle, -np.inf).max(axis=1))
