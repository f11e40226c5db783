"""Current models from their released Hugging Face configurations: parameter counts
against the model cards, what the reader says about keys it does not model, and that
nothing paraplan cannot price is priced as a dense model."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.core.errors import InputFileError, StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.predict.hf_config import HARMLESS, read_hf_config
from paraplan.predict.models import PRESETS, load_model

HF = Path(__file__).resolve().parents[1] / "data" / "hf"

# (total, active) in billions as the model cards print them; the last flag: whether
# the card's active count includes the input embedding (OpenAI's does not).
CARDS = {
    "llama-3.1-8b": ("8.03", "8.03", True),
    "qwen2.5-32b": ("32.5", "32.5", True),
    "qwen3-32b": ("32.8", "32.8", True),
    "mixtral-8x7b": ("46.7", "12.9", True),
    "qwen3-30b-a3b": ("30.5", "3.3", True),
    "qwen3-235b-a22b": ("235", "22", True),
    "deepseek-v3": ("671", "37", True),
    "gpt-oss-20b": ("20.91", "3.61", False),
    "gpt-oss-120b": ("116.83", "5.13", False),
    "gemma-3-27b": ("27", "27", True),
    "gemma-2-9b-it": ("9.24", "9.24", True),
    "phi-3.5-moe": ("41.9", "6.6", True),
    "dbrx": ("132", "36", True),
}


def _matches_card(count: float, printed: str) -> bool:
    """Within 1% of the printed figure, beyond its rounding (half a unit of its last
    digit: "3.3" stands for 3.25-3.35, "37" for 36.5-37.5)."""
    value = float(printed)
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(count / 1e9 - value) <= 0.01 * value + 0.5 * 10.0**-decimals


def _read(name: str):
    return read_hf_config(json.loads((HF / f"{name}.json").read_text()), name, f"{name}.json")


@pytest.mark.parametrize("name", sorted(CARDS))
def test_parameter_counts_match_the_model_cards(name):
    total, active, with_input_embedding = CARDS[name]
    model = _read(name).model
    assert _matches_card(model.num_parameters, total), model.num_parameters
    counted = model.active_parameters - (0 if with_input_embedding else model.vocab_size * model.hidden_size)
    assert _matches_card(counted, active), counted


def test_exact_counts_are_pinned():
    """Closed forms of the configurations (any change to a count is deliberate)."""
    h, f, v = 4096, 14336, 32000
    attention, expert, norms = h * (4096 + 2 * 1024) + 4096 * h, 3 * h * f, 2 * h
    mixtral = _read("mixtral-8x7b").model
    assert mixtral.num_parameters == 32 * (attention + 8 * expert + h * 8 + norms) + 2 * v * h + h
    assert mixtral.active_parameters == 32 * (attention + 2 * expert + h * 8 + norms) + 2 * v * h + h
    h = 7168
    mla = h * 1536 + 1536 * 128 * 192 + h * 576 + 512 * 128 * 256 + 128 * 128 * h + 1536 + 512
    expert = 3 * h * 2048
    dense, moe = mla + 3 * h * 18432 + 2 * h, mla + 257 * expert + h * 256 + 2 * h
    ds = _read("deepseek-v3").model
    assert ds.num_parameters == 3 * dense + 58 * moe + 2 * 129280 * h + h
    assert ds.active_parameters == 3 * dense + 58 * (moe - 248 * expert) + 2 * 129280 * h + h
    assert ds.mtp_parameters == moe + 2 * h * h + 3 * h  # one MoE layer, the [h; h] -> h projection, 3 norms


def test_presets_equal_the_released_configurations():
    for name in ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-20b", "gpt-oss-120b"):
        hf, preset = _read(name).model, PRESETS[name]
        assert (hf.num_parameters, hf.active_parameters, hf.mtp_parameters) == (
            preset.num_parameters, preset.active_parameters, preset.mtp_parameters), name
    assert PRESETS["llama4-scout"].active_parameters / 1e9 == pytest.approx(17.17, abs=0.01)
    assert PRESETS["llama4-maverick"].num_parameters / 1e9 == pytest.approx(400.7, abs=0.1)


def test_head_width_of_its_own_sets_the_attention_shapes():
    """Qwen3-32B: 64 heads of 128 on a width of 5,120 (not 5120 / 64 = 80)."""
    m = replace(_read("qwen3-32b").model, seq_length=4096)
    assert m.kv_channels == 128 and m.attention_size == 8192
    assert m.qkv_size == 64 * 128 + 2 * 8 * 128
    tokens = 4096
    attention = 2 * tokens * (5120 * m.qkv_size + 8192 * 5120) + 4 * tokens * tokens * 8192
    mlp = 2 * tokens * 3 * 5120 * 25600
    assert m.layer_forward_flops(1) == pytest.approx(attention + mlp, rel=1e-12)


def test_moe_layer_flops_count_the_routed_experts_only():
    """Mixtral: 2 of 8 experts of 3 h f weights each, plus the router (h x 8)."""
    m = PRESETS["mixtral-8x7b"]
    b, s, h, f = 2, m.seq_length, 4096, 14336
    attention = 2 * b * s * (h * (4096 + 2 * 1024) + 4096 * h) + 4 * b * s * s * 4096
    assert m.layer_forward_flops(b) == pytest.approx(attention + 2 * b * s * (2 * 3 * h * f + h * 8), rel=1e-12)
    assert m.mfu_flops_per_iteration(8) == 6 * m.active_parameters * 8 * s


def test_sliding_window_layers_score_against_the_window():
    m = PRESETS["gpt-oss-20b"]
    assert m.windowed_layers[:4] == (True, False, True, False)
    full, windowed = m.layer_forward_flops(1, 1), m.layer_forward_flops(1, 0)
    s, a, d = m.seq_length, 64, 64
    assert full - windowed == pytest.approx(4 * s * (s - 128) * a * d, rel=1e-12)


def test_deepseek_layers_and_mla():
    m = _read("deepseek-v3").model
    assert m.moe_layers[:4] == (False, False, False, True) and m.num_moe_layers == 58
    assert m.multi_latent_attention and (m.q_lora_rank, m.kv_lora_rank) == (1536, 512)
    # MLA: q 7168x1536 + 1536x128x192, kv 7168x576 + 512x128x256, out 128x128x7168, two latent norms
    assert m.attention_params == 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 \
        + 128 * 128 * 7168 + 1536 + 512


def test_group_limited_routing_is_read_and_checked():
    """DeepSeek-V3 routes in 4 of 8 groups (n_group, topk_group) as the preset; DeepSeek-V2's
    `greedy` router has none; a group limit that does not divide the experts is an error."""
    m = _read("deepseek-v3").model
    assert (m.moe_router_num_groups, m.moe_router_group_topk) == (8, 4) == (
        PRESETS["deepseek-v3"].moe_router_num_groups, PRESETS["deepseek-v3"].moe_router_group_topk)
    config = json.loads((HF / "deepseek-v3.json").read_text())
    greedy = read_hf_config({**config, "topk_method": "greedy"}, "v2-style")
    assert greedy.model.router_groups == (1, 1) and "n_group" not in greedy.ignored
    with pytest.raises(ValueError) as err:
        replace(PRESETS["deepseek-v3"], moe_router_group_topk=3)
    assert str(err.value) == ("model 'deepseek-v3': group-limited routing: moe_router_topk 8 is not divisible by "
                              "moe_router_group_topk 3")


def test_gemma_2_takes_its_families_defaults_and_says_so():
    """Gemma 2's released files state neither a tied output layer nor which layers slide:
    transformers' Gemma2Config ties them (tie_word_embeddings=True) and its decoder layers
    alternate, even ones windowed (4,096 tokens) and odd ones global. Untied, the count would
    be 10.16B against the card's 9.24B. The window stated twice must agree."""
    read = _read("gemma-2-9b-it")
    m = read.model
    assert not m.untie_embeddings_and_output_weights and m.attn_logit_softcapping == 50.0
    assert m.windowed_layers[:4] == (True, False, True, False) and m.window_size == 4096
    assert read.ignored == ()
    assert read.notes == ("gemma-2-9b-it.json: sliding_window_pattern, tie_word_embeddings not stated: "
                          "transformers' gemma2 defaults used",
                          "gemma-2-9b-it.json: final_logit_softcapping: the logits' soft-cap (a tanh over every "
                          "logit, forward and backward, and the capped logits kept for the loss) is not priced")
    config = json.loads((HF / "gemma-2-9b-it.json").read_text())
    untied = read_hf_config({**config, "tie_word_embeddings": False}, "untied").model
    assert untied.num_parameters - m.num_parameters == 256000 * 3584
    with pytest.raises(InputFileError) as err:
        read_hf_config({**config, "sliding_window_size": 2048}, "g", "g.json")
    assert str(err.value) == ("g.json: keys 'sliding_window' (4096) and 'sliding_window_size' (2048) differ: "
                              "expected one window length")


