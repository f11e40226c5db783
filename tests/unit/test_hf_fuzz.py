"""Hugging Face configurations of the architectures beyond the zoo's (Llama 4's chunked
attention, Gemma 3's multimodal wrapper, GPT-OSS, Qwen3-Next, DeepSeek-V3.2, Mamba
hybrids): every key is modelled exactly, named in a warning, or refused with an error
naming it, never read as something else (issue 24). The Llama 4 files below have the
keys and shapes of transformers' `Llama4TextConfig` as the released Scout / Maverick
`config.json` files state them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.core.errors import InputFileError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.attention_mix import attention_core_kernels
from paraplan.predict.hf_config import HARMLESS, read_hf_config
from paraplan.predict.layer_shape import causal_scores, kernel_seq_length
from paraplan.predict.models import PRESETS

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
LAYERS = 48


def _llama4_text(experts: int, step: int) -> dict:
    return {
        "attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0, "attn_scale": 0.1,
        "attn_temperature_tuning": True, "bos_token_id": 200000, "eos_token_id": [200001, 200007, 200008],
        "floor_scale": 8192, "for_llm_compressor": False, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
        "initializer_range": 0.02, "interleave_moe_layer_step": step, "intermediate_size": 8192,
        "intermediate_size_mlp": 16384, "max_position_embeddings": 10485760, "model_type": "llama4_text",
        "moe_layers": list(range(step - 1, LAYERS, step)),
        "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(LAYERS)],
        "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": LAYERS, "num_key_value_heads": 8,
        "num_local_experts": experts, "output_router_logits": False, "pad_token_id": 200018, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "torch_dtype": "bfloat16",
        "use_cache": True, "use_qk_norm": True, "vocab_size": 202048,
    }


def _llama4(experts: int, step: int) -> dict:
    return {"architectures": ["Llama4ForConditionalGeneration"], "boi_token_index": 200080, "eoi_token_index": 200081,
            "image_token_index": 200092, "model_type": "llama4", "text_config": _llama4_text(experts, step),
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
            "vision_config": {"hidden_size": 1408, "num_hidden_layers": 34}}


QK_NOTE = ("scout.json: text_config: use_qk_norm: Llama 4's query/key L2 norm (no weights, on the rotary layers) is "
           "priced as qk_layernorm on every layer, 256 weights each")


@pytest.mark.parametrize(("name", "experts", "step"), [("llama4-scout", 16, 1), ("llama4-maverick", 128, 2)])
def test_llama4_files_are_read_exactly_as_the_presets(name, experts, step):
    """Chunked attention of 8,192 tokens on the rotary layers (three in four), the NoPE
    layers full; experts on every `interleave_moe_layer_step`-th layer, one shared expert
    of `intermediate_size`, dense layers of `intermediate_size_mlp`; nothing ignored."""
    read, preset = read_hf_config(_llama4(experts, step), name, "scout.json"), PRESETS[name]
    assert read.model.moe_layers == preset.moe_layers  # (0, 1, 0, 1, ...) or every 2nd layer
    assert replace(read.model, moe_layer_freq=preset.moe_layer_freq) == replace(preset, seq_length=10485760)
    assert read.model.chunked_attention and read.model.windowed_layers[:4] == (True, True, True, False)
    assert read.ignored == ()
    assert read.notes == ("scout.json: vision_config ignored: that tower is not modelled (only the language model is)",
                          QK_NOTE)


def test_scout_counts_match_the_model_card():
    """Meta's card: 109B total (with the vision tower), 17B active."""
    m = read_hf_config(_llama4(16, 1), "scout", "scout.json").model
    assert (m.num_parameters, m.active_parameters) == (107_769_873_408, 17_172_907_008)


