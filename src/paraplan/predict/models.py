"""Named transformer models and Hugging Face `config.json` files as `TransformerModel`s.

Presets (architecture numbers from the papers that introduced them):
- GPT-3 (Brown et al. 2020, Table 2.1): 125M .. 175B, sequence 2,048, GPT-2's
  vocabulary of 50,257 tokens, learned positions, LayerNorm, biases, tied
  embeddings. The 13B model is listed with width 5,140 and 40 heads of 128; it is
  built here with 5,120 (40 x 128), as Megatron-LM and others train it.
- Llama 3 (Dubey et al. 2024, Table 3): 8B, 70B, 405B: grouped-query attention with
  8 key/value heads, SwiGLU, RMSNorm, rotary positions, no biases, untied
  embeddings, vocabulary 128,256, sequence 8,192, no dropout.

- Mixture-of-experts and other current models, their released Hugging Face
  configurations in Megatron's names: Mixtral 8x7B / 8x22B (Jiang et al. 2024),
  Qwen3-30B-A3B / 235B-A22B (Qwen3 technical report), DeepSeek-V3 (DeepSeek-AI 2024:
  MLA, 1 shared + 256 routed experts, top-8, first 3 layers dense, one MTP layer),
  GPT-OSS 20B / 120B (OpenAI 2025: sliding window 128 on every other layer,
  attention sinks, biases), Llama 4 Scout / Maverick (Meta 2025: one shared expert,
  chunked attention of 8,192 tokens on three layers in four), Kimi K2 (Moonshot AI 2025:
  DeepSeek-V3's architecture with 64 heads, 384 experts and one dense layer), each with
  its own router
  (score function, expert bias, scaling factor: a run's defaults). Sequence lengths are
  those of the main pre-training phase (4,096 for DeepSeek-V3, Kimi K2 and Qwen3, 8,192 for
  Llama 4, 4,096 for Mixtral and GPT-OSS).

`load_model(name_or_path)` accepts a preset name, a Hugging Face `config.json`
(read by `paraplan.predict.hf_config`, which names every key it does not model) or a
YAML/JSON mapping with `TransformerModel`'s own field names.
"""

from __future__ import annotations

import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from paraplan.core.errors import ConfigError, InputFileError
from paraplan.core.names import formula_problem
from paraplan.core.transformer import TransformerModel
from paraplan.inputs import read_json_object
from paraplan.predict.hf_config import read_hf_config
from paraplan.typed.files import read_yaml

_GPT3: dict[str, Any] = {"seq_length": 2048, "vocab_size": 50257}
_LLAMA3: dict[str, Any] = {
    "seq_length": 8192, "vocab_size": 128256, "num_query_groups": 8, "swiglu": True,
    "untie_embeddings_and_output_weights": True, "normalization": "RMSNorm",
    "position_embedding_type": "rope", "add_bias_linear": False, "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
}

PRESETS: dict[str, TransformerModel] = {
    name: TransformerModel(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                           **_GPT3)
    for name, layers, hidden, heads in (
        ("gpt3-125m", 12, 768, 12),
        ("gpt3-350m", 24, 1024, 16),
        ("gpt3-760m", 24, 1536, 16),
        ("gpt3-1.3b", 24, 2048, 16),
        ("gpt3-2.7b", 32, 2560, 32),
        ("gpt3-6.7b", 32, 4096, 32),
        ("gpt3-13b", 40, 5120, 40),
        ("gpt3-175b", 96, 12288, 96),
    )
}
PRESETS.update({
    name: TransformerModel(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                           ffn_hidden_size=ffn, **_LLAMA3)
    for name, layers, hidden, heads, ffn in (
        ("llama3-8b", 32, 4096, 32, 14336),
        ("llama3-70b", 80, 8192, 64, 28672),
        ("llama3-405b", 126, 16384, 128, 53248),
    )
})
_MODERN: dict[str, Any] = {
    "swiglu": True, "untie_embeddings_and_output_weights": True, "normalization": "RMSNorm",
    "position_embedding_type": "rope", "add_bias_linear": False, "hidden_dropout": 0.0, "attention_dropout": 0.0,
}
# The MoE presets' own routers (`paraplan.core.moe_router_model`), as their Hugging Face
# files read (`paraplan.predict.hf_router`): DeepSeek-V3 a sigmoid with an expert bias
# (`topk_method noaux_tc`) and weights scaled by 2.5; Llama 4 a sigmoid of the top-1
# logit; Mixtral, Qwen3 (`norm_topk_prob true`) and GPT-OSS a softmax over the k chosen,
# Megatron-Core's default
_DEEPSEEK_V3_ROUTER: dict[str, Any] = {"moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
                                       "moe_router_topk_scaling_factor": 2.5}