@pytest.mark.parametrize(("model_type", "act", "tied"), [("cohere", "silu", True), ("nemotron", "relu2", False),
                                                         ("phi", "gelu_new", False), ("gpt_neox", "gelu", False)])
def test_a_files_unstated_output_layer_is_its_transformers_classs(model_type, act, tied):
    """Where a family's transformers class ties (or unties) the output layer against
    paraplan's guess for unknown families (untied with a gated MLP), the class's default is
    used and named."""
    config = {"model_type": model_type, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 1000, "hidden_act": act, "max_position_embeddings": 2048}
    read = read_hf_config(config, model_type, "c.json")
    assert read.model.untie_embeddings_and_output_weights is not tied
    assert any(f"tie_word_embeddings not stated: transformers' {model_type} defaults used" in n for n in read.notes)


def test_qwens_window_slides_from_max_window_layers_on():
    """Qwen2's sliding window (use_sliding_window true) covers the layers from
    max_window_layers on: 0 windows every layer, the layer count none, anything between is
    no regular pattern and an error; with the window off the key says nothing."""
    config = json.loads((HF / "qwen2.5-32b.json").read_text())
    assert config["use_sliding_window"] is False and not _read("qwen2.5-32b").model.window_size
    on = {**config, "use_sliding_window": True, "sliding_window": 4096}
    assert read_hf_config({**on, "max_window_layers": 0}, "q").model.windowed_layers == (True,) * 64
    assert not any(read_hf_config({**on, "max_window_layers": 64}, "q").model.windowed_layers)
    with pytest.raises(InputFileError) as err:
        read_hf_config({**on, "max_window_layers": 60}, "q", "q.json")
    assert str(err.value) == ("q.json: key 'max_window_layers': only a regular pattern of sliding and full attention "
                              "layers is modelled (every k-th layer full); got full attention on layers "
                              f"{list(range(60))} of 64")