def test_an_empty_moe_layers_list_is_a_dense_model_and_layer_types_rule():
    """MobileLLM-R1 (a `llama4_text` file): `moe_layers: []` and every layer
    `full_attention` in `layer_types`: transformers builds a dense model with full
    attention, whatever `num_local_experts` and `attention_chunk_size` say."""
    text = {**_llama4_text(16, 1), "moe_layers": [], "interleave_moe_layer_step": 0, "num_experts_per_tok": 0,
            "layer_types": ["full_attention"] * LAYERS, "use_qk_norm": False}
    read = read_hf_config(text, "r1", "r1.json")
    assert (read.model.num_experts, read.model.window_size, read.model.chunked_attention) == (0, 0, False)
    assert read.model.ffn_hidden_size == 16384 and read.ignored == ()
    assert read.notes == ("r1.json: num_local_experts 16 unused: no layer holds experts (moe_layers is empty); read as "
                          "a dense model, as transformers builds it",)


def test_a_wrappers_tie_word_embeddings_is_the_language_models():
    """Llama 4 states `tie_word_embeddings` beside `text_config`, not in it; a wrapper that
    ties them means one matrix (was: the text config's family default, untied)."""
    tied = read_hf_config({**_llama4(16, 1), "tie_word_embeddings": True}, "s").model
    untied = read_hf_config(_llama4(16, 1), "s").model
    assert not tied.untie_embeddings_and_output_weights and untied.untie_embeddings_and_output_weights
    assert untied.num_parameters - tied.num_parameters == 202048 * 5120


def test_llama4_defaults_are_named():
    text = {k: v for k, v in _llama4_text(16, 1).items()
            if k not in ("attention_chunk_size", "use_qk_norm", "no_rope_layers", "moe_layers")}
    read = read_hf_config(text, "scout", "scout.json")
    assert read.model == replace(PRESETS["llama4-scout"], name="scout", seq_length=10485760)
    assert read.notes[0] == "scout.json: attention_chunk_size, use_qk_norm not stated: transformers' llama4_text " \
                            "defaults used"


@pytest.mark.parametrize(("changes", "message"), [
    ({"no_rope_layers": [1, 0] + [1] * (LAYERS - 2)},
     "key 'no_rope_layers': only a regular pattern of chunked and full attention layers is modelled (every k-th layer "
     "full); got full attention on layers [1] of 48"),
    ({"no_rope_layers": [2] * LAYERS},
     "key 'no_rope_layers': expected 48 entries of 0 (NoPE, full attention) or 1 (rotary, chunked attention), got "
     + repr([2] * LAYERS)),
    ({"layer_types": ["chunked_attention", "sliding_attention"] * 24},
     "key 'layer_types': expected 48 entries, each one of full_attention, chunked_attention; got 'sliding_attention'"),
    ({"sliding_window": 4096},
     "keys 'attention_chunk_size' and 'sliding_window': chunked and sliding-window attention in one model is not "
     "modelled"),
    ({"attention_chunk_size": "8k"}, "key 'attention_chunk_size': expected an integer >= 0, got '8k'"),
    ({"moe_layers": [48]}, "key 'moe_layers': expected layer indices in [0, 48), got 48"),
])
def test_llama4_keys_paraplan_cannot_read_are_errors_naming_them(changes, message):
    with pytest.raises(InputFileError) as err:
        read_hf_config({**_llama4_text(16, 1), **changes}, "x", "x.json")
    assert str(err.value) == f"x.json: {message}"


# ---- chunked attention's closed forms --------------------------------------------------

def _chunked(s: int, chunk: int, chunked: bool = True) -> TransformerModel:
    return TransformerModel("c", 4, 1024, 8, s, 1000, window_size=chunk, window_attn_skip_freq=4,
                            chunked_attention=chunked)