_LLAMA4_ROUTER: dict[str, Any] = {"moe_router_score_function": "sigmoid"}
PRESETS.update({
    "mixtral-8x7b": TransformerModel("mixtral-8x7b", 32, 4096, 32, 4096, 32000, num_query_groups=8,
                                     ffn_hidden_size=14336, num_experts=8, moe_router_topk=2, **_MODERN),
    "mixtral-8x22b": TransformerModel("mixtral-8x22b", 56, 6144, 48, 4096, 32768, num_query_groups=8,
                                      ffn_hidden_size=16384, num_experts=8, moe_router_topk=2, **_MODERN),
    "qwen3-30b-a3b": TransformerModel("qwen3-30b-a3b", 48, 2048, 32, 4096, 151936, num_query_groups=4,
                                      kv_channels=128, qk_layernorm=True, ffn_hidden_size=6144, num_experts=128,
                                      moe_router_topk=8, moe_ffn_hidden_size=768, **_MODERN),
    "qwen3-235b-a22b": TransformerModel("qwen3-235b-a22b", 94, 4096, 64, 4096, 151936, num_query_groups=4,
                                        kv_channels=128, qk_layernorm=True, ffn_hidden_size=12288, num_experts=128,
                                        moe_router_topk=8, moe_ffn_hidden_size=1536, **_MODERN),
    "deepseek-v3": TransformerModel("deepseek-v3", 61, 7168, 128, 4096, 129280, ffn_hidden_size=18432,
                                    num_experts=256, moe_router_topk=8, moe_ffn_hidden_size=2048,
                                    moe_shared_expert_intermediate_size=2048, moe_layer_freq=(0,) * 3 + (1,) * 58,
                                    moe_router_num_groups=8, moe_router_group_topk=4, **_DEEPSEEK_V3_ROUTER,
                                    multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128,
                                    qk_pos_emb_head_dim=64, v_head_dim=128, mtp_num_layers=1, **_MODERN),
    "gpt-oss-20b": TransformerModel("gpt-oss-20b", 24, 2880, 64, 4096, 201088, num_query_groups=8, kv_channels=64,
                                    ffn_hidden_size=2880, num_experts=32, moe_router_topk=4, window_size=128,
                                    window_attn_skip_freq=2, softmax_type="learnable", activation_func_clamp_value=7.0,
                                    **{**_MODERN, "add_bias_linear": True}),
    "gpt-oss-120b": TransformerModel("gpt-oss-120b", 36, 2880, 64, 4096, 201088, num_query_groups=8, kv_channels=64,
                                     ffn_hidden_size=2880, num_experts=128, moe_router_topk=4, window_size=128,
                                     window_attn_skip_freq=2, softmax_type="learnable", activation_func_clamp_value=7.0,
                                     **{**_MODERN, "add_bias_linear": True}),
    "llama4-scout": TransformerModel("llama4-scout", 48, 5120, 40, 8192, 202048, num_query_groups=8,
                                     kv_channels=128, qk_layernorm=True, ffn_hidden_size=16384, num_experts=16,
                                     moe_router_topk=1, moe_ffn_hidden_size=8192, **_LLAMA4_ROUTER,
                                     moe_shared_expert_intermediate_size=8192, window_size=8192,
                                     window_attn_skip_freq=4, chunked_attention=True, **_MODERN),
    "llama4-maverick": TransformerModel("llama4-maverick", 48, 5120, 40, 8192, 202048, num_query_groups=8,
                                        kv_channels=128, qk_layernorm=True, ffn_hidden_size=16384, num_experts=128,
                                        moe_router_topk=1, moe_ffn_hidden_size=8192, **_LLAMA4_ROUTER,
                                        moe_shared_expert_intermediate_size=8192,
                                        moe_layer_freq=tuple(i % 2 for i in range(48)),  # HF: layers 1, 3, ..
                                        window_size=8192, window_attn_skip_freq=4, chunked_attention=True,
                                        **_MODERN),
})
# Moonshot's Kimi K2 (arXiv 2507.20534; moonshotai/Kimi-K2-Base config.json): DeepSeek-V3's
# architecture with 64 heads, 384 routed experts, one dense layer before them, no routing
# groups (n_group 1), scaling 2.827, no multi-token prediction, a 163,840-token vocabulary
PRESETS["kimi-k2"] = replace(PRESETS["deepseek-v3"], name="kimi-k2", num_attention_heads=64, kv_channels=0,
                             vocab_size=163840, num_experts=384, moe_layer_freq=(0,) + (1,) * 60,
                             moe_router_num_groups=0, moe_router_group_topk=0,
                             moe_router_topk_scaling_factor=2.827, mtp_num_layers=0)
