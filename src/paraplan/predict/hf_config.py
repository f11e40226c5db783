"""Hugging Face `config.json` files as `TransformerModel`s, without guessing.

Every key of the file is one of four kinds:
- used: it sets a field of the model (`_read`);
- harmless: it changes nothing paraplan prices or counts (token ids, initialisation,
  rotary scaling, logit soft-capping);
- refused: the architecture has layers paraplan does not model (state-space /
  linear-attention hybrids, encoder-decoders): an `InputFileError` naming the key;
- anything else: named in a warning ("ignored: ..."), never silently dropped.

Multimodal files keep the language model under `text_config`; it is read from there
and the other towers (`vision_config`, `audio_config`) are named as not modelled.
Keys a family leaves to its `transformers` configuration class's defaults (Gemma 3's
`text_config` states no vocabulary size) are filled from `FAMILY_DEFAULTS` and named
in a note. What each family means by its keys (which width is an expert's, whether
QKV has biases, whether the MLP is gated) is in `_FAMILIES`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from paraplan.core.errors import InputFileError
from paraplan.core.transformer import TransformerModel
from paraplan.predict.hf_router import ROUTER_KEYS, router_fields

GATED_ACTIVATIONS = ("silu", "swiglu", "swish")

HARMLESS = frozenset({
    "architectures", "auto_map", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "torch_dtype", "dtype", "transformers_version", "initializer_range",
    "initializer_factor", "use_cache", "rope_scaling", "rope_theta", "rope_type", "rope_parameters",
    "partial_rotary_factor", "rotary_emb_base", "pretraining_tp", "rms_norm_eps", "layer_norm_eps",
    "layer_norm_epsilon", "norm_eps", "output_router_logits", "router_aux_loss_coef", "aux_loss_alpha",
    "seq_aux", "ep_size", "query_pre_attn_scalar",
    "initial_context_length", "router_jitter_noise", "attention_dropout",
    "attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_activation", "summary_first_dropout",
    "summary_proj_to_labels", "summary_type", "summary_use_proj", "scale_attn_weights",
    "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx", "task_specific_params",
    "quantization_config", "boi_token_index", "eoi_token_index", "image_token_index",
    "mm_tokens_per_image", "tokenizer_class", "_name_or_path", "cache_implementation", "attn_implementation",
    "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id", "head_dim_original",
    "floor_scale", "attn_scale", "attn_temperature_tuning", "moe_router_dtype", "router_dtype",
    "rotary_pct", "hidden_dropout", "dropout", "tie_word_embeddings", "attention_bias", "mlp_bias",
    "for_llm_compressor", "_attn_implementation_autoset", "rope_local_base_freq",
    # Granite's scalars on the embedding, the residual branches, the attention scores and the logits
    "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling",
    "input_jitter_noise",  # Phi-3.5-MoE's training-time noise on the router's input
    "original_max_position_embeddings",  # Phi-3's LongRoPE: the length before the extension
    "emb_pdrop", "clip_qkv", "moe_jitter_eps", "moe_loss_weight",  # DBRX's: dropout, a clamp, router training terms
})
"""Keys that change nothing paraplan counts or prices (dropouts and biases are read,
and listed here only so their presence is not reported)."""

REFUSED = {
    "layers_block_type": "state-space (Mamba) layers", "attn_layer_period": "state-space (Mamba) layers",
    "mamba_d_state": "state-space (Mamba) layers", "ssm_state_size": "state-space (Mamba) layers",
    "hybrid_override_pattern": "state-space (Mamba) layers", "linear_num_key_heads": "linear-attention layers",
    "linear_num_value_heads": "linear-attention layers", "full_attention_interval": "linear-attention layers",
    "is_encoder_decoder": "an encoder-decoder architecture", "encoder_layers": "an encoder-decoder architecture",
    "index_topk": "DeepSeek sparse attention (an indexer choosing index_topk keys per query)",
    "index_n_heads": "DeepSeek sparse attention (an indexer choosing index_topk keys per query)",
    "index_head_dim": "DeepSeek sparse attention (an indexer choosing index_topk keys per query)",
    "attn_layer_offset": "state-space (Mamba) layers", "expert_layer_period": "state-space (Mamba) layers",
    "time_step_rank": "state-space (Mamba) layers", "conv_kernel": "state-space (Mamba) layers",
}
"""Keys that announce layers paraplan does not model: refused with what they are."""

REFUSED_PREFIXES = {
    "mamba_": "state-space (Mamba) layers", "ssm_": "state-space (Mamba) layers",
    "linear_": "linear-attention layers",
}
"""Key prefixes of the same (Jamba's `mamba_d_conv`, Qwen3-Next's `linear_key_head_dim`)."""

REFUSED_TYPES = {
    "jamba": "state-space (Mamba) layers", "mamba": "state-space (Mamba) layers",
    "mamba2": "state-space (Mamba) layers", "falcon_mamba": "state-space (Mamba) layers",
    "falcon_h1": "state-space (Mamba) layers", "zamba": "state-space (Mamba) layers",
    "zamba2": "state-space (Mamba) layers", "nemotron_h": "state-space (Mamba) layers",
    "bamba": "state-space (Mamba) layers", "granitemoehybrid": "state-space (Mamba) layers",
    "qwen3_next": "linear-attention layers", "minimax": "linear-attention layers",
    "deepseek_v32": "DeepSeek sparse attention (an indexer choosing index_topk keys per query)",
    "rwkv": "recurrent (RWKV) layers", "recurrent_gemma": "recurrent layers", "t5": "an encoder-decoder architecture",
    "bart": "an encoder-decoder architecture", "bert": "an encoder-only architecture",
}

REFUSED_LAYER_TYPES = {
    "linear_attention": "linear-attention layers", "mamba": "state-space (Mamba) layers",
    "mamba2": "state-space (Mamba) layers", "recurrent": "recurrent layers",
}
"""Entries of `layer_types` that name layers paraplan does not model (Qwen3-Next's
Gated DeltaNet layers, hybrids)."""

FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    # transformers' GemmaConfig and Gemma2Config tie the output layer to the embedding
    # (tie_word_embeddings=True), which the released files leave unstated; Gemma 2
    # alternates sliding-window and global layers (Gemma2DecoderLayer: every 2nd layer global)
    "gemma": {"tie_word_embeddings": True},
    "gemma2": {"tie_word_embeddings": True, "sliding_window_pattern": 2},
    # the output layer where transformers' class differs from paraplan's guess for a family
    # read from its keys alone (untied when the MLP is gated, else tied): GPTNeoXConfig,
    # NemotronConfig and PhiConfig untie it, CohereConfig ties it (transformers 5.24 and 4.57)
    "gpt_neox": {"tie_word_embeddings": False}, "nemotron": {"tie_word_embeddings": False},
    "phi": {"tie_word_embeddings": False}, "cohere": {"tie_word_embeddings": True},
    "ernie4_5_moe": {"tie_word_embeddings": True},  # Ernie4_5_MoeConfig's default
    # transformers' Gemma3TextConfig defaults for keys the released files leave out
    "gemma3_text": {"vocab_size": 262208, "hidden_activation": "gelu_pytorch_tanh",
                    "max_position_embeddings": 131072, "sliding_window_pattern": 6, "tie_word_embeddings": True,
                    "rms_norm_eps": 1e-6},
    # transformers' Llama4TextConfig: chunked attention of 8,192 tokens, query/key norm
    "llama4_text": {"attention_chunk_size": 8192, "use_qk_norm": True},
    # transformers' FalconConfig: 2,048 positions, and PretrainedConfig's tied output layer (Falcon's files
    # state neither)
    "falcon": {"max_position_embeddings": 2048, "tie_word_embeddings": True},
    # transformers' GraniteMoeConfig and GraniteMoeSharedConfig tie the output layer
    "granitemoe": {"tie_word_embeddings": True}, "granitemoeshared": {"tie_word_embeddings": True},
    "dbrx": {"hidden_act": "silu"},  # DbrxFFNConfig's ffn_act_fn default, {"name": "silu"}
}

OTHER_TOWERS = ("vision_config", "audio_config", "speech_config")


@dataclass(frozen=True)
class _Family:
    """What a `model_type` means by its keys."""

    gated: bool | None = None  # None: from the activation's name
    qkv_bias: bool = False  # biases on QKV whatever `attention_bias` says (Qwen2)
    qkv_bias_key: bool = False  # `attention_bias` sets QKV biases alone, never the output's or the MLP's (GLM-4.5)
    qk_norm: bool = False
    sandwich_norm: bool = False  # each sublayer's output normalised too (Gemma 2, 3)
    expert_width_key: str = "moe_intermediate_size"
    dense_width_key: str = "intermediate_size"
    shared_expert: str = ""  # "deepseek": n_shared_experts x expert width; "llama4": one of intermediate_size;
    # "ernie": moe_num_shared_experts x expert width (and ERNIE's MoE layer placement)
    rope: bool = True  # rotary positions (False: learned absolute positions unless rotary keys say otherwise)
    rms_norm: bool = True  # RMSNorm and no linear biases unless the file says otherwise, as its transformers
    # class defaults (False: from the keys, RMSNorm where rms_norm_eps / norm_eps is stated)
    bias_key: str | None = None  # the one key that sets every linear layer's bias, false when absent (Falcon's
    # `bias`); "": no biases whatever the keys (DBRX); None: `use_bias`, `attention_bias`, `mlp_bias`
    layer_norm: bool = False  # LayerNorm whatever its epsilon's key is called (Phi-3.5-MoE's `rms_norm_eps`)
    parallel_key: str = "use_parallel_residual"  # the key of a parallel attention + MLP block (Falcon's
    # `parallel_attn`), and whether the family's class builds one when the file does not say
    parallel_default: bool = False


_FAMILIES: dict[str, _Family] = {
    "llama": _Family(gated=True), "mistral": _Family(gated=True), "qwen2": _Family(gated=True, qkv_bias=True),
    "qwen3": _Family(gated=True, qk_norm=True), "olmo2": _Family(gated=True, qk_norm=True),
    "gemma": _Family(gated=True), "gemma2": _Family(gated=True, sandwich_norm=True),
    "gemma3_text": _Family(gated=True, qk_norm=True, sandwich_norm=True),
    "mixtral": _Family(gated=True, expert_width_key="intermediate_size"),
    "qwen2_moe": _Family(gated=True, qkv_bias=True), "qwen3_moe": _Family(gated=True, qk_norm=True),
    "deepseek_v2": _Family(gated=True, shared_expert="deepseek"),
    "deepseek_v3": _Family(gated=True, shared_expert="deepseek"),
    # Moonshot's Kimi K2: DeepSeek-V3's architecture (`DeepseekV3ForCausalLM`) under its own model_type
    "kimi_k2": _Family(gated=True, shared_expert="deepseek"),
    # Zhipu's GLM-4.5 / 4.6 (transformers' Glm4MoeConfig): DeepSeek-V3's MoE layout (first_k_dense_replace
    # dense layers, n_shared_experts x the expert width, num_nextn_predict_layers MTP layers) on GQA
    # attention with optional per-head QK norm (`use_qk_norm`) and `attention_bias` on q/k/v only
    "glm4_moe": _Family(gated=True, shared_expert="deepseek", qkv_bias_key=True),
    # Baidu's ERNIE 4.5 MoE (transformers' Ernie4_5_MoeConfig): moe_num_experts of moe_intermediate_size,
    # moe_k chosen, moe_num_shared_experts x that width, on every moe_layer_interval-th layer from
    # moe_layer_start_index to moe_layer_end_index; `use_bias` on every linear layer
    "ernie4_5_moe": _Family(gated=True, shared_expert="ernie"),
    # MiniMax-M2 (transformers' MiniMaxM2Config): Mixtral's experts (of intermediate_size) and QK norm,
    # DeepSeek-V3's sigmoid router with its expert bias; no biases, no shared expert
    "minimax_m2": _Family(gated=True, expert_width_key="intermediate_size", qk_norm=True),
    # AllenAI's OLMoE (transformers' OlmoeConfig): Mixtral's experts (of intermediate_size) with QK norm
    "olmoe": _Family(gated=True, expert_width_key="intermediate_size", qk_norm=True),
    "gpt_oss": _Family(gated=True, expert_width_key="intermediate_size"),
    # Microsoft's Phi-3.5-MoE (transformers' PhimoeConfig): Mixtral's experts (of intermediate_size), LayerNorm
    # (its epsilon named rms_norm_eps), `attention_bias` on q/k/v/o; SparseMixer's top-2 router
    "phimoe": _Family(gated=True, expert_width_key="intermediate_size", qkv_bias_key=True, layer_norm=True),
    # IBM's Granite MoE (transformers' GraniteMoeConfig, GraniteMoeSharedConfig): Mixtral's experts (of
    # intermediate_size), RMSNorm, no biases; the shared variant adds one expert of shared_intermediate_size
    "granitemoe": _Family(gated=True, expert_width_key="intermediate_size"),
    "granitemoeshared": _Family(gated=True, expert_width_key="intermediate_size", shared_expert="granite"),
    # Databricks' DBRX (transformers' DbrxConfig; its attn_config and ffn_config read as flat keys,
    # `_dbrx_flat`): GQA, experts of ffn_hidden_size, LayerNorm without biases, no linear biases
    "dbrx": _Family(gated=True, expert_width_key="intermediate_size", layer_norm=True, bias_key=""),
    "llama4_text": _Family(gated=True, expert_width_key="intermediate_size", dense_width_key="intermediate_size_mlp",
                           shared_expert="llama4"),
    # TII's Falcon 7B / 40B / 180B (transformers' FalconConfig): LayerNorm, a GELU MLP of ffn_hidden_size,
    # biases only with `bias`; multi-query attention unless new_decoder_architecture (num_kv_heads groups);
    # attention and MLP in parallel (`parallel_attn`)
    "falcon": _Family(gated=False, rms_norm=False, dense_width_key="ffn_hidden_size", bias_key="bias",
                      parallel_key="parallel_attn", parallel_default=True),
    "gpt2": _Family(gated=False, rope=False, rms_norm=False),
    "gpt_neox": _Family(gated=False, rms_norm=False, parallel_default=True),  # GPTNeoXConfig's default
    "opt": _Family(gated=False, rope=False, rms_norm=False),
}


@dataclass(frozen=True)
class HfModel:
    """A model read from a Hugging Face file, and what the reader has to say about it."""

    model: TransformerModel
    ignored: tuple[str, ...]  # keys neither used nor known to be harmless
    notes: tuple[str, ...]  # towers not modelled, defaults filled in
    max_position_embeddings: int


class _Keys:
    """Typed reads of one config mapping; remembers which keys were used."""

    def __init__(self, config: dict, source: str) -> None:
        self.config, self.source = config, source
        self.used: set[str] = set()
        self.notes: list[str] = []  # what the reader read in a way the user should know

    def has(self, key: str) -> bool:
        return self.config.get(key) is not None

    def get(self, *keys: str, default: Any = None) -> Any:
        for key in keys:
            self.used.add(key)
        for key in keys:
            if self.config.get(key) is not None:
                return self.config[key]
        if default is None:
            raise InputFileError(self.source, f"missing key; expected one of {', '.join(keys)}")
        return default

    def count(self, *keys: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.get(*keys, default=default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            key = next((k for k in keys if self.config.get(k) is not None), keys[0])
            raise InputFileError(self.source, f"key '{key}': expected an integer >= {minimum}, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, default=default)
        if not isinstance(value, bool):
            raise InputFileError(self.source, f"key '{key}': expected true or false, got {value!r}")
        return value

    def text(self, *keys: str, default: str) -> str:
        value = self.get(*keys, default=default)
        if not isinstance(value, str):
            key = next(k for k in keys if self.config.get(k) is not None)
            raise InputFileError(self.source, f"key '{key}': expected a string, got {value!r}")
        return value.lower()

    def probability(self, *keys: str) -> float:
        value = self.get(*keys, default=0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            raise InputFileError(self.source, f"key '{keys[0]}': expected a probability in [0, 1), got {value!r}")
        return float(value)

    def layer_list(self, key: str, layers: int) -> list:
        value = self.get(key, default=[])
        if not isinstance(value, list):
            raise InputFileError(self.source, f"key '{key}': expected a list, got {value!r}")
        return value


def _nonnegative(keys: _Keys, key: str) -> float:
    """A key that is a number >= 0, 0 where absent or null: GPT-OSS's `swiglu_limit`
    (Megatron-Core's `activation_func_clamp_value`), Gemma 2's `attn_logit_softcapping`."""
    value = keys.get(key, default=0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise InputFileError(keys.source, f"key '{key}': expected a number >= 0, got {value!r}")
    return float(value)


def _refuse(config: dict, source: str) -> None:
    model_type = str(config.get("model_type", "")).lower()
    if model_type in REFUSED_TYPES:
        raise InputFileError(source, f"model_type '{model_type}' has {REFUSED_TYPES[model_type]}, which paraplan "
                             "does not model (decoder-only transformers with attention and MLP or experts only)")
    for key, value in config.items():
        what = REFUSED.get(key) or next((w for p, w in REFUSED_PREFIXES.items() if key.startswith(p)), None)
        if what and value not in (None, False, [], 0, ""):
            raise InputFileError(source, f"key '{key}': {what}, which paraplan does not model")


def _language_model(config: dict, source: str) -> tuple[dict, list[str], str]:
    """The language model's mapping (`text_config` when nested), notes, and where it is."""
    notes = [f"{source}: {tower} ignored: that tower is not modelled (only the language model is)"
             for tower in OTHER_TOWERS if tower in config]
    text = config.get("text_config")
    if text is None:
        return config, notes, source
    if not isinstance(text, dict):
        raise InputFileError(source, f"key 'text_config': expected a JSON object, got {text!r}")
    return text, notes, f"{source}: text_config"


def _moe_pattern(keys: _Keys, family: _Family, layers: int) -> list[int]:
    """Which layers hold experts: Llama 4's `moe_layers` when the file states it (an
    empty list: none, as transformers reads it), else every `moe_layer_freq` /
    `decoder_sparse_step` / `interleave_moe_layer_step`-th layer after
    `first_k_dense_replace`, less `mlp_only_layers`."""
    if keys.config.get("moe_layers") is not None:
        listed = keys.layer_list("moe_layers", layers)
        keys.used.add("interleave_moe_layer_step")  # transformers reads moe_layers instead
        for i in listed:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers:
                raise InputFileError(keys.source, f"key 'moe_layers': expected layer indices in [0, {layers}), "
                                     f"got {i!r}")
        return [int(i in set(listed)) for i in range(layers)]
    if family.shared_expert == "ernie":  # ERNIE 4.5: every interval-th layer from start to end (inclusive)
        start = keys.count("moe_layer_start_index", default=1, minimum=0)
        end = keys.config.get("moe_layer_end_index", -1)
        keys.used.add("moe_layer_end_index")
        if isinstance(end, bool) or not isinstance(end, int) or not -1 <= end < layers:
            raise InputFileError(keys.source, f"key 'moe_layer_end_index': expected -1 (the last layer) or a layer "
                                 f"index in [0, {layers}), got {end!r}")
        end = layers - 1 if end == -1 else end
        interval = keys.count("moe_layer_interval", default=1)
        return [int((i + 1) % interval == 0 and start <= i <= end) for i in range(layers)]
    first_dense = keys.count("first_k_dense_replace", default=0, minimum=0)
    step = keys.count("moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step", default=1)
    pattern = [int(i >= first_dense and (i % step == 0 if family.shared_expert == "deepseek" else (i + 1) % step == 0))
               for i in range(layers)]
    for i in keys.layer_list("mlp_only_layers", layers):
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers:
            raise InputFileError(keys.source, f"key 'mlp_only_layers': expected layer indices in [0, {layers}), "
                                 f"got {i!r}")
        pattern[i] = 0
    return pattern


def _moe_fields(keys: _Keys, family: _Family, layers: int, model_type: str) -> dict[str, Any]:
    experts_keys = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
    experts = keys.count(*experts_keys, default=0, minimum=0)
    if not experts:
        return {}
    pattern = _moe_pattern(keys, family, layers)
    if not any(pattern):
        keys.used.update(("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_k",
                          "moe_num_shared_experts", family.expert_width_key, *ROUTER_KEYS))
        key = next(k for k in experts_keys if keys.config.get(k) is not None)
        keys.notes.append(f"{keys.source}: {key} {experts} unused: no layer holds experts (moe_layers is empty); "
                          "read as a dense model, as transformers builds it")
        return {}
    topk = keys.count("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_k")
    width = keys.count(family.expert_width_key)
    shared = 0
    if family.shared_expert == "deepseek":
        shared = keys.count("n_shared_experts", default=0, minimum=0) * width
    elif family.shared_expert == "ernie":
        shared = keys.count("moe_num_shared_experts", default=0, minimum=0) * width
    elif family.shared_expert == "llama4":
        shared = width
    elif family.shared_expert == "granite":
        shared = keys.count("shared_intermediate_size", default=0, minimum=0)
    elif keys.has("shared_expert_intermediate_size"):
        shared = keys.count("shared_expert_intermediate_size", minimum=0)
    freq: int | tuple[int, ...] = 1 if all(pattern) else tuple(pattern)
    return {"num_experts": experts, "moe_router_topk": topk, "moe_ffn_hidden_size": width,
            "moe_shared_expert_intermediate_size": shared, "moe_layer_freq": freq, **_group_fields(keys),
            **router_fields(keys, model_type, topk)}  # the model's own router (`hf_router`)


# DeepSeek-V2/V3's `topk_method`: `greedy` has no group limit; the others route within
# `topk_group` of `n_group` groups
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def _group_fields(keys: _Keys) -> dict[str, Any]:
    """Group-limited routing (DeepSeek's `n_group`, `topk_group`), unless the file's
    `topk_method` is `greedy` (DeepSeek-V2's router without a group limit) or there is one
    group."""
    groups = keys.count("n_group", default=0, minimum=0)
    chosen = keys.count("topk_group", default=0, minimum=0)
    method = keys.config.get("topk_method")
    if method is not None and (not isinstance(method, str) or method.lower() not in TOPK_METHODS):
        raise InputFileError(keys.source, f"key 'topk_method': expected one of {', '.join(TOPK_METHODS)}, "
                             f"got {method!r}")
    if groups <= 1 or str(method or "").lower() == "greedy":
        return {}
    if not 1 <= chosen <= groups:
        raise InputFileError(keys.source, f"key 'topk_group': expected an integer in [1, n_group {groups}] "
                             f"(the groups each token's experts come from), got {keys.config.get('topk_group')!r}")
    return {"moe_router_num_groups": groups, "moe_router_group_topk": chosen}


_DBRX_NESTED = {
    "attn_config": {"kv_n_heads": "num_key_value_heads", "attn_pdrop": "attention_dropout"},
    "ffn_config": {"moe_num_experts": "num_local_experts", "moe_top_k": "num_experts_per_tok",
                   "ffn_hidden_size": "intermediate_size"},
}
"""DbrxConfig's nested keys under the flat names the reader reads; their other keys keep
their names (`rope_theta`, `clip_qkv`, `moe_jitter_eps`, ...)."""


def _dbrx_flat(config: dict, source: str) -> dict:
    """DBRX's `attn_config` and `ffn_config` merged into the top level under the reader's
    names; `ffn_act_fn` {"name": ...} as `hidden_act`. DBRX's router (a softmax over all
    experts, the top-k divided by their `moe_normalize_expert_weights`-norm) is the softmax
    over the k chosen for the L1 norm, its default; another norm is refused."""
    flat = {k: v for k, v in config.items() if k not in _DBRX_NESTED}
    for section, names in _DBRX_NESTED.items():
        nested = config.get(section) or {}
        if not isinstance(nested, dict):
            raise InputFileError(source, f"key '{section}': expected a JSON object, got {nested!r}")
        for key, value in nested.items():
            if key != "model_type":  # each sub-config's own, empty in the released file
                flat[names.get(key, key)] = value
    act = flat.pop("ffn_act_fn", None)
    if act is not None:
        if not isinstance(act, dict) or not isinstance(act.get("name"), str):
            raise InputFileError(source, f"key 'ffn_config.ffn_act_fn': expected {{\"name\": ...}}, got {act!r}")
        flat["hidden_act"] = act["name"]
    norm = flat.pop("moe_normalize_expert_weights", 1)
    if norm not in (1, 1.0):
        raise InputFileError(source, f"key 'ffn_config.moe_normalize_expert_weights': {norm!r}; only 1 (the chosen "
                             "experts' weights summing to one, DbrxConfig's default) is modelled")
    if flat.pop("uniform_expert_assignment", False):
        raise InputFileError(source, "key 'ffn_config.uniform_expert_assignment': true (tokens sent to experts in "
                             "turn, a benchmarking mode) is not modelled; expected false")
    return flat


def _falcon_query_groups(keys: _Keys, heads: int) -> int:
    """Falcon's key/value heads as transformers' FalconAttention sets them: num_kv_heads
    (default: one per query head) with new_decoder_architecture or without multi_query,
    else one (multi-query attention, FalconConfig's default). ALiBi (Falcon-RW) is refused:
    paraplan prices rotary or learned positions only."""
    if keys.flag("alibi", default=False):
        raise InputFileError(keys.source, "key 'alibi': ALiBi attention biases are not a position scheme paraplan "
                             "models (rotary or learned absolute positions); expected false")
    keys.used.update(("num_ln_in_parallel_attn", "apply_residual_connection_post_layernorm"))
    kv = keys.count("num_kv_heads", default=heads)
    new, multi = keys.flag("new_decoder_architecture", default=False), keys.flag("multi_query", default=True)
    return kv if new or not multi else 1


def _mla_fields(keys: _Keys) -> dict[str, Any]:
    if not keys.has("kv_lora_rank"):
        return {}
    return {"multi_latent_attention": True, "q_lora_rank": keys.count("q_lora_rank", default=0, minimum=0),
            "kv_lora_rank": keys.count("kv_lora_rank"), "qk_head_dim": keys.count("qk_nope_head_dim"),
            "qk_pos_emb_head_dim": keys.count("qk_rope_head_dim"), "v_head_dim": keys.count("v_head_dim")}


def _regular_skip_freq(windowed: list[bool], key: str, source: str, what: str) -> int:
    """k of "every k-th layer attends to the full sequence" (0: every layer windowed,
    -1: none), or an error naming `key` when the layers follow no such pattern."""
    if not any(windowed):
        return -1  # no windowed layer: full attention everywhere
    if all(windowed):
        return 0
    for k in range(2, len(windowed) + 1):
        if all(w == bool((i + 1) % k) for i, w in enumerate(windowed)):
            return k
    full = [i for i, w in enumerate(windowed) if not w]
    raise InputFileError(source, f"key '{key}': only a regular pattern of {what} and full attention layers is "
                         f"modelled (every k-th layer full); got full attention on layers {full} of {len(windowed)}")


def _layer_types(keys: _Keys, layers: int, allowed: tuple[str, ...]) -> list[str]:
    types = keys.layer_list("layer_types", layers)
    refused = next((t for t in types if t in REFUSED_LAYER_TYPES), None)
    if refused is not None:
        raise InputFileError(keys.source, f"key 'layer_types': '{refused}' layers are "
                             f"{REFUSED_LAYER_TYPES[refused]}, which paraplan does not model")
    if types and (len(types) != layers or any(t not in allowed for t in types)):
        bad = next((t for t in types if t not in allowed), None)
        got = f"{bad!r}" if bad is not None else f"{len(types)} entries for {layers} layers"
        raise InputFileError(keys.source, f"key 'layer_types': expected {layers} entries, each one of "
                             f"{', '.join(allowed)}; got {got}")
    return types


def _chunk_fields(keys: _Keys, layers: int) -> dict[str, Any]:
    """Llama 4's chunked local attention: layers marked `chunked_attention` in
    `layer_types`, else those whose `no_rope_layers` entry is 1 (rotary layers; the
    NoPE layers attend to the full sequence), else all but every
    `no_rope_layer_interval`-th (transformers' Llama4TextConfig defaults)."""
    chunk = keys.count("attention_chunk_size", default=0, minimum=0)
    types = _layer_types(keys, layers, ("full_attention", "chunked_attention"))
    rope = keys.layer_list("no_rope_layers", layers)
    interval = keys.count("no_rope_layer_interval", default=4)
    if types:
        chunked, key = [t == "chunked_attention" for t in types], "layer_types"
    elif rope:
        if len(rope) != layers or any(r not in (0, 1) or isinstance(r, float) for r in rope):
            raise InputFileError(keys.source, f"key 'no_rope_layers': expected {layers} entries of 0 (NoPE, full "
                                 f"attention) or 1 (rotary, chunked attention), got {rope!r}")
        chunked, key = [bool(r) for r in rope], "no_rope_layers"
    else:
        chunked, key = [bool((i + 1) % interval) for i in range(layers)], "no_rope_layer_interval"
    if any(chunked) and not chunk:
        raise InputFileError(keys.source, f"key '{key}': chunked attention layers need 'attention_chunk_size' "
                             "(the chunk's length in tokens), got none")
    skip = _regular_skip_freq(chunked, key, keys.source, "chunked")
    if skip < 0:
        return {}
    return {"window_size": chunk, "window_attn_skip_freq": skip, "chunked_attention": True}


def _window_fields(keys: _Keys, layers: int) -> dict[str, Any]:
    """Sliding-window layers: `layer_types` (GPT-OSS, newer files), a pattern (Gemma
    3: every 6th layer global), or none when `use_sliding_window` is false (Qwen, whose
    window key is unused); Llama 4's chunked attention in `_chunk_fields`."""
    keys.used.add("no_rope_layers")  # NoPE layers (SmolLM3, Llama 4) skip rotary positions: nothing counted
    types = keys.config.get("layer_types")
    if keys.has("attention_chunk_size") or (isinstance(types, list) and "chunked_attention" in types):
        if keys.has("sliding_window"):
            raise InputFileError(keys.source, "keys 'attention_chunk_size' and 'sliding_window': chunked and "
                                 "sliding-window attention in one model is not modelled")
        return _chunk_fields(keys, layers)
    window = keys.count("sliding_window", default=0, minimum=0)
    if keys.has("sliding_window_size"):  # Gemma 2's files state the window twice
        alias = keys.count("sliding_window_size", minimum=0)
        if alias != window:
            raise InputFileError(keys.source, f"keys 'sliding_window' ({window}) and 'sliding_window_size' "
                                 f"({alias}) differ: expected one window length")
    use = keys.flag("use_sliding_window", default=True)
    types = _layer_types(keys, layers, ("full_attention", "sliding_attention"))
    if not window or not use:
        if any(t == "sliding_attention" for t in types):
            raise InputFileError(keys.source, "key 'layer_types': sliding_attention layers need a "
                                 "'sliding_window' (and use_sliding_window true), got none")
        keys.used.add("max_window_layers")  # Qwen's: which layers would slide, were the window used
        return {}
    if types:
        skip = _regular_skip_freq([t == "sliding_attention" for t in types], "layer_types", keys.source,
                                  "sliding")
        return {} if skip < 0 else {"window_size": window, "window_attn_skip_freq": skip}
    if keys.has("max_window_layers"):  # Qwen2/3: the first max_window_layers layers full, the rest windowed
        first = keys.count("max_window_layers", minimum=0)
        skip = _regular_skip_freq([i >= first for i in range(layers)], "max_window_layers", keys.source,
                                  "sliding")
        return {} if skip < 0 else {"window_size": window, "window_attn_skip_freq": skip}
    skip = keys.count("sliding_window_pattern", default=0, minimum=0)
    return {"window_size": window, "window_attn_skip_freq": skip}


def read_hf_config(config: object, name: str, source: str = "<config.json>") -> HfModel:
    """A `TransformerModel` from a Hugging Face `config.json` mapping (see the module
    doc). Its `seq_length` is `max_position_embeddings`: callers replace it with the
    length the run trains at."""
    if not isinstance(config, dict):
        raise InputFileError(source, "expected a JSON object")
    _refuse(config, source)
    text, notes, where = _language_model(config, source)
    _refuse(text, where)
    model_type = str(text.get("model_type", config.get("model_type", ""))).lower()
    # a wrapper's own `tie_word_embeddings` (Llama 4's) is the language model's when text_config states none
    nested = text is not config
    if nested and text.get("tie_word_embeddings") is None and config.get("tie_word_embeddings") is not None:
        text = {**text, "tie_word_embeddings": config["tie_word_embeddings"]}
    if model_type == "dbrx":
        text = _dbrx_flat(text, where)
    filled = {k: v for k, v in FAMILY_DEFAULTS.get(model_type, {}).items() if text.get(k) is None}
    if filled:
        notes.append(f"{where}: {', '.join(sorted(filled))} not stated: transformers' {model_type} defaults used")
    keys = _Keys({**text, **filled}, where)
    family = _FAMILIES.get(model_type)
    if family is None:
        notes.append(f"{where}: model_type '{model_type}' is not one paraplan knows; read from its keys alone "
                     "(compare the parameter count with the model card)")
        family = _Family(rope=False, rms_norm=False)
    layers = keys.count("num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = keys.count("hidden_size", "n_embd", "d_model")
    heads = keys.count("num_attention_heads", "n_head", "n_heads")
    act = keys.text("hidden_activation", "hidden_act", "activation_function", "activation", default="gelu")
    gated = family.gated if family.gated is not None else act in GATED_ACTIVATIONS
    moe = _moe_fields(keys, family, layers, model_type)
    dense_width = keys.count(family.dense_width_key, "n_inner", "ffn_dim", default=4 * hidden)
    rms = not family.layer_norm and (family.rms_norm or keys.has("rms_norm_eps") or keys.has("norm_eps"))
    if family.qkv_bias_key:
        qkv_bias, bias = keys.flag("attention_bias", default=False), False
    elif family.bias_key is not None:
        qkv_bias, bias = False, bool(family.bias_key) and keys.flag(family.bias_key, default=False)
    else:
        qkv_bias = family.qkv_bias
        every = keys.flag("use_bias", default=not rms)  # ERNIE's and StarCoder 2's: every linear layer
        bias = keys.flag("attention_bias", default=keys.flag("mlp_bias", default=every))
    fields: dict[str, Any] = {
        "name": name, "num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
        "seq_length": keys.count("max_position_embeddings", "n_positions", "n_ctx", "seq_length", "max_seq_len"),
        "vocab_size": keys.count("vocab_size"),
        "num_query_groups": (_falcon_query_groups(keys, heads) if model_type == "falcon"
                             else keys.count("num_key_value_heads", default=heads)),
        "ffn_hidden_size": dense_width,
        "swiglu": gated and act in GATED_ACTIVATIONS, "gated_linear_unit": gated and act not in GATED_ACTIVATIONS,
        "untie_embeddings_and_output_weights": not keys.flag("tie_word_embeddings", default=not gated),
        "normalization": "RMSNorm" if rms else "LayerNorm",
        "position_embedding_type": "rope" if (family.rope or keys.has("rope_theta") or keys.has("rotary_pct"))
        else "learned_absolute",
        "add_bias_linear": bias, "add_qkv_bias": qkv_bias and not bias,
        "qk_layernorm": family.qk_norm or keys.flag("use_qk_norm", default=False),
        "sandwich_norm": family.sandwich_norm,
        "softmax_type": "learnable" if model_type == "gpt_oss" else "vanilla",
        "hidden_dropout": keys.probability("hidden_dropout", "resid_pdrop", "dropout"),
        "attention_dropout": keys.probability("attention_dropout", "attn_pdrop"),
        "kv_channels": keys.count("head_dim", default=0, minimum=0),
        "mtp_num_layers": keys.count("num_nextn_predict_layers", default=0, minimum=0),
        "activation_func_clamp_value": _nonnegative(keys, "swiglu_limit"),
        "attn_logit_softcapping": _nonnegative(keys, "attn_logit_softcapping"),
        **moe, **_mla_fields(keys), **_window_fields(keys, layers),
    }
    try:
        model = TransformerModel(**fields)
    except ValueError as exc:
        raise InputFileError(where, str(exc)) from None
    notes += keys.notes
    if keys.get("final_logit_softcapping", default=0.0):  # Gemma 2's 30.0; null in Gemma 3's files
        notes.append(f"{where}: final_logit_softcapping: the logits' soft-cap (a tanh over every logit, forward and "
                     "backward, and the capped logits kept for the loss) is not priced")
    # a parallel block, x + attn(ln1 x) + mlp(ln2 x) (GPT-NeoX; Falcon's from one layer norm in its first decoder)
    if keys.flag(family.parallel_key, default=family.parallel_default):
        one_norm = model_type == "falcon" and not keys.flag("new_decoder_architecture", default=False)
        notes.append(f"{where}: {family.parallel_key}: attention and MLP read the same input and add into one "
                     "residual; priced as two blocks one after the other (the same weights and matrix products; "
                     "under tensor parallelism the one reduction of their summed outputs is priced as two"
                     + ("; the one layer norm they share as two" if one_norm else "") + ")")
    if model_type == "phimoe":  # Phi-3.5-MoE's biases beyond Megatron-Core's add_qkv_bias
        what = {"attention_bias": "the attention output projection's bias (hidden_size weights a layer; the query, "
                                  "key and value biases are counted)",
                "lm_head_bias": "the output layer's bias (vocab_size weights)"}
        unpriced = [k for k in what if keys.flag(k, default=False)]
        if unpriced:
            notes.append(f"{where}: {', '.join(unpriced)}: {' and '.join(what[k] for k in unpriced)} not counted")
    if model_type == "llama4_text" and fields["qk_layernorm"]:
        notes.append(f"{where}: use_qk_norm: Llama 4's query/key L2 norm (no weights, on the rotary layers) is "
                     f"priced as qk_layernorm on every layer, {2 * model.kv_channels} weights each")
    ignored = sorted(k for k in text if k not in keys.used and k not in HARMLESS and k not in OTHER_TOWERS
                     and k not in ("model_type", "text_config"))
    if nested:
        ignored += sorted(k for k in config if k not in HARMLESS and k not in OTHER_TOWERS
                          and k not in ("model_type", "text_config"))
    stated = {**config, **text}
    expert_keys = [k for k in ignored if _EXPERT_KEY.search(k) and stated.get(k) not in (None, False, 0, [], "")]
    if expert_keys and not model.is_moe:
        raise InputFileError(where, f"keys {', '.join(expert_keys)}: experts stated in keys paraplan does not read "
                             f"for model_type '{model_type}'; read without them it would be priced as a dense model "
                             f"of {model.num_parameters / 1e9:.2f}B parameters, which it is not (the mixture-of-"
                             "experts keys paraplan reads: num_experts / num_local_experts / n_routed_experts, "
                             "num_experts_per_tok, moe_intermediate_size; docs/models.md)")
    return HfModel(model, tuple(ignored), tuple(notes), fields["seq_length"])


_EXPERT_KEY = re.compile(r"(^|_)(moe|experts?)(_|$)")
"""A key that speaks of experts (ERNIE's `moe_num_experts`, `moe_k`): left unread on a model
read as dense, the model is refused rather than priced without its experts."""