def test_a_chunked_query_sees_its_chunk_prefix():
    """s = 4c: four causal chunks, 4 c^2 / 2 pairs, half a sliding window's s c - c^2 / 2
    (7/16 s^2); with s = 2.5c the last chunk is half a chunk; s <= c is full attention."""
    c = 8192
    assert causal_scores(4 * c, c, chunked=True) == 2 * c * c
    assert causal_scores(4 * c, c) == 4 * c * c - c * c / 2
    assert causal_scores(2.5 * c, c, chunked=True) == (2 * c * c + (c / 2) ** 2) / 2
    assert causal_scores(c, c, chunked=True) == causal_scores(c) == c * c / 2
    assert kernel_seq_length(4 * c, c, chunked=True) == c  # each row as in a causal sequence of c
    assert kernel_seq_length(c // 2, c, chunked=True) == c // 2


def test_chunked_layers_price_and_count_their_chunks():
    """Model FLOPs count each chunk's square (c keys per query when c divides s, like a
    sliding window's w); the fused kernel runs the causal half of each chunk only."""
    c, s, b = 1024, 4096, 1.0
    chunked, sliding = _chunked(s, c), _chunked(s, c, chunked=False)
    full = 2 * b * s * (s - c) * 8 * (128 + 128)
    assert chunked.layer_forward_flops(b, 3) - chunked.layer_forward_flops(b, 0) == full
    assert chunked.layer_forward_flops(b, 0) == sliding.layer_forward_flops(b, 0)
    odd = _chunked(2560, c)  # 2 chunks and half of one: (2 c^2 + (c/2)^2) / s keys per query
    assert odd.layer_forward_flops(b, 3) - odd.layer_forward_flops(b, 0) == \
        2 * b * 8 * 256 * (2560 * 2560 - (2 * c * c + 512 * 512))
    run = RunSettings(micro_batch_size=1, global_batch_size=1, use_flash_attn=True)
    fwd_chunked, _ = attention_core_kernels(chunked, run, 0)
    fwd_sliding, _ = attention_core_kernels(sliding, run, 0)
    assert fwd_chunked.flops.sum() == 2 * 8 * (4 * c * c / 2) * 256
    assert fwd_sliding.flops.sum() == 2 * 8 * (s * c - c * c / 2) * 256
    assert fwd_chunked.m.max() == c


def test_chunked_attention_needs_a_window():
    with pytest.raises(ValueError) as err:
        TransformerModel("c", 4, 1024, 8, 4096, 1000, chunked_attention=True)
    assert str(err.value) == "model 'c': chunked_attention needs a window_size (the chunk's length in tokens)"


# ---- other families' keys: modelled, or refused naming the key ---------------------------

GEMMA = json.loads((HF / "gemma-3-27b.json").read_text())
GPT_OSS = json.loads((HF / "gpt-oss-20b.json").read_text())
LLAMA = json.loads((HF / "llama-3.1-8b.json").read_text())
DEEPSEEK = json.loads((HF / "deepseek-v3.json").read_text())

REFUSALS = [
    # Qwen3-Next: Gated DeltaNet (linear attention) layers between full ones
    (LLAMA, {"layer_types": ["linear_attention"] * 3 + ["full_attention"]} ,
     "key 'layer_types': 'linear_attention' layers are linear-attention layers, which paraplan does not model"),
    (LLAMA, {"full_attention_interval": 4},
     "key 'full_attention_interval': linear-attention layers, which paraplan does not model"),
    (LLAMA, {"linear_key_head_dim": 128},
     "key 'linear_key_head_dim': linear-attention layers, which paraplan does not model"),
    (LLAMA, {"linear_conv_kernel_dim": 4},
     "key 'linear_conv_kernel_dim': linear-attention layers, which paraplan does not model"),
    # DeepSeek-V3.2: DeepSeek sparse attention (lightning indexer, top-2048 keys)
    (DEEPSEEK, {"index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128},
     "key 'index_topk': DeepSeek sparse attention (an indexer choosing index_topk keys per query), which paraplan "
     "does not model"),
    (DEEPSEEK, {"model_type": "deepseek_v32"},
     "model_type 'deepseek_v32' has DeepSeek sparse attention (an indexer choosing index_topk keys per query), which "
     "paraplan does not model (decoder-only transformers with attention and MLP or experts only)"),
    # Mamba hybrids (Jamba, Zamba, Nemotron-H, Falcon-H1)
    (LLAMA, {"mamba_d_conv": 4, "mamba_expand": 2},
     "key 'mamba_d_conv': state-space (Mamba) layers, which paraplan does not model"),
    (LLAMA, {"layers_block_type": ["mamba", "attention"]},
     "key 'layers_block_type': state-space (Mamba) layers, which paraplan does not model"),
    (LLAMA, {"attn_layer_offset": 4, "attn_layer_period": 8},
     "key 'attn_layer_offset': state-space (Mamba) layers, which paraplan does not model"),
    (LLAMA, {"ssm_cfg": {"d_state": 16}}, "key 'ssm_cfg': state-space (Mamba) layers, which paraplan does not model"),
    (LLAMA, {"hybrid_override_pattern": "M-M*"},
     "key 'hybrid_override_pattern': state-space (Mamba) layers, which paraplan does not model"),
    # GPT-OSS: a layer pattern that is not every k-th layer full
    (GPT_OSS, {"layer_types": ["full_attention"] + ["sliding_attention"] * 23},
     "key 'layer_types': only a regular pattern of sliding and full attention layers is modelled (every k-th layer "
     "full); got full attention on layers [0] of 24"),
    (GPT_OSS, {"layer_types": ["sliding_attention", "full_attention"] * 11},
     "key 'layer_types': expected 24 entries, each one of full_attention, sliding_attention; got 22 entries for 24 "
     "layers"),
    (LLAMA, {"layer_types": ["sliding_attention", "full_attention"] * 16},
     "key 'layer_types': sliding_attention layers need a 'sliding_window' (and use_sliding_window true), got none"),
]


@pytest.mark.parametrize(("base", "extra", "message"), REFUSALS)
def test_architectures_paraplan_does_not_model_are_refused_naming_the_key(base, extra, message):
    with pytest.raises(InputFileError) as err:
        read_hf_config({**base, **extra}, "x", "x.json")
    assert str(err.value) == f"x.json: {message}"


def test_gemma3_refusals_inside_text_config_name_where():
    config = {**GEMMA, "text_config": {**GEMMA["text_config"], "layer_types": ["linear_attention"] * 62}}
    with pytest.raises(InputFileError) as err:
        read_hf_config(config, "g", "g.json")
    assert str(err.value) == ("g.json: text_config: key 'layer_types': 'linear_attention' layers are linear-attention "
                              "layers, which paraplan does not model")


def test_layer_types_of_gemma3_and_gpt_oss_are_the_patterns_they_state():
    gemma_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(62)]
    gemma = read_hf_config({**GEMMA, "text_config": {**GEMMA["text_config"], "layer_types": gemma_types}}, "g")
    assert (gemma.model.window_size, gemma.model.window_attn_skip_freq) == (1024, 6)
    all_full = read_hf_config({**GPT_OSS, "layer_types": ["full_attention"] * 24}, "o").model
    assert (all_full.window_size, all_full.window_attn_skip_freq) == (0, 0)  # was: every layer windowed
    all_sliding = read_hf_config({**GPT_OSS, "layer_types": ["sliding_attention"] * 24}, "o").model
    assert (all_sliding.window_size, all_sliding.window_attn_skip_freq) == (128, 0)


def test_first_dense_layers_hold_for_a_family_paraplan_does_not_know():
    """`first_k_dense_replace` in a file of an unknown model_type: the first k layers
    dense (was: read, then every layer priced with experts)."""
    config = {**DEEPSEEK, "model_type": "kimi_like", "n_shared_experts": None}
    read = read_hf_config(config, "k", "k.json")
    assert read.model.moe_layers[:4] == (False, False, False, True)


FAMILY_KEYS = {
    "llama4": ["attention_chunk_size", "no_rope_layers", "no_rope_layer_interval", "interleave_moe_layer_step",
               "moe_layers", "use_qk_norm", "attn_temperature_tuning", "floor_scale", "attn_scale",
               "intermediate_size_mlp"],
    "gemma3": ["sliding_window", "sliding_window_pattern", "query_pre_attn_scalar", "final_logit_softcapping",
               "attn_logit_softcapping", "rope_local_base_freq", "hidden_activation", "layer_types"],
    "gpt_oss": ["sliding_window", "layer_types", "swiglu_limit", "experts_per_token", "num_local_experts",
                "initial_context_length", "router_aux_loss_coef"],
    "qwen3_next": ["layer_types", "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads",
                   "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "decoder_sparse_step",
                   "shared_expert_intermediate_size", "mlp_only_layers"],
    "deepseek_v32": ["index_topk", "index_n_heads", "index_head_dim", "first_k_dense_replace", "n_group",
                     "topk_group", "n_shared_experts"],
    "mamba": ["layers_block_type", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_dt_rank",
              "attn_layer_period", "attn_layer_offset", "expert_layer_period", "ssm_state_size", "conv_kernel",
              "time_step_rank", "hybrid_override_pattern"],
}
VALUES = st.one_of(
    st.integers(0, 64), st.booleans(), st.none(), st.text("abc", max_size=3),
    st.lists(st.integers(0, 1), min_size=32, max_size=32),
    st.lists(st.sampled_from(["full_attention", "sliding_attention", "chunked_attention", "linear_attention",
                              "mamba"]), min_size=32, max_size=32),
)


MODELLED = {
    "attention_chunk_size", "no_rope_layers", "no_rope_layer_interval", "interleave_moe_layer_step", "moe_layers",
    "use_qk_norm", "sliding_window", "sliding_window_pattern", "hidden_activation", "layer_types",
    "experts_per_token", "num_local_experts", "decoder_sparse_step", "shared_expert_intermediate_size",
    "mlp_only_layers", "first_k_dense_replace", "n_group", "topk_group", "swiglu_limit",
    "attn_logit_softcapping", "final_logit_softcapping", "use_parallel_residual", "max_window_layers",
}
"""Keys the reader turns into fields of the model or names in a note (docs/models.md says how)."""
ALWAYS_REFUSED = {key for key in (*FAMILY_KEYS["qwen3_next"][1:7], *FAMILY_KEYS["deepseek_v32"][:3],
                                  *FAMILY_KEYS["mamba"])}


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(family=st.sampled_from(sorted(FAMILY_KEYS)), data=st.data())
def test_fuzz_family_key_sets_are_modelled_named_or_refused(family, data):
    """Fuzz over key sets of current families added to Llama 3.1 8B's file (32 layers):
    either an error naming one of the keys, or a model in which every added key is
    modelled (`MODELLED`), harmless or named as ignored; a key announcing layers
    paraplan does not model (linear attention, sparse attention, Mamba) is always an
    error."""
    keys = data.draw(st.lists(st.sampled_from(FAMILY_KEYS[family]), min_size=1, max_size=4, unique=True))
    extra = {key: data.draw(VALUES) for key in keys}
    try:
        read = read_hf_config({**LLAMA, **extra}, "x", "x.json")
    except InputFileError as err:
        named = (*extra, "attention_chunk_size", "sliding_window", "num_experts_per_tok")
        assert str(err).startswith("x.json: "), err
        assert any(key in str(err) for key in named), err
        return
    stated = {key for key, value in extra.items() if value is not None}
    assert not {k for k in stated if extra[k] not in (False, [], 0, "")} & ALWAYS_REFUSED, extra
    assert stated - HARMLESS - set(read.ignored) <= MODELLED, extra