def test_glm_4_5_is_read_as_its_transformers_class_builds_it():
    """GLM-4.5-Air (`glm4_moe`): DeepSeek-V3's MoE layout (one dense layer, 128 experts of
    1,408 and one shared, top 8, one MTP layer) on GQA attention of 96 heads of 128 on a
    width of 4,096, biases on q/k/v alone, DeepSeek-V3's sigmoid router with its expert
    bias. The card's 106B total; its "12B active" leaves out the embedding and output layer."""
    read = _read("glm-4.5-air")
    m = read.model
    assert read.ignored == () and read.notes == ()
    h, v = 4096, 151552
    attention = h * 96 * 128 + 2 * h * 8 * 128 + 96 * 128 * h + (96 + 16) * 128  # q/k/v biases, no o_proj bias
    expert = 3 * h * 1408
    assert m.attention_params == attention
    assert m.moe_layer_params == attention + 128 * expert + expert + 128 * h + 2 * h  # shared expert, router, norms
    assert m.num_parameters == m.moe_layer_params * 45 + attention + 3 * h * 10944 + 2 * h + 2 * v * h + h
    assert _matches_card(m.num_parameters, "106")
    assert round((m.active_parameters - 2 * v * h) / 1e9) == 12
    assert m.mtp_num_layers == 1 and not m.add_bias_linear and m.add_qkv_bias
    assert (m.moe_router_score_function, m.moe_router_enable_expert_bias, m.moe_router_topk_scaling_factor) == (
        "sigmoid", True, 1.0)


