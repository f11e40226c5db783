"""The layout the validate stage runs: the simulator's schedule orders for the real
pipelines, the balanced cut, and which layers tensor parallelism splits."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")  # the validate stage runs real torch pipelines (the measure extra)

from torch import nn

from paraplan.core import StrategyError
from paraplan.validate.pipeline import balanced_boundary, stage_order
from paraplan.validate.tensor_parallel import (
    tensor_parallel_layers,
    tp_allreduce_counts,
    tp_split_layers,
)
from paraplan.validate.workload import WorkloadSpec

BUILDER = "paraplan.validate.workload:profile_model_workload"
MLP = WorkloadSpec(BUILDER, {"model": "mlp", "settings": {
    "num_layers": 5, "input_dim": 6, "hidden_dim": 16, "output_dim": 4}, "seed": 0})
GPT = WorkloadSpec(BUILDER, {"model": "gpt", "settings": {
    "num_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "seq_length": 5, "vocab_size": 11}, "seed": 3})

def test_real_pipeline_runs_the_simulators_orders():
    """A 2-rank run executes the schedule objects the engine executes."""
    assert stage_order("1f1b", 0, 2, 4).labels() == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    assert stage_order("1f1b", 1, 2, 4).labels() == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    assert stage_order("gpipe", 0, 2, 2).labels() == ["F0", "F1", "B0", "B1"]
    assert stage_order("distir_greedy", 0, 2, 2).labels() == ["F0", "F1", "B0", "B1"]
    with pytest.raises(StrategyError, match="splits the backward"):
        stage_order("zb_h1", 0, 2, 4)


def test_balanced_boundary_minimises_the_slower_stage():
    assert balanced_boundary([1, 1, 1, 1]) == 2
    assert balanced_boundary([5, 1, 1, 1]) == 1
    assert balanced_boundary([1, 1, 1, 4]) == 3
    with pytest.raises(StrategyError, match=r"^2 pipeline stages need at least 2 layers, the model has 1$"):
        balanced_boundary([1.0])


def test_allreduce_count_and_unsplittable_models():
    assert tp_allreduce_counts(MLP.build().layers) == [0, 1, 0, 1, 0]  # 2 pairs of 5 layers
    # embedding, 2 blocks x (attention, MLP), head
    assert tp_allreduce_counts(GPT.build().layers) == [0, 2, 2, 0]
    assert tp_split_layers(MLP.build().layers) == [True, True, True, True, False]
    assert tp_split_layers(GPT.build().layers) == [False, True, True, False]
    with pytest.raises(StrategyError, match=r"^tensor parallelism found no layer pair to split in this model$"):
        tensor_parallel_layers([nn.Conv1d(2, 2, 1)], 0, 2)
