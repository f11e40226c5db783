"""Bytes on one device of a pipeline rank: the memory part of the engine's builders,
in the manner of Megatron-LM's `theoretical_memory_usage.py` (weights, gradients and
optimizer state from the parameters a rank holds and how each kind is sharded; the
activations of each model chunk per micro-batch, whose peak the schedule decides).

A layer profile counts its state in parameter bytes (weights x the weight versions a
schedule keeps, gradients as large, optimizer state a factor of them); a transformer
run in parameters at its precision's bytes per parameter (`Precision`), dense and
expert parameters apart, each kind sharded over the ranks that split it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from paraplan.sim.execution import RankMemory


@dataclass(frozen=True)
class ParamState:
    """Parameters on one rank and what each holds: bytes per parameter of each kind of
    state, and over how many ranks that kind is sharded (1: every rank holds it all)."""

    params: float  # parameters, or parameter bytes with bytes "per parameter byte"
    weight_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    weight_shards: float = 1
    grad_shards: float = 1
    optimizer_shards: float = 1

    @property
    def weights_bytes(self) -> float:
        return self.params * self.weight_bytes / self.weight_shards

    @property
    def gradients_bytes(self) -> float:
        return self.params * self.grad_bytes / self.grad_shards

    @property
    def optimizer_state_bytes(self) -> float:
        return self.params * self.optimizer_bytes / self.optimizer_shards


def rank_memory(states: Sequence[ParamState], activation_bytes_per_chunk: np.ndarray, working_bytes: float = 0.0,
                extra_weight_bytes: float = 0.0) -> RankMemory:
    """A rank's memory: the state of each group of its parameters (dense, experts)
    summed in order, weight bytes held beside them (e.g. FP8 copies), its chunks'
    activations per micro-batch and its transient working set."""
    weights, grads, optimizer = states[0].weights_bytes, states[0].gradients_bytes, states[0].optimizer_state_bytes
    for state in states[1:]:
        weights += state.weights_bytes
        grads += state.gradients_bytes
        optimizer += state.optimizer_state_bytes
    return RankMemory(weights + extra_weight_bytes, grads, optimizer, activation_bytes_per_chunk, working_bytes)


def chunks_by_rank(per_virtual_stage: np.ndarray, pipeline_stages: int) -> np.ndarray:
    """A per-virtual-stage array as [rank, chunk] (virtual stage c x p + r is chunk c of
    pipeline rank r)."""
    values = np.asarray(per_virtual_stage, dtype=float)
    return values.reshape(-1, pipeline_stages).T
