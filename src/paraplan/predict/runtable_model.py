"""The model of a run-table row: either its dimension columns (`num_layers`,
`hidden_size`, ... in Megatron-LM's names) or a `model` column naming a preset
(`paraplan.predict.models.PRESETS`) or a model file (a Hugging Face `config.json` or a
YAML/JSON mapping of `TransformerModel` fields), a path relative to the table's folder.

With `model`, the dimension columns must be empty (or absent): one row, one source of
its architecture. `seq_length` stays a run setting: it overrides the preset's (or the
file's) training length; a Hugging Face file without it trains at its
`max_position_embeddings`, said in a warning. So does `mtp_num_layers` (Megatron-LM's
`--mtp-num-layers`, a training argument): how many multi-token-prediction layers the run
trains, in place of the model's own count (0: a framework that trains none, as NeMo
AutoModel's DeepSeek-V3 does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from paraplan.core.errors import ConfigError, InputFileError
from paraplan.core.transformer import TransformerModel

DIMENSIONS: tuple[str, ...] = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")
EXTENSION_COLUMNS: tuple[str, ...] = (
    "kv_channels", "add_qkv_bias", "qk_layernorm", "sandwich_norm", "softmax_type", "gated_linear_unit",
    "window_size",
    "window_attn_skip_freq", "chunked_attention", "num_experts", "moe_router_topk", "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size", "moe_layer_freq", "moe_router_num_groups", "moe_router_group_topk",
    "multi_latent_attention", "q_lora_rank",
    "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "mtp_num_layers",
    "make_vocab_size_divisible_by",
)


RUN_MODEL_COLUMNS: tuple[str, ...] = ("mtp_num_layers",)
"""Model columns a row may give beside a `model` cell: what the run trains of it (module doc)."""


class ModelCache:
    """Models named by `model` cells, loaded once per table (a file's warnings once)."""

    def __init__(self, loader: Callable[[str, int | None], TransformerModel]) -> None:
        self._loader = loader
        self._models: dict[tuple[str, int | None], TransformerModel] = {}

    def get(self, table: Path, line: int, spec: str, seq_length: int | None) -> TransformerModel:
        from paraplan.predict.models import PRESETS

        target = spec if spec in PRESETS else str(table.parent / spec)
        if spec not in PRESETS and target in PRESETS:  # ./deepseek-v3 beside the table: the folder, not the preset
            target = f"./{target}"
        key = (target, seq_length)
        if key not in self._models:
            if spec not in PRESETS and not (Path(target).is_file() or (Path(target) / "config.json").is_file()):
                raise InputFileError(table, f"'{spec}' is neither a preset ({', '.join(PRESETS)}) nor a file "
                                     f"(looked for {target})", line=line, field="column 'model'")
            try:
                self._models[key] = self._loader(target, seq_length)
            except ConfigError as exc:
                if exc.key == "seq_length":  # y1-hostile: the length the row asks of its model
                    raise InputFileError(table, exc.reason, line=line,
                                         field="column 'seq_length'") from None
                raise InputFileError(table, str(exc), line=line, field="column 'model'") from None
            except InputFileError as exc:
                raise InputFileError(table, str(exc), line=line, field="column 'model'") from None
        return self._models[key]


def row_model(table: Path, line: int, name: str, values: dict[str, object], model_columns: tuple[str, ...],
              cache: ModelCache, expected_count: str) -> TransformerModel:
    """The row's model from its `model` cell or its dimension columns (module doc);
    `values` are the row's parsed non-empty cells."""
    spec = str(values.get("model", "")).strip()
    if spec:
        conflict = [c for c in (*DIMENSIONS[:3], DIMENSIONS[4], *model_columns)
                    if c in values and c not in RUN_MODEL_COLUMNS]
        if conflict:
            raise InputFileError(table, f"a row with a model ('{spec}') takes its architecture from it; column "
                                 f"'{conflict[0]}' must be empty (or give the dimensions without a model)",
                                 line=line)
        seq = values.get("seq_length")
        model = cache.get(table, line, spec, int(seq) if seq is not None else None)  # type: ignore[call-overload]
        trained = {c: values[c] for c in RUN_MODEL_COLUMNS if c in values}  # what the run trains (module doc)
        return replace(model, **trained) if trained else model  # type: ignore[arg-type]
    for column in DIMENSIONS:
        if column not in values:
            raise InputFileError(table, f"expected {expected_count}, got an empty cell (or a model column naming "
                                 "a preset or a model file)", line=line, field=f"column '{column}'")
    args = {k: values[k] for k in (*DIMENSIONS, *model_columns) if k in values}
    try:
        return TransformerModel(name=name, **args)  # type: ignore[arg-type]
    except ValueError as exc:
        raise InputFileError(table, str(exc).replace(f"model '{name}': ", ""), line=line) from None