def test_ernie_4_5_moe_is_read_as_its_transformers_class_builds_it():
    """ERNIE 4.5 MoE (`ernie4_5_moe`, transformers' Ernie4_5_MoeConfig defaults, its
    ERNIE-4.5-21B-A3B layout): 64 experts of 1,536 with 2 shared, 6 chosen, on every layer
    from index 1 (`moe_layer_start_index`) to the last, the output layer tied, no biases;
    every `moe_layer_interval`-th layer up to `moe_layer_end_index` otherwise."""
    config = {"model_type": "ernie4_5_moe", "hidden_size": 2560, "intermediate_size": 12288,
              "max_position_embeddings": 131072, "num_attention_heads": 20, "num_key_value_heads": 4,
              "num_hidden_layers": 28, "rms_norm_eps": 1e-5, "vocab_size": 103424, "rope_theta": 500000,
              "use_bias": False, "hidden_act": "silu", "head_dim": 128, "moe_num_experts": 64, "moe_k": 6,
              "moe_intermediate_size": 1536, "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
              "moe_layer_interval": 1}
    read = read_hf_config(config, "ernie", "e.json")
    m = read.model
    h, v = 2560, 103424
    attention = h * 20 * 128 + 2 * h * 4 * 128 + 20 * 128 * h
    expert = 3 * h * 1536
    assert m.moe_layers == (False,) + (True,) * 27 and m.moe_router_topk == 6
    assert m.num_parameters == (27 * (attention + 64 * expert + 2 * expert + 64 * h + 2 * h)
                                + attention + 3 * h * 12288 + 2 * h + v * h + h)
    assert round(m.num_parameters / 1e9, 1) == 21.8
    assert read.ignored == () and "priced as Megatron-Core's softmax router" in read.notes[-1]
    alternate = read_hf_config({**config, "moe_layer_interval": 2, "moe_layer_end_index": 20}, "e2").model
    assert [i for i, moe in enumerate(alternate.moe_layers) if moe] == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19]
    assert read_hf_config({**config, "use_bias": True}, "e3").model.add_bias_linear


def test_minimax_m2_is_read_as_its_transformers_class_builds_it():
    """MiniMax-M2 (`minimax_m2`, transformers' MiniMaxM2Config defaults): 256 experts of
    `intermediate_size` 1,536 (Mixtral's key), 8 chosen by a sigmoid with the expert bias,
    48 heads of 128 on a width of 3,072, QK norm, no bias: 228.7B (the card's 230B), 9.8B
    active without the embedding and output layer (the card's 10B)."""
    config = {"model_type": "minimax_m2", "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 1536,
              "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
              "hidden_act": "silu", "max_position_embeddings": 196608, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "num_experts_per_tok": 8, "num_local_experts": 256}
    read = read_hf_config(config, "m2", "m2.json")
    m = read.model
    assert read.ignored == () and read.notes == ()
    assert m.num_layers == m.num_moe_layers == 62 and m.moe_ffn_size == 1536 and m.qk_layernorm
    assert _matches_card(m.num_parameters, "230")
    assert round((m.active_parameters - 2 * 200064 * 3072) / 1e9) == 10
    assert (m.moe_router_score_function, m.moe_router_enable_expert_bias) == ("sigmoid", True)


def test_a_parallel_block_is_named_where_it_is_priced_as_two():
    """GPT-NeoX's parallel residual (attention and MLP on the same input, one residual add;
    GPTNeoXConfig's default) is priced as two blocks in sequence: a note says so."""
    config = {"model_type": "gpt_neox", "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 2,
              "num_attention_heads": 8, "vocab_size": 1000, "hidden_act": "gelu", "max_position_embeddings": 2048,
              "rotary_pct": 0.25, "layer_norm_eps": 1e-5}
    for stated in ({}, {"use_parallel_residual": True}):
        notes = read_hf_config({**config, **stated}, "neox", "n.json").notes
        assert any(n.startswith("n.json: use_parallel_residual: attention and MLP read the same input") for n in notes)
    assert not any("use_parallel_residual" in n for n in
                   read_hf_config({**config, "use_parallel_residual": False}, "neox", "n.json").notes)


