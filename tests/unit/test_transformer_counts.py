"""Closed forms of the transformer description: parameters, FLOPs, activation memory."""

from dataclasses import replace

import pytest

from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.edge_ops import head_work
from paraplan.predict.models import PRESETS
from paraplan.predict.ops import GEMM, layer_activation_bytes, layer_work


def gpt(layers=24, h=2048, a=16, s=2048, v=51200) -> TransformerModel:
    return TransformerModel("gpt", num_layers=layers, hidden_size=h, num_attention_heads=a, seq_length=s,
                            vocab_size=v)


def test_gpt_layer_has_12h2_plus_13h_parameters():
    m = gpt(h=1024)
    assert m.layer_params == 12 * 1024**2 + 13 * 1024


@pytest.mark.parametrize(("name", "billions"), [
    ("gpt3-175b", 174.6), ("gpt3-6.7b", 6.66), ("gpt3-125m", 0.125),
    ("llama3-8b", 8.03), ("llama3-70b", 70.55), ("llama3-405b", 405.85),
])
def test_preset_parameter_counts_match_the_published_sizes(name, billions):
    assert PRESETS[name].num_parameters / 1e9 == pytest.approx(billions, rel=0.01)


def test_megatron_flops_formula_with_full_recomputation():
    """96 B s l h^2 (1 + s / 6h + V / 16 l h) (Narayanan et al. 2021, eq. 3)."""
    m = gpt(layers=96, h=12288, a=96, s=2048, v=51200)
    batch = 1536
    b, s, n, h, v = batch, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size
    expected = 96 * b * s * n * h**2 * (1 + s / (6 * h) + v / (16 * n * h))
    assert m.model_flops_per_iteration(batch, recomputed_share=1.0) == pytest.approx(expected, rel=1e-12)
    assert m.model_flops_per_iteration(batch, recomputed_share=0.0) == pytest.approx(
        expected - 24 * b * s * n * h**2 * (1 + s / (6 * h)), rel=1e-12)


def test_kernels_of_a_layer_sum_to_the_closed_form_on_every_rank():
    m = gpt(h=2048, a=16, s=1024)
    for t in (1, 2, 4, 8):
        settings = RunSettings(tensor_model_parallel_size=t, micro_batch_size=2, global_batch_size=2,
                               use_flash_attn=False)
        work = layer_work(m, settings)
        assert work.forward.kernels.total_flops * t == pytest.approx(m.layer_forward_flops(2), rel=1e-12)
        assert work.backward.kernels.total_flops == pytest.approx(2 * work.forward.kernels.total_flops, rel=1e-12)
        assert work.recompute.kernels.total_flops == 0.0


def test_recomputation_repeats_the_forward_or_the_attention_core():
    m = gpt(h=1024, s=1024)
    base = RunSettings(micro_batch_size=1, global_batch_size=1, use_flash_attn=False)
    full = layer_work(m, replace(base, recompute_granularity="full"))
    assert full.recompute.kernels.total_flops == full.forward.kernels.total_flops
    selective = layer_work(m, replace(base, recompute_granularity="selective"))
    # Q K^T and probabilities @ V: 4 b s^2 h
    assert selective.recompute.kernels.total_flops == pytest.approx(4 * 1024**2 * 1024)
    assert not selective.recompute.collectives


def test_head_is_vocabulary_parallel_with_padded_vocabulary():
    m = gpt(h=1024, s=1024, v=50257)
    work = head_work(m, RunSettings(tensor_model_parallel_size=4, micro_batch_size=1, global_batch_size=1))
    gemm_flops = work.forward.kernels.flops[work.forward.kernels.kind == GEMM].sum()
    assert m.padded_vocab_size(4) == 50688  # multiple of 128 x 4
    assert gemm_flops == pytest.approx(2 * 1024 * 1024 * 50688 / 4)


# Korthikanti et al. 2022, Table 2: activation bytes per layer (16-bit, dropout masks 1 byte)
@pytest.mark.parametrize("t", [1, 2, 8])
def test_activation_memory_matches_korthikanti_table_2(t):
    m = gpt(h=4096, a=32, s=2048)
    s, b, h, a = m.seq_length, 1, m.hidden_size, m.num_attention_heads
    sbh = s * b * h

    def act(**kw):
        return layer_activation_bytes(m, RunSettings(tensor_model_parallel_size=t, micro_batch_size=b,
                                                     global_batch_size=b, use_flash_attn=False, **kw))

    no_sp = sbh * (10 + 24 / t + 5 * a * s / (h * t))
    assert act() == pytest.approx(no_sp)
    if t > 1:
        assert act(sequence_parallel=True) == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)))
        assert act(sequence_parallel=True, recompute_granularity="selective") == pytest.approx(sbh * 34 / t)
        assert act(sequence_parallel=True, recompute_granularity="full") == pytest.approx(2 * sbh / t)
    assert act(recompute_granularity="selective") == pytest.approx(sbh * (10 + 24 / t))
    assert act(recompute_granularity="full") == pytest.approx(2 * sbh)


def test_no_tensor_parallelism_gives_sbh_34_plus_5as_over_h():
    m = gpt(h=2048, a=16, s=1024)
    got = layer_activation_bytes(m, RunSettings(micro_batch_size=4, global_batch_size=4, use_flash_attn=False))
    assert got == pytest.approx(1024 * 4 * 2048 * (34 + 5 * 16 * 1024 / 2048))


def test_flash_attention_keeps_no_score_matrix():
    m = gpt(h=2048, a=16, s=4096)
    flash = layer_activation_bytes(m, RunSettings(micro_batch_size=1, global_batch_size=1, use_flash_attn=True))
    sbh = 4096 * 2048
    assert flash == pytest.approx(34 * sbh + 4 * 16 * 4096)  # plus fp32 softmax statistics per head and token


def test_gqa_and_swiglu_shapes():
    m = PRESETS["llama3-8b"]
    assert m.kv_channels == 128
    assert m.qkv_size == 4096 + 2 * 8 * 128
    assert m.mlp_in_size == 2 * 14336
    assert m.layer_params == 4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
