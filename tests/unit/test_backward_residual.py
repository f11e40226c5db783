"""What a residual junction's backward costs (`paraplan.predict.ops._residual_backward`,
`_row_bias_backward`): the dropout's backward, the sum of the residual stream's two
gradients and the row-parallel bias's gradient (a reduction over the tokens), as
Megatron-LM runs them
(docs/execution-model.md, "What the backward costs besides its GEMMs")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.ops import MEMORY, layer_work

GPT = TransformerModel("gpt", num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                       vocab_size=51200)
SETTINGS = RunSettings(tensor_model_parallel_size=4, micro_batch_size=2, global_batch_size=2, dtype="bf16",
                       use_flash_attn=True)
E = 2  # bf16 bytes


def _first_kernels(model: TransformerModel, settings: RunSettings, count: int) -> list[float]:
    kernels = layer_work(model, settings).backward.kernels
    assert all(kernels.kind[:count] == MEMORY)
    return [float(b) for b in kernels.bytes[:count]]


def test_junction_prices_dropout_gradient_sum_and_bias_gradient():
    """b s h elements: dropout backward (2e + 1 mask byte), the two gradients' sum (read
    two, write one: 3e), the bias gradient's read (e)."""
    n = 2 * 2048 * 1024
    assert _first_kernels(GPT, SETTINGS, 3) == [(2 * E + 1) * n, 3 * E * n, E * n]


def test_sequence_parallel_junction_runs_on_the_rank_s_tokens():
    n = 2 * 2048 * 1024 / 4
    assert _first_kernels(GPT, replace(SETTINGS, sequence_parallel=True), 3) == pytest.approx(
        [(2 * E + 1) * n, 3 * E * n, E * n])


def test_without_biases_no_bias_gradient():
    """Llama-style layers (`add_bias_linear` false) reduce no bias: the junction is the
    dropout's backward (no dropout: 2e) and the gradient sum."""
    model = replace(GPT, add_bias_linear=False, hidden_dropout=0.0)
    n = 2 * 2048 * 1024
    kernels = layer_work(model, SETTINGS).backward.kernels
    assert [float(b) for b in kernels.bytes[:2]] == [2 * E * n, 3 * E * n]
    assert kernels.kind[2] != MEMORY  # the fc2 input gradient follows
