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
    # 1F1B and GPipe: every stage once (the fill and drain) + M - 1 times the slowest; each stage
    # from its own dense and MoE layers (`stage_kinds`)
    stages_sum = st.first + st.last + st.middle_sum
    slowest = np.maximum(np.maximum(st.first, st.last), st.mid)
    flushed = stages_sum + (m - 1) * slowest + 2 * (p - 1) * send
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
    sched = cols.schedule
    pipe = np.where(sched == "interleaved_1f1b", interleaved, np.where(sched == "zb_h1", zb, flushed))
    pipe = np.where(cols.single, m * st.whole, pipe)
    busy = m * np.where(cols.single, st.whole,
                        (st.first + st.last + st.middle_sum) / np.maximum(p, 1))
    return pipe, busy