def test_olmoe_is_read_as_its_transformers_class_builds_it():
    """OLMoE-1B-7B-0924 (`olmoe`; the architecture keys of its config.json): 64 experts of
    `intermediate_size` 1,024, 8 chosen by a softmax left unnormalised (`norm_topk_prob`
    false), QK norm: 6.92B parameters, 1.28B active (the card's 7B and 1B)."""
    config = {"model_type": "olmoe", "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 1024,
              "num_hidden_layers": 16, "num_experts": 64, "num_experts_per_tok": 8, "num_attention_heads": 16,
              "num_key_value_heads": 16, "vocab_size": 50304, "tie_word_embeddings": False,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "norm_topk_prob": False}
    read = read_hf_config(config, "olmoe", "o.json")
    m = read.model
    assert read.ignored == () and read.notes == ()
    assert (round(m.num_parameters / 1e9, 2), round(m.active_parameters / 1e9, 2)) == (6.92, 1.28)
    assert m.moe_router_pre_softmax and m.qk_layernorm and m.moe_ffn_size == 1024


def test_experts_in_keys_paraplan_does_not_read_are_refused_not_priced_dense():
    """Experts in keys paraplan does not read (`moe_expert_count`, `moe_topk` of a family it
    does not know): read without them the model would be a dense 3.35B, so it is refused,
    naming the keys."""
    config = {"model_type": "some_moe", "hidden_size": 2560, "intermediate_size": 12288,
              "max_position_embeddings": 131072, "num_attention_heads": 20, "num_key_value_heads": 4,
              "num_hidden_layers": 28, "rms_norm_eps": 1e-5, "vocab_size": 103424, "tie_word_embeddings": True,
              "hidden_act": "silu", "head_dim": 128, "rope_theta": 500000, "moe_expert_count": 64, "moe_topk": 6,
              "moe_intermediate_size": 1536}
    with pytest.raises(InputFileError) as err:
        read_hf_config(config, "ernie", "e.json")
    assert str(err.value).startswith("e.json: keys moe_expert_count, moe_intermediate_size, moe_topk: experts stated "
                                     "in keys paraplan does not read for model_type 'some_moe'; read without them "
                                     "it would be priced as a dense model of 3.35B parameters")
    dense = {k: v for k, v in config.items() if not k.startswith("moe_")}
    assert not read_hf_config(dense, "dense").model.is_moe  # the same file without them reads
    off = read_hf_config({**dense, "use_moe": False, "num_moe_experts": 0}, "off")  # experts said to be absent
    assert not off.model.is_moe and off.ignored == ("num_moe_experts", "use_moe")


def test_text_config_is_read_and_the_other_towers_named():
    read = _read("gemma-3-27b")
    assert read.model.num_layers == 62 and read.model.gated_linear_unit and not read.model.swiglu
    assert read.model.window_size == 1024 and read.model.window_attn_skip_freq == 6
    # each note names the file, as the others do
    assert ("gemma-3-27b.json: vision_config ignored: that tower is not modelled (only the language model is)"
            in read.notes)
    assert any("vocab_size" in n and "gemma3_text defaults" in n for n in read.notes)
    # Gemma's sandwich norms: four RMSNorms per layer (its input, post-attention, pre- and
    # post-feed-forward norms), and each query and key head normalised
    m = read.model
    assert m.sandwich_norm and m.layer_norms == 4 and m.qk_layernorm
    h, v = 5376, 262208
    attention = h * (32 * 128 + 2 * 16 * 128) + 32 * 128 * h + 2 * 128
    assert m.num_parameters == 62 * (attention + 3 * h * 21504 + 4 * h) + v * h + h  # tied embedding, final norm
    assert not any("post-feed-forward" in n for n in read.notes)


def test_unknown_keys_are_named_and_refused_architectures_are_errors(capsys):
    config = json.loads((HF / "llama-3.1-8b.json").read_text())
    read = read_hf_config({**config, "altup_num_inputs": 4}, "x", "x.json")
    assert read.ignored == ("altup_num_inputs",)
    with pytest.raises(InputFileError, match="key 'layers_block_type': state-space"):
        read_hf_config({**config, "layers_block_type": ["mamba", "attention"]}, "x", "x.json")
    with pytest.raises(InputFileError, match="model_type 'qwen3_next' has linear-attention layers"):
        read_hf_config({**config, "model_type": "qwen3_next"}, "x", "x.json")
    with pytest.raises(InputFileError, match="key 'hidden_act': expected a string, got 3"):
        read_hf_config({**config, "hidden_act": 3}, "x", "x.json")


