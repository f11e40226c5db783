"""A run's memory as `paraplan predict` reports it: the pipeline rank whose peak is the
largest and what that rank holds at that moment, in parts that add up to the peak.

The parts (`paraplan.sim.iteration_memory.MemoryAtPeak`, built in `rank_state.rank_memory`):
- model state: weights, gradients and optimizer state as the rank keeps them for the
  whole iteration (sharded as the settings say), with FP8 weight copies;
- working set: what the op running at the peak moment adds for a while
  (`paraplan.sim.rank_peak.peak_at_ops`): ZeRO-3's gathered weights, in a backward the
  layer being recomputed and unsharded gradients until their reduce-scatter (ZeRO-2/3
  with one micro-batch or reduced every micro-batch), in the last stage's last chunk's
  forward the loss's transient, a layer's context-parallel attention buffers
  (`paraplan.predict.cp_memory`);
- gradient accumulators: unsharded gradients accumulated over the micro-batches
  (ZeRO-2/3 reduced after the last), else FSDP2's sharded gradients (freed by
  `zero_grad` before the forward), each model chunk's allocated by its first
  backward, those allocated by the peak moment;
- activations held at that moment (the rank's activation peak, or fewer where the
  accumulators' growth or a larger working set elsewhere moves the peak).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the run table's columns below, without importing the engine
    from paraplan.sim.execution import IterationResult

PEAK_MEMORY_COLUMNS: tuple[str, ...] = (
    "peak_memory_rank", "predicted_peak_model_state_bytes", "predicted_peak_working_bytes",
    "predicted_peak_gradient_accumulator_bytes", "predicted_peak_activation_bytes",
)
"""Run-table columns beside `predicted_peak_memory_bytes`: the rank, then the parts."""

RETIRED_COLUMNS: tuple[str, ...] = ("predicted_weight_state_bytes", "predicted_activation_bytes")
"""Columns earlier versions wrote (the first pipeline rank's peak less its activation
peak, and that activation peak; they did not add up to the largest peak): read in an
input table and not written back."""


@dataclass(frozen=True)
class PeakMemory:
    """The pipeline rank with the largest peak (the first such) and its parts then."""

    rank: int
    total_bytes: float
    model_state_bytes: float
    working_bytes: float
    gradient_accumulator_bytes: float
    activation_bytes: float

    @staticmethod
    def of(result: IterationResult) -> PeakMemory:
        rank = int(np.argmax(result.peak_memory_bytes))
        at = result.memory_at_peak
        return PeakMemory(rank, float(result.peak_memory_bytes[rank]), float(at.state_bytes[rank]),
                          float(at.working_bytes[rank]), float(at.gradient_accumulator_bytes[rank]),
                          float(at.activation_bytes[rank]))

    def whole_bytes(self) -> tuple[int, int, int, int, int]:
        """The total and the four parts in whole bytes that add up to it exactly: each
        partial sum (state, + working, + accumulators) rounded to the byte, the parts
        their differences, so each part is within a byte of its value and none is
        negative."""
        total = round(self.total_bytes)
        partial = np.cumsum([self.model_state_bytes, self.working_bytes, self.gradient_accumulator_bytes])
        edges = [0, *(min(round(float(x)), total) for x in partial), total]
        state, working, grads, acts = (b - a for a, b in pairwise(edges))
        return total, state, working, grads, acts

    def cells(self) -> dict[str, str]:
        """`PEAK_MEMORY_COLUMNS` as written (`whole_bytes`)."""
        _, *parts = self.whole_bytes()
        return dict(zip(PEAK_MEMORY_COLUMNS, (str(self.rank), *(str(b) for b in parts)), strict=True))
