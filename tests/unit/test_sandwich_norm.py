"""Gemma's sandwich norms (`sandwich_norm`): each sublayer's output normalised before its
residual add, two more RMSNorms per layer: their weights, kernels and kept inputs."""

from dataclasses import replace

import pytest

from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.ops import MEMORY, layer_activation_bytes, layer_work

H, S = 2048, 4096
BASE = TransformerModel("g", num_layers=4, hidden_size=H, num_attention_heads=16, seq_length=S, vocab_size=32000,
                        gated_linear_unit=True, add_bias_linear=False, normalization="RMSNorm",
                        position_embedding_type="rope", hidden_dropout=0.0, attention_dropout=0.0)
SANDWICH = replace(BASE, sandwich_norm=True)


def test_two_more_norms_per_layer_in_the_weights():
    assert SANDWICH.dense_layer_params - BASE.dense_layer_params == 2 * H
    assert SANDWICH.num_parameters - BASE.num_parameters == 4 * 2 * H


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, True)])
def test_each_sublayer_output_is_normalised_forward_and_backward(t, sp):
    s = RunSettings(tensor_model_parallel_size=t, sequence_parallel=sp, micro_batch_size=1, global_batch_size=1,
                    use_flash_attn=True)
    tokens = S // t if sp else S  # a norm runs on the rank's sequence shard under SP
    plain, sandwich = layer_work(BASE, s), layer_work(SANDWICH, s)
    for kind, per_norm in (("forward", 2), ("backward", 3)):  # bytes per element: read/write e, or 3 e back
        before, after = (getattr(w, kind).kernels for w in (plain, sandwich))
        assert len(after) - len(before) == 2
        assert after.bytes[after.kind == MEMORY].sum() - before.bytes[before.kind == MEMORY].sum() == \
            pytest.approx(2 * per_norm * 2 * tokens * H)
    assert layer_activation_bytes(SANDWICH, s) - layer_activation_bytes(BASE, s) == pytest.approx(2 * 2 * tokens * H)