def test_a_file_without_a_sequence_length_says_which_it_uses(capsys):
    model = load_model(str(HF / "llama-3.1-8b.json"))
    assert model.seq_length == 131072
    assert "no sequence length given; using max_position_embeddings 131,072" in capsys.readouterr().err
    assert load_model(str(HF / "llama-3.1-8b.json"), seq_length=8192).seq_length == 8192
    assert "no sequence length" not in capsys.readouterr().err


ZOO = {  # what tensor_model_parallel_size 16 meets: the key/value groups (8 for Mixtral and Qwen3)
    # must split over it; DeepSeek-V3's multi-latent attention has none, Gemma 3 has 16
    "mixtral-8x7b": "num_query_groups 8 is not divisible by tensor_model_parallel_size 16",
    "deepseek-v3": None,
    "gemma-3-27b": None,
    "qwen3-32b": "num_query_groups 8 is not divisible by tensor_model_parallel_size 16",
}


def _zoo_model(name: str):
    return PRESETS[name] if name in ("mixtral-8x7b", "deepseek-v3") else _read(name).model


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_architecture_of_the_zoo_is_priced(name):
    """Mixture-of-experts layers (Mixtral), MoE with multi-latent attention and an MTP layer
    (DeepSeek-V3), sliding windows (Gemma 3), a head width of its own (Qwen3): each is
    accepted at t 8 and priced to a finite time whose MFU is a fraction, and t 16 gets
    exactly the outcome its attention heads allow."""
    from paraplan.clusters import load_cluster
    from paraplan.predict.calibration import load_calibration
    from paraplan.predict.device_model import DeviceSpeed
    from paraplan.predict.predictor import predict_settings, summarize

    model = replace(_zoo_model(name), seq_length=4096)
    settings = RunSettings(tensor_model_parallel_size=8, data_parallel_size=8, global_batch_size=64)
    assert settings.check(model) is None
    cluster, calibration = load_cluster("dgx-h100"), load_calibration()
    [(result, priced)] = predict_settings(model, [settings], cluster, calibration.comm_model(cluster),
                                          calibration.efficiency)
    prediction = summarize(model, priced, result, cluster)
    assert math.isfinite(prediction.iteration_s) and prediction.iteration_s > 0
    assert 0 < prediction.mfu < 1, prediction.mfu
    # MFU's convention: 6 x active parameters x tokens over the GPUs' bf16 peak
    peak = DeviceSpeed.of(cluster.device, "bf16").peak_flops
    assert prediction.mfu == pytest.approx(
        6 * model.active_parameters * 64 * 4096 / prediction.iteration_s / 64 / peak, rel=1e-12)
    wide = replace(settings, tensor_model_parallel_size=16)
    if ZOO[name] is None:
        assert wide.check(model) is None
    else:
        with pytest.raises(StrategyError) as err:
            wide.check(model)
        assert str(err.value) == ZOO[name]


def test_a_model_whose_state_cannot_fit_is_infeasible_with_its_numbers():
    from paraplan.plan.transformer.search import check_model_state_fits

    with pytest.raises(StrategyError) as err:
        check_model_state_fits(PRESETS["deepseek-v3"], 64, "bf16", 80e9)
    assert str(err.value) == (
        "model 'deepseek-v3' does not fit on 64 GPUs: 682.6B parameters x 18 bytes of weights, gradients and "
        "optimizer state (bf16) = 12.29 TB, 192 GB per GPU even sharded over all of them; each has 80.0 GB usable "
        "(at least 154 GPUs, before activations)")
    check_model_state_fits(PRESETS["deepseek-v3"], 1024, "bf16", 80e9)


ARCHITECTURE_WORDS = st.sampled_from(["expert", "layer", "attn", "window", "rank", "mamba", "lora", "ssm", "head"])


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(extra=st.dictionaries(
    st.builds(lambda a, b: f"{a}_{b}", ARCHITECTURE_WORDS, st.text("abcdefgh_", min_size=1, max_size=8)),
    st.one_of(st.integers(0, 64), st.booleans(), st.none()), max_size=4))
def test_every_key_is_used_named_or_refused(extra):
    """Fuzz over key sets: a key paraplan does not model never disappears silently."""
    base = json.loads((HF / "llama-3.1-8b.json").read_text())
    config = {**base, **extra}
    try:
        read = read_hf_config(config, "x", "x.json")
    except InputFileError:
        return
    for key in extra:
        if key not in base and key not in HARMLESS and config[key] is not None:
            assert key in read.ignored


