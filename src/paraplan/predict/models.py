"""Named transformer models and Hugging Face `config.json` files as `TransformerModel`s.

Presets (architecture numbers from the papers that introduced them):
- GPT-3 (Brown et al. 2020, Table 2.1): 125M .. 175B, sequence 2,048, GPT-2's
  vocabulary of 50,257 tokens, learned positions, LayerNorm, biases, tied
  embeddings. The 13B model is listed with width 5,140 and 40 heads of 128; it is
  built here with 5,120 (40 x 128), as Megatron-LM and others train it.
- Llama 3 (Dubey et al. 2024, Table 3): 8B, 70B, 405B: grouped-query attention with
  8 key/value heads, SwiGLU, RMSNorm, rotary positions, no biases, untied
  embeddings, vocabulary 128,256, sequence 8,192, no dropout.

`load_model(name_or_path)` accepts a preset name, a Hugging Face `config.json`
(Llama/Mistral/Qwen2-style or GPT-2/GPT-NeoX/OPT-style keys) or a YAML/JSON
mapping with `TransformerModel`'s own field names.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from paraplan.core.errors import ConfigError, InputFileError
from paraplan.core.names import formula_problem
from paraplan.core.transformer import TransformerModel
from paraplan.inputs import read_json_object
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
_FIELDS = {f.name for f in fields(TransformerModel)}


def _first(config: dict, source: str, *keys: str, default: object = None) -> Any:
    for key in keys:
        if key in config and config[key] is not None:
            return config[key]
    if default is not None:
        return default
    raise InputFileError(source, f"missing key; expected one of {', '.join(keys)}")


def _positive_int(value: object, source: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputFileError(source, f"key '{key}': expected an integer >= 1, got {value!r}")
    return value


def _flag(value: object, source: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise InputFileError(source, f"key '{key}': expected true or false, got {value!r}")
    return value


def _text(value: object, source: str, key: str) -> str:
    if not isinstance(value, str):
        raise InputFileError(source, f"key '{key}': expected the activation's name as text (gelu, silu, ...), "
                             f"got {value!r}")
    return value


def _probability(value: object, source: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise InputFileError(source, f"key '{key}': expected a probability in [0, 1), got {value!r}")
    return float(value)


def from_hf_config(config: object, name: str, source: str = "<config.json>") -> TransformerModel:
    """A `TransformerModel` from a Hugging Face `config.json` mapping."""
    if not isinstance(config, dict):
        raise InputFileError(source, "expected a JSON object")
    get = lambda *keys, default=None: _first(config, source, *keys, default=default)  # noqa: E731
    layers = _positive_int(get("num_hidden_layers", "n_layer", "num_layers"), source, "num_hidden_layers")
    hidden = _positive_int(get("hidden_size", "n_embd", "d_model"), source, "hidden_size")
    heads = _positive_int(get("num_attention_heads", "n_head"), source, "num_attention_heads")
    vocab = _positive_int(get("vocab_size"), source, "vocab_size")
    seq = _positive_int(get("max_position_embeddings", "n_positions", "n_ctx", "seq_length"), source,
                        "max_position_embeddings")
    groups = _positive_int(get("num_key_value_heads", default=heads), source, "num_key_value_heads")
    act_key = next((k for k in ("hidden_act", "activation_function", "activation") if config.get(k) is not None),
                   "hidden_act")
    act = _text(config.get(act_key, "gelu"), source, act_key).lower()
    gated = act in ("silu", "swiglu", "swish")
    ffn = _positive_int(get("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden), source,
                        "intermediate_size")
    model_type = str(config.get("model_type", "")).lower()
    rope = "rope_theta" in config or "rotary_pct" in config or model_type in (
        "llama", "mistral", "mixtral", "qwen2", "gemma", "gpt_neox")
    rms = "rms_norm_eps" in config
    bias = _flag(config.get("attention_bias", config.get("mlp_bias", not rms)), source, "attention_bias")
    dropout = _probability(get("hidden_dropout", "resid_pdrop", "dropout", default=0.0), source, "hidden_dropout")
    attn_dropout = _probability(get("attention_dropout", "attn_pdrop", default=0.0), source, "attention_dropout")
    tied = _flag(config.get("tie_word_embeddings", not gated), source, "tie_word_embeddings")
    try:
        return TransformerModel(
            name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads, seq_length=seq,
            vocab_size=vocab, num_query_groups=groups, ffn_hidden_size=ffn, swiglu=gated,
            untie_embeddings_and_output_weights=not tied,
            normalization="RMSNorm" if rms else "LayerNorm",
            position_embedding_type="rope" if rope else "learned_absolute", add_bias_linear=bias,
            hidden_dropout=dropout, attention_dropout=attn_dropout,
        )
    except ValueError as exc:
        raise InputFileError(source, str(exc)) from None


def from_mapping(data: dict, name: str, source: str) -> TransformerModel:
    """A `TransformerModel` from a mapping with its own field names."""
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise InputFileError(source, f"unknown key '{unknown[0]}'; expected {', '.join(sorted(_FIELDS))}")
    try:
        return TransformerModel(**{"name": name, **data})
    except (TypeError, ValueError) as exc:
        raise InputFileError(source, str(exc)) from None


def load_model(name_or_path: str) -> TransformerModel:
    """A preset by name, or a model file (see the module doc)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError("model", f"'{name_or_path}' is neither a preset ({', '.join(PRESETS)}) nor a file")
    expected = "a model description (a Hugging Face config.json or TransformerModel fields)"
    data = read_json_object(path, expected) if path.suffix == ".json" else read_yaml(path, expected)
    name = path.parent.name if path.name == "config.json" else path.stem
    problem = formula_problem(name)
    if problem:  # the name is written into plan CSVs
        raise InputFileError(path, f"the model's name (from the file or folder name): {problem}")
    if isinstance(data, dict) and _FIELDS.intersection(data) and "hidden_size" in data and "num_layers" in data:
        return from_mapping(data, name, str(path))
    return from_hf_config(data, name, str(path))


def with_seq_length(model: TransformerModel, seq_length: int | None) -> TransformerModel:
    return model if not seq_length else replace(model, seq_length=seq_length)