_FIELDS = {f.name for f in fields(TransformerModel)}


def from_hf_config(config: object, name: str, source: str = "<config.json>") -> TransformerModel:
    """A `TransformerModel` from a Hugging Face `config.json` mapping
    (`paraplan.predict.hf_config.read_hf_config`, whose warnings this drops)."""
    return read_hf_config(config, name, source).model


def from_mapping(data: dict, name: str, source: str) -> TransformerModel:
    """A `TransformerModel` from a mapping with its own field names."""
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise InputFileError(source, f"unknown key '{unknown[0]}'; expected {', '.join(sorted(_FIELDS))}")
    try:
        return TransformerModel(**{"name": name, **data})
    except (TypeError, ValueError) as exc:
        raise InputFileError(source, str(exc)) from None


def load_model(name_or_path: str, seq_length: int | None = None, prog: str = "paraplan",
               said: list[str] | None = None) -> TransformerModel:
    """A preset by name, or a model file (see the module doc), trained at `seq_length`
    tokens (default: the preset's, or a Hugging Face file's `max_position_embeddings`,
    said in a warning). What a Hugging Face file holds that paraplan does not model is
    printed as warnings on stderr, each also appended to `said` when given."""

    def warn(message: str) -> None:
        print(f"{prog}: warning: {message}", file=sys.stderr)
        if said is not None:
            said.append(f"warning: {message}")

    if name_or_path in PRESETS:
        if Path(name_or_path).exists():
            warn(f"'{name_or_path}' is a preset, which is used; the file or folder of that name is not read (name it "
                 f"./{name_or_path} to read it)")
        return with_seq_length(PRESETS[name_or_path], seq_length)
    path = Path(name_or_path)
    if path.is_dir() and (path / "config.json").is_file():  # a Hugging Face model folder
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError("model", f"'{name_or_path}' is neither a preset ({', '.join(PRESETS)}) nor a file "
                                   "(or a folder holding a config.json)")
    expected = "a model description (a Hugging Face config.json or TransformerModel fields)"
    data = read_json_object(path, expected) if path.suffix == ".json" else read_yaml(path, expected)
    if not isinstance(data, dict):  # a YAML read of e.g. a run table or plan CSV named as the model
        raise InputFileError(path, f"expected {expected} (a YAML mapping), got a YAML {type(data).__name__}")
    name = path.parent.name if path.name == "config.json" else path.stem
    problem = formula_problem(name)
    if problem:  # the name is written into plan CSVs
        raise InputFileError(path, f"the model's name (from the file or folder name): {problem}")
    if isinstance(data, dict) and _FIELDS.intersection(data) and "hidden_size" in data and "num_layers" in data:
        return with_seq_length(from_mapping(data, name, str(path)), seq_length)
    read = read_hf_config(data, name, str(path))
    for note in read.notes:
        warn(note)
    if read.ignored:
        warn(f"{path}: ignored (not modelled): {', '.join(read.ignored)}")
    if not seq_length:
        warn(f"{path}: no sequence length given; using max_position_embeddings {read.max_position_embeddings:,} "
             "(pass --seq-length to train at another length)")
    elif seq_length > read.max_position_embeddings:
        warn(f"{path}: sequence length {seq_length:,} is beyond the model's max_position_embeddings "
             f"{read.max_position_embeddings:,}; priced as asked (the positions' extension, e.g. YaRN or a "
             "rope_scaling change, costs nothing paraplan counts)")
    return with_seq_length(read.model, seq_length)


def with_seq_length(model: TransformerModel, seq_length: int | None) -> TransformerModel:
    """`model` at `seq_length` tokens (None or 0: its own); a length the model refuses
    (above `paraplan.core.transformer.MAX_WIDTH`) is a `ConfigError` on `seq_length`."""
    try:
        return model if not seq_length else replace(model, seq_length=seq_length)
    except ValueError as exc:  # y1-hostile: was a traceback (seq_length 2**40 on a preset)
        raise ConfigError("seq_length", str(exc).replace(f"model '{model.name}': seq_length ", "")) from None