FALCON_7B = {  # tiiuae/falcon-7b's released config.json (transformers 4.27.4), token ids and dtype left out
    "alibi": False, "apply_residual_connection_post_layernorm": False, "architectures": ["FalconForCausalLM"],
    "attention_dropout": 0.0, "bias": False, "hidden_dropout": 0.0, "hidden_size": 4544,
    "layer_norm_epsilon": 1e-05, "model_type": "falcon", "multi_query": True, "new_decoder_architecture": False,
    "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": True, "vocab_size": 65024,
}


def test_falcon_reads_as_transformers_builds_it():
    """Falcon (FalconConfig / FalconAttention): multi-query attention unless the new decoder
    (num_kv_heads groups), LayerNorm, a GELU MLP of 4 x hidden, no biases, the output layer
    tied and 2,048 positions as transformers' defaults (the files state neither)."""
    read = _read("falcon-40b")
    m = read.model
    h = 8192
    layer = h * (h + 2 * 8 * 64) + h * h + 2 * h * 4 * h + 2 * 2 * h  # QKV of 8 groups, out, MLP, two LayerNorms
    assert m.num_parameters == 60 * layer + 65024 * h + 2 * h == 41_303_293_952
    assert (m.num_query_groups, m.ffn_hidden_size, m.normalization, m.position_embedding_type, m.seq_length) == (
        8, 4 * h, "LayerNorm", "rope", 2048)
    assert not (m.add_bias_linear or m.add_qkv_bias or m.swiglu or m.untie_embeddings_and_output_weights)
    assert read.ignored == ()
    assert read.notes == (
        "falcon-40b.json: max_position_embeddings, tie_word_embeddings not stated: transformers' falcon defaults "
        "used",
        "falcon-40b.json: parallel_attn: attention and MLP read the same input and add into one residual; priced as "
        "two blocks one after the other (the same weights and matrix products; under tensor parallelism the one "
        "reduction of their summed outputs is priced as two)")
    seven = read_hf_config(FALCON_7B, "falcon-7b", "falcon-7b.json")
    assert seven.model.num_query_groups == 1 and seven.ignored == ()  # multi-query: one key/value head
    assert seven.notes[-1].endswith("priced as two; the one layer norm they share as two)")
    # FalconConfig's multi_query defaults to true; without it and the new decoder, one group per head
    assert read_hf_config({**FALCON_7B, "multi_query": None}, "f", "f.json").model.num_query_groups == 1
    assert read_hf_config({**FALCON_7B, "multi_query": False}, "f", "f.json").model.num_query_groups == 71
    assert read_hf_config({**FALCON_7B, "bias": True}, "f", "f.json").model.add_bias_linear
    with pytest.raises(InputFileError, match=r"^f\.json: key 'alibi': ALiBi attention biases are not a position "):
        read_hf_config({**FALCON_7B, "alibi": True}, "f", "f.json")


GRANITE_MOE = {  # the layout of ibm-granite/granite-3.0-3b-a800m (transformers' GraniteMoeConfig keys)
    "model_type": "granitemoe", "hidden_size": 1536, "intermediate_size": 512, "num_hidden_layers": 32,
    "num_attention_heads": 24, "num_key_value_heads": 8, "num_local_experts": 40, "num_experts_per_tok": 8,
    "vocab_size": 49155, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "embedding_multiplier": 12.0, "logits_scaling": 6.0, "residual_multiplier": 0.22, "attention_multiplier": 0.015625,
}


def test_granite_moe_and_phi_moe_read_their_experts_as_transformers_builds_them():
    """Granite MoE: Mixtral's experts of intermediate_size, RMSNorm, tied (GraniteMoeConfig's default), a softmax
    over the top-k; its scalar multipliers change no count. The shared variant adds one expert of
    shared_intermediate_size. Phi-3.5-MoE: LayerNorm although its epsilon is named rms_norm_eps."""
    read = read_hf_config(GRANITE_MOE, "g", "g.json")
    m, h = read.model, 1536
    attention, expert, router, norms = h * (h + 2 * 512) + h * h, 3 * h * 512, h * 40, 2 * h
    assert m.num_parameters == 32 * (attention + 40 * expert + router + norms) + 49155 * h + h
    assert m.active_parameters == 32 * (attention + 8 * expert + router + norms) + 49155 * h + h
    assert (m.num_experts, m.moe_router_topk, m.moe_ffn_hidden_size, m.normalization) == (40, 8, 512, "RMSNorm")
    assert not m.untie_embeddings_and_output_weights and not m.moe_router_pre_softmax
    assert read.ignored == () and read.notes == ("g.json: tie_word_embeddings not stated: transformers' granitemoe "
                                                 "defaults used",)
    shared = read_hf_config({**GRANITE_MOE, "model_type": "granitemoeshared", "shared_intermediate_size": 1024},
                            "s", "s.json").model
    assert shared.moe_shared_expert_intermediate_size == 1024
    assert shared.num_parameters - m.num_parameters == 32 * 3 * h * 1024
    phi = _read("phi-3.5-moe")
    assert (phi.model.normalization, phi.model.add_qkv_bias, phi.model.add_bias_linear) == ("LayerNorm", True, False)
    assert phi.ignored == ()
    assert phi.notes == (
        "phi-3.5-moe.json: Phi-3.5-MoE's SparseMixer router (each of its two experts chosen by a masked softmax) is "
        "priced as Megatron-Core's softmax router over the two chosen",
        "phi-3.5-moe.json: attention_bias, lm_head_bias: the attention output projection's bias (hidden_size weights "
        "a layer; the query, key and value biases are counted) and the output layer's bias (vocab_size weights) not "
        "counted")


def test_dbrx_reads_its_nested_sections_as_transformers_builds_them():
    """DBRX (DbrxConfig): attn_config's kv_n_heads, ffn_config's experts (16 of ffn_hidden_size, 4 chosen) and
    activation (silu when unstated), LayerNorm, no biases, untied; a router norm other than 1 is refused."""
    read = _read("dbrx")
    m, h = read.model, 6144
    attention, expert, router, norms = h * (h + 2 * 8 * 128) + h * h, 3 * h * 10752, h * 16, 2 * 2 * h
    assert m.num_parameters == 40 * (attention + 16 * expert + router + norms) + 2 * 100352 * h + 2 * h
    assert m.active_parameters == 40 * (attention + 4 * expert + router + norms) + 2 * 100352 * h + 2 * h
    assert (m.num_query_groups, m.num_experts, m.moe_router_topk, m.swiglu, m.normalization, m.seq_length) == (
        8, 16, 4, True, "LayerNorm", 32768)
    assert not (m.add_bias_linear or m.add_qkv_bias or m.moe_router_pre_softmax)
    assert read.ignored == () and read.notes == ("dbrx.json: hidden_act not stated: transformers' dbrx defaults used",)
    config = json.loads((HF / "dbrx.json").read_text())
    config["ffn_config"]["moe_normalize_expert_weights"] = 2
    with pytest.raises(InputFileError, match=r"^d\.json: key 'ffn_config\.moe_normalize_expert_weights': 2; only 1 "):
        read_hf_config(config, "d", "d.json")


def test_what_the_reader_says_of_a_file_is_in_the_plans_tracked_description(tmp_path, monkeypatch, capsys):
    import paraplan.cli.common
    from paraplan.cli.main import main

    folder = tmp_path / "falcon-40b"
    folder.mkdir()
    (folder / "config.json").write_text((HF / "falcon-40b.json").read_text())
    logged = []
    monkeypatch.setattr(paraplan.cli.common, "track", lambda args, run: logged.append(run))
    assert main(["plan", "--model", str(folder), "--cluster", "dgx-a100", "--gpus", "64", "--global-batch-size", "64",
                 "--top-k", "1", "-o", str(tmp_path / "p.csv"), "--no-track"]) == 0
    description = logged[0].tags["mlflow.note.content"]
    defaults = "max_position_embeddings, tie_word_embeddings not stated"
    assert f"- warning: {folder / 'config.json'}: {defaults}" in description
    assert "no sequence length given; using max_position_embeddings 2,048" in description
    assert "paraplan plan: warning: " in capsys.readouterr().err  # printed as before
