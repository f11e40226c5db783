"""The run table: one training run per row, columns named as Megatron-LM's
arguments. `paraplan predict` reads it and writes it back with `predicted_*`
columns; `paraplan calibrate` reads it with `measured_iteration_s`.

Required columns: `REQUIRED`, or, with a `model` column naming a preset or a model
file, `REQUIRED_SETTINGS` (`paraplan.predict.runtable_model`). Optional: `MODEL_COLUMNS`,
`SETTINGS_COLUMNS`,
`num_gpus` (checked against t x c x p x d), `measured_iteration_s`. An empty cell
takes the default; an empty `micro_batch_size` or
`virtual_pipeline_model_parallel_size` means "the fastest that fits" (a missing
`micro_batch_size` column too; a missing virtual-pipeline column means 1; a searched
v that does not divide the layers over the stages gets Megatron's uneven first/last
stages, `paraplan.core.pipeline_split.interleaved_uneven_split`, unless the row sets
them or counts the embedding / loss as layers, `account_for_embedding_in_pipeline_split`
/ `account_for_loss_in_pipeline_split`; a `pipeline_model_parallel_layout` fixes v to
its virtual stages / p). An empty
`use_flash_attn` means flash attention for bf16 and fp8 runs (Megatron Core with
Transformer Engine) and the unfused softmax path for fp16 and fp32 runs (what
Megatron-LM and Megatron-DeepSpeed ran before flash attention), unless
`attention_backend` (Megatron-LM's `--attention-backend`: flash, fused, unfused, local,
auto; empty: auto) names a kernel: flash and fused are fused, unfused and local are
not (`flash_attention_version`, Megatron-LM's `--flash-attention-version` 2, 3 or 4,
pins FlashAttention's generation). Which kernel each backend runs on which device, and its measured ceilings:
`paraplan.kernels.attention_backends`. `elementwise_kernels` (fused, the default, or
eager: torchtitan without `training.compile`) says how the norms, rotary embedding,
activation and residual adds run (`paraplan.predict.eager_ops`); `selective_ac_option op`
with `recompute_granularity selective` is torchtitan's per-op recomputation
(`paraplan.predict.torchtitan_ac`); `cross_entropy_impl` (megatron, the default, or
torch: torchtitan's `F.cross_entropy` on fp32 logits) says which code computes the loss
(`paraplan.predict.loss_ops`); `use_torch_fsdp2` (with zero_stage 3) and
`optimizer_impl` (fused, the default, or foreach) price PyTorch FSDP2's own copies and
torch.optim's foreach AdamW (`paraplan.predict.fsdp2_passes`), `fsdp_param_dtype` (fp32,
the default, or bf16) the dtype its shards, their gradients and moments are kept in.

Every cell is checked once here: an error names the file, the line, the column,
the value and what was expected. A `name` is free text of at most
`paraplan.core.names.MAX_NAME_CHARS` characters that does not start with `=`, `+`, `-`
or `@` (predict writes it back into a CSV, where a spreadsheet would run it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from paraplan.core.errors import InputFileError, StrategyError
from paraplan.core.limits import MAX_NUM_MICROBATCHES, MAX_SIMULATED_OPS, MICROBATCHES_WHY
from paraplan.core.moe_router_model import model_router_defaults
from paraplan.core.moe_router_settings import LOAD_BALANCING_TYPES, ROUTER_COLUMNS, ROUTER_DTYPES, SCORE_FUNCTIONS
from paraplan.core.names import MAX_NAME_CHARS, formula_problem
from paraplan.core.pipeline_layout import LayoutError, parse_layout
from paraplan.core.precision_settings import (
    LOW_PRECISION_COLUMNS,
    MAIN_GRADS_DTYPES,
    MAIN_PARAMS_DTYPES,
    STATE_DTYPES,
)
from paraplan.core.run_settings import (
    ATTENTION_BACKENDS,
    CP_COMM_TYPES,
    CROSS_ENTROPY_IMPLS,
    DDP_IMPLS,
    DTYPES,
    ELEMENTWISE_KERNELS,
    FLEX_DISPATCHER_BACKENDS,
    FP8_RECIPE_CHOICES,
    FSDP_PARAM_DTYPES,
    FUSED_ATTENTION_BACKENDS,
    MOE_DISPATCHERS,
    OPTIMIZER_IMPLS,
    PIPELINE_SCHEDULES,
    RECOMPUTE_GRANULARITIES,
    RECOMPUTE_METHODS,
    RECOMPUTE_MODULES,
    UNFUSED_ATTENTION_BACKENDS,
    RunSettings,
)
from paraplan.core.sharding import (
    GRAD_REDUCE,
    RESHARD_AFTER_FORWARD,
    SHARDING_STRATEGY_STAGE,
    stage_of_sharding_strategy,
)
from paraplan.core.transformer import NORMALIZATIONS, POSITION_EMBEDDINGS, TransformerModel
from paraplan.core.transformer_blocks import SOFTMAX_TYPES
from paraplan.inputs import NumberRule, csv_records, iter_text_lines, shown
from paraplan.predict.peak_memory import PEAK_MEMORY_COLUMNS, RETIRED_COLUMNS
from paraplan.predict.runtable_model import EXTENSION_COLUMNS, ModelCache, row_model

REQUIRED: tuple[str, ...] = (
    "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size", "global_batch_size",
)
"""The model's dimensions (unless a `model` column names it) and the parallel layout."""
REQUIRED_SETTINGS: tuple[str, ...] = REQUIRED[5:]
MODEL_COLUMNS: tuple[str, ...] = (
    "num_query_groups", "ffn_hidden_size", "swiglu", "untie_embeddings_and_output_weights", "normalization",
    "position_embedding_type", "add_bias_linear", "hidden_dropout", "attention_dropout", *EXTENSION_COLUMNS,
)
SETTINGS_COLUMNS: tuple[str, ...] = (
    "micro_batch_size", "virtual_pipeline_model_parallel_size", "recompute_granularity", "recompute_method",
    "recompute_num_layers", "recompute_modules",
    "sequence_parallel",
    "use_distributed_optimizer", "zero_stage", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
    "dtype", "schedule", "use_flash_attn", "attention_backend", "flash_attention_version",
    "elementwise_kernels", "selective_ac_option", "cross_entropy_impl",
    "async_tensor_model_parallel_allreduce",
    "gradient_accumulation_fusion", "grad_reduce_in_bf16", "DDP_impl", "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers", "context_parallel_size", "cp_comm_type", "expert_model_parallel_size",
    "expert_tensor_parallel_size", "moe_load_imbalance", "moe_expert_capacity_factor",
    "moe_pad_expert_input_to_capacity", "moe_shared_expert_overlap",
    "overlap_moe_expert_parallel_comm", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
    "moe_flex_dispatcher_num_sms", "account_for_embedding_in_pipeline_split",
    "overlap_p2p_comm", "scatter_gather_tensors_in_pipeline", "batch_p2p_sync",
    "account_for_loss_in_pipeline_split", "pipeline_model_parallel_layout", "fp8_recipe",
    # sharded data parallelism (`paraplan.core.sharding`, docs/fsdp.md)
    "data_parallel_shard_degree", "data_parallel_replicate_degree", "num_distributed_optimizer_instances",
    "use_torch_fsdp2", "optimizer_impl", "fsdp_param_dtype",  # u3-fsdp2: FSDP2's own passes (`fsdp_ops`)
    "fsdp_reshard_after_forward", "data_parallel_sharding_strategy", "sharded_grad_reduce",
    # torchao Float8 (torchtitan's `--float8.*`, docs/fp8.md)
    "enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
    *ROUTER_COLUMNS,  # v6-router: the MoE router (`paraplan.predict.moe_router`, docs/moe.md)
    *LOW_PRECISION_COLUMNS,  # w1-precopt: low-precision storage (docs/fp8.md)
)
PREDICTED: tuple[str, ...] = (
    "num_parameters", "active_parameters",
    "predicted_iteration_s", "predicted_tflops_per_gpu", "predicted_mfu", "predicted_peak_memory_bytes",
    *PEAK_MEMORY_COLUMNS, "bubble_fraction", "fits_memory", "chosen", "calibration", "plausibility",
)
OTHER: tuple[str, ...] = ("name", "model", "num_gpus", "measured_iteration_s")
# z6-plansearch: a `paraplan plan --model` CSV is a run table; its own columns are read and dropped
PLAN_ONLY_COLUMNS: tuple[str, ...] = (
    "rank", "predicted_tokens_per_s", "dp_no_overlap_s", "dp_overlap_s", "dp_zero1_s", "dp_zero2_s", "dp_zero3_s",
    "search_s")
"""`paraplan plan`'s columns that are not a run's (`paraplan.plan.transformer.output.PLAN_COLUMNS`)."""
KNOWN: tuple[str, ...] = (*OTHER[:2], *REQUIRED, *MODEL_COLUMNS, *SETTINGS_COLUMNS, *OTHER[2:], *PREDICTED,
                          *RETIRED_COLUMNS, *PLAN_ONLY_COLUMNS)
MAX_FIELD_CHARS = 256
MAX_ROWS = 1_000_000

_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f"}


@dataclass(frozen=True)
class RunRow:
    """One row, parsed and checked."""

    line: int  # line in the file (the header is line 1)
    name: str
    model: TransformerModel
    settings: RunSettings  # micro_batch_size / v are 1 where they are searched
    search_micro_batch_size: bool
    search_virtual_stages: bool
    measured_iteration_s: float | None
    cells: dict[str, str]  # the row as read (written back with the predictions)


def question_label(row: RunRow) -> str:
    """Runs with the same label answer the same question (model, GPU count, global
    batch) with different parallel settings."""
    m, s = row.model, row.settings
    arch = (m.num_layers, m.hidden_size, m.num_attention_heads, m.query_groups, m.ffn_size, m.seq_length,
            m.vocab_size, m.swiglu)
    extensions = tuple(getattr(m, k) for k in EXTENSION_COLUMNS if getattr(m, k) != getattr(_PLAIN, k))
    return f"{arch}{extensions or ''}|gpus={s.num_gpus}|gbs={s.global_batch_size}|dtype={s.dtype}"


_PLAIN = TransformerModel("plain", num_layers=1, hidden_size=1, num_attention_heads=1, seq_length=1, vocab_size=1)


COUNT_RULE = NumberRule("a whole number", 1, 2**40, integer=True)
SIZE_RULE = NumberRule("a whole number (0: none)", 0, 2**40, integer=True)
SECONDS_RULE = NumberRule("a time in seconds", 0, 1e7, low_inclusive=False, why="a training iteration takes "
                      "between 0 and 1e7 s (four months)")
_FRACTION = NumberRule("a probability", 0, 1)
_IMBALANCE = NumberRule("a load-imbalance factor (the busiest rank's tokens over the mean)", 1, 64)
_CAPACITY = NumberRule("a capacity factor (0: dropless)", 0, 64)
_COEFF = NumberRule("a loss coefficient or scaling factor (0: none)", 0, 1e6)  # v6-router


def _integer(text: str) -> int:
    return int(COUNT_RULE.parse(text))


def _boolean(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("true or false")


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError(f"one of {', '.join(options)}")
        return text

    return parse


def _fraction(text: str) -> float:
    value = float(_FRACTION.parse(text))
    if value >= 1:
        raise ValueError(f"expected a probability in [0, 1), got {shown(text)}")
    return value


def _modules(text: str) -> tuple[str, ...]:
    """Megatron-Core's `--recompute-modules`: names separated by spaces."""
    names = tuple(text.split())
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if unknown:
        raise ValueError(f"expected module names among {', '.join(RECOMPUTE_MODULES)} separated by spaces, got "
                         f"{shown(unknown[0])}")
    return names


def _layout(text: str) -> str:
    """Megatron-Core's `--pipeline-model-parallel-layout` (`paraplan.core.pipeline_layout`):
    its syntax is checked here, its fit to the model and pipeline by `RunSettings.check`."""
    return parse_layout(text).text


def _size(text: str) -> int:
    return int(SIZE_RULE.parse(text))


MIN_ITERATION_S = 1e-6
"""y1-hostile: the shortest measured iteration taken (a CUDA kernel launch alone takes a
few microseconds; 1e-30 s passed and gave a cross-validated MAPE of 1.9e32 %)."""


def _seconds(text: str) -> float:
    value = float(SECONDS_RULE.parse(text))
    if value < MIN_ITERATION_S:
        raise ValueError(f"expected a time in seconds of at least {MIN_ITERATION_S:g} (one kernel launch takes a few "
                         f"microseconds), got {shown(text)}")
    return value


_PARSERS: dict[str, Callable[[str], object]] = {
    **{k: _integer for k in REQUIRED},
    "num_query_groups": _integer, "ffn_hidden_size": _integer, "swiglu": _boolean,
    "untie_embeddings_and_output_weights": _boolean, "normalization": _choice(NORMALIZATIONS),
    "position_embedding_type": _choice(POSITION_EMBEDDINGS), "add_bias_linear": _boolean,
    "hidden_dropout": _fraction, "attention_dropout": _fraction,
    **{k: _size for k in ("kv_channels", "window_size", "window_attn_skip_freq", "num_experts", "moe_router_topk",
                          "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_layer_freq",
                          "moe_router_num_groups", "moe_router_group_topk",
                          "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
                          "mtp_num_layers", "make_vocab_size_divisible_by")},
    **{k: _boolean for k in ("add_qkv_bias", "qk_layernorm", "sandwich_norm", "gated_linear_unit",
                             "multi_latent_attention",
                             "chunked_attention")},
    "softmax_type": _choice(SOFTMAX_TYPES), "model": str,
    "micro_batch_size": _integer, "virtual_pipeline_model_parallel_size": _integer,
    "recompute_granularity": _choice(RECOMPUTE_GRANULARITIES), "recompute_modules": _modules,
    "recompute_method": _choice(RECOMPUTE_METHODS), "recompute_num_layers": _integer,
    "sequence_parallel": _boolean,
    "use_distributed_optimizer": _boolean, "zero_stage": _choice(("0", "1", "2", "3")),
    "overlap_grad_reduce": _boolean, "overlap_param_gather": _boolean, "tp_comm_overlap": _boolean,
    "dtype": _choice(DTYPES), "schedule": _choice(PIPELINE_SCHEDULES), "use_flash_attn": _boolean,
    "attention_backend": _choice(ATTENTION_BACKENDS), "flash_attention_version": _choice(("2", "3", "4")),
    "elementwise_kernels": _choice(ELEMENTWISE_KERNELS), "selective_ac_option": _choice(("op",)),
    "cross_entropy_impl": _choice(CROSS_ENTROPY_IMPLS),
    "use_torch_fsdp2": _boolean, "optimizer_impl": _choice(OPTIMIZER_IMPLS),  # u3-fsdp2
    "fsdp_param_dtype": _choice(FSDP_PARAM_DTYPES),
    "async_tensor_model_parallel_allreduce": _boolean, "gradient_accumulation_fusion": _boolean,
    "grad_reduce_in_bf16": _boolean,
    "DDP_impl": _choice(DDP_IMPLS), "decoder_first_pipeline_num_layers": _integer,
    "decoder_last_pipeline_num_layers": _integer, "context_parallel_size": _integer,
    "cp_comm_type": _choice(CP_COMM_TYPES),
    "expert_model_parallel_size": _integer, "expert_tensor_parallel_size": _integer,
    "moe_load_imbalance": lambda text: float(_IMBALANCE.parse(text)),
    "moe_expert_capacity_factor": lambda text: float(_CAPACITY.parse(text)),
    "moe_pad_expert_input_to_capacity": _boolean, "moe_shared_expert_overlap": _boolean,
    "overlap_moe_expert_parallel_comm": _boolean, "moe_token_dispatcher_type": _choice(MOE_DISPATCHERS),
    "moe_flex_dispatcher_backend": _choice(FLEX_DISPATCHER_BACKENDS), "moe_flex_dispatcher_num_sms": _integer,
    "overlap_p2p_comm": _boolean, "scatter_gather_tensors_in_pipeline": _boolean, "batch_p2p_sync": _boolean,
    # v6-router: the MoE router's settings (`paraplan.core.moe_router_settings`)
    "moe_router_load_balancing_type": _choice(LOAD_BALANCING_TYPES),
    **{k: lambda text: float(_COEFF.parse(text)) for k in ("moe_aux_loss_coeff", "moe_z_loss_coeff",
                                                           "moe_router_topk_scaling_factor")},
    **{k: _boolean for k in ("moe_router_force_load_balancing", "moe_router_enable_expert_bias",
                             "moe_router_pre_softmax", "moe_router_fusion", "fake_balanced_gate")},
    "moe_router_score_function": _choice(SCORE_FUNCTIONS), "moe_router_dtype": _choice(ROUTER_DTYPES),
    "account_for_embedding_in_pipeline_split": _boolean, "account_for_loss_in_pipeline_split": _boolean,
    "pipeline_model_parallel_layout": _layout, "fp8_recipe": _choice(FP8_RECIPE_CHOICES),
    "enable_fsdp_float8_all_gather": _boolean, "precompute_float8_dynamic_scale_for_fsdp": _boolean,
    "data_parallel_shard_degree": _integer, "data_parallel_replicate_degree": _integer,
    "num_distributed_optimizer_instances": _integer, "fsdp_reshard_after_forward": _choice(RESHARD_AFTER_FORWARD),
    "data_parallel_sharding_strategy": _choice(tuple(SHARDING_STRATEGY_STAGE)),
    "sharded_grad_reduce": _choice(GRAD_REDUCE),
    # w1-precopt: low-precision storage (`paraplan.core.precision_settings`)
    "use_precision_aware_optimizer": _boolean, "main_grads_dtype": _choice(MAIN_GRADS_DTYPES),
    "main_params_dtype": _choice(MAIN_PARAMS_DTYPES), "exp_avg_dtype": _choice(STATE_DTYPES),
    "exp_avg_sq_dtype": _choice(STATE_DTYPES), "activation_func_fp8_input_store": _boolean,
    "num_gpus": _integer, "measured_iteration_s": _seconds,
}
_EXPECTED = {k: COUNT_RULE.expected for k in REQUIRED}


def _cell(path: Path, line: int, column: str, text: str) -> object:
    try:
        return _PARSERS[column](text)
    except ValueError as exc:
        message = (str(exc) if str(exc).startswith("expected ") or isinstance(exc, LayoutError)
                   else f"expected {exc}, got {shown(text)}")
        raise InputFileError(path, message, line=line, field=f"column '{column}'") from None


def default_flash_attention(dtype: str, attention_backend: str = "auto") -> bool:
    """Empty `use_flash_attn`: what a named `attention_backend` runs (fused for flash and
    fused, unfused for unfused and local); with `auto`, flash for bf16/fp8 runs and
    unfused for fp16/fp32 (module doc)."""
    if attention_backend in FUSED_ATTENTION_BACKENDS:
        return True
    if attention_backend in UNFUSED_ATTENTION_BACKENDS:
        return False
    return dtype in ("bf16", "fp8")


def _load_model(spec: str, seq_length: int | None) -> TransformerModel:
    from paraplan.predict.models import load_model

    return load_model(spec, seq_length, prog="paraplan predict")


def parse_row(path: Path, line: int, cells: dict[str, str], has_columns: set[str],
              models: ModelCache | None = None) -> RunRow:
    """One run-table row: its cells parsed, its model and settings built and checked."""
    values = _row_values(path, line, cells)
    explicit = cells.get("name", "").strip()
    model = row_model(path, line, explicit or f"run{line - 1}", values, MODEL_COLUMNS,
                      models or ModelCache(_load_model), COUNT_RULE.expected)
    name = explicit or (model.name if values.get("model") else f"run{line - 1}")
    _check_name(path, line, name)
    search_mbs = "micro_batch_size" not in values
    layout = values.get("pipeline_model_parallel_layout")
    if layout and "virtual_pipeline_model_parallel_size" not in values:
        # the layout fixes v (its stages / p; `RunSettings.check` refuses a remainder)
        values["virtual_pipeline_model_parallel_size"] = max(
            len(parse_layout(str(layout)).stages) // int(values["pipeline_model_parallel_size"]), 1)  # type: ignore[call-overload]
    search_v = ("virtual_pipeline_model_parallel_size" in has_columns  # a one-chunk schedule named: v 1
                and "virtual_pipeline_model_parallel_size" not in values
                and str(values.get("schedule") or "interleaved_1f1b") == "interleaved_1f1b")
    # q10-router: the router columns the row leaves empty are the model's own (`moe_router_model`)
    settings = _row_settings(path, line, {**model_router_defaults(model, values), **values})
    _check_num_gpus(path, line, values.get("num_gpus"), settings)
    try:
        probe = settings
        if search_mbs or search_v:
            probe = replace(settings, micro_batch_size=1 if search_mbs else settings.micro_batch_size,
                            virtual_pipeline_model_parallel_size=1 if search_v
                            else settings.virtual_pipeline_model_parallel_size,
                            schedule="" if search_v else settings.schedule)
        probe.check(model)
    except StrategyError as exc:
        raise InputFileError(path, f"impossible run: {exc}", line=line) from None
    measured = values.get("measured_iteration_s")
    return RunRow(line, name, model, settings, search_mbs, search_v,
                  float(measured) if measured is not None else None, dict(cells))  # type: ignore[arg-type]


def _row_values(path: Path, line: int, cells: dict[str, str]) -> dict[str, object]:
    """The non-empty cells of known columns, parsed; the required settings present."""
    values: dict[str, object] = {}
    for column, text in cells.items():
        text = text.strip()
        if column in _PARSERS and text:
            values[column] = _cell(path, line, column, text)
    for column in REQUIRED_SETTINGS:
        if column not in values:
            raise InputFileError(path, f"expected {_EXPECTED[column]}, got an empty cell", line=line,
                                 field=f"column '{column}'")
    return values


def _check_name(path: Path, line: int, name: str) -> None:
    problem = formula_problem(name) or (
        f"{len(name)} characters; expected at most {MAX_NAME_CHARS} (a name becomes a file name)"
        if len(name) > MAX_NAME_CHARS else None)
    if problem:
        raise InputFileError(path, problem, line=line, field="column 'name'")


def _row_settings(path: Path, line: int, values: dict[str, object]) -> RunSettings:
    """The row's `RunSettings` (unchecked): its settings columns, flash attention by
    default where the dtype has it, Megatron-FSDP's sharding strategy as a ZeRO stage."""
    settings_args = {k: values[k] for k in SETTINGS_COLUMNS if k in values}
    settings_args.setdefault("use_flash_attn", default_flash_attention(str(values.get("dtype", "bf16")),
                                                                       str(values.get("attention_backend", "auto"))))
    for key in ("zero_stage", "flash_attention_version"):
        if key in settings_args:
            settings_args[key] = int(str(settings_args[key]))
    strategy = settings_args.pop("data_parallel_sharding_strategy", None)
    if strategy is not None:  # Megatron-FSDP's name for a ZeRO stage
        try:
            settings_args["zero_stage"] = stage_of_sharding_strategy(
                str(strategy), settings_args.get("zero_stage"))  # type: ignore[arg-type]
        except ValueError as exc:
            raise InputFileError(path, str(exc), line=line, field="column 'data_parallel_sharding_strategy'") from None
    return RunSettings(
        tensor_model_parallel_size=int(values["tensor_model_parallel_size"]),  # type: ignore[call-overload]
        pipeline_model_parallel_size=int(values["pipeline_model_parallel_size"]),  # type: ignore[call-overload]
        data_parallel_size=int(values["data_parallel_size"]),  # type: ignore[call-overload]
        global_batch_size=int(values["global_batch_size"]),  # type: ignore[call-overload]
        **settings_args,  # type: ignore[arg-type]
    )


def _check_num_gpus(path: Path, line: int, gpus: object, settings: RunSettings) -> None:
    """A `num_gpus` cell must equal the product of the parallel sizes."""
    if gpus is None or gpus == settings.num_gpus:
        return
    cp = settings.context_parallel_size
    names, sizes = (("tensor x context x pipeline x data", (settings.tensor_model_parallel_size, cp))
                    if cp > 1 else ("tensor x pipeline x data", (settings.tensor_model_parallel_size,)))
    factors = " x ".join(str(n) for n in (*sizes, settings.pipeline_model_parallel_size,
                                           settings.data_parallel_size))
    raise InputFileError(
        path, f"column 'num_gpus': {gpus} is not {names} parallel size = {factors} = {settings.num_gpus}",
        line=line)


def read_run_table(path: str | Path) -> tuple[list[str], list[RunRow]]:
    """The header and the parsed rows of a run table (see the module doc), all in
    memory; `iter_run_table` reads one row at a time."""
    header, rows = iter_run_table(path)
    return header, list(rows)


def model_cache() -> ModelCache:
    """A cache of the models a table's `model` cells name, to share between passes
    over one table (`iter_run_table`): each file is loaded, and warned about, once."""
    return ModelCache(_load_model)


def iter_run_table(path: str | Path, models: ModelCache | None = None) -> tuple[list[str], Iterator[RunRow]]:
    """The header (checked now) and an iterator over the parsed rows, each checked as
    it is read, so a table of any length is read in the memory of one row (and of the
    distinct models its `model` cells name, in `models`). The file is read at the one
    edge every input file crosses (`paraplan.inputs`: UTF-8, bounded size and fields,
    the same errors as every other reader)."""
    path = Path(path)
    lines = iter_text_lines(path, "a run table (CSV with a header of Megatron-LM argument names)")
    raw_header, records = csv_records(lines, path, (), KNOWN, columns_listed_by="`paraplan predict --help`")
    header = list(raw_header)
    required = REQUIRED_SETTINGS if "model" in header else REQUIRED
    missing = [c for c in required if c not in header]
    if missing:
        raise InputFileError(path, f"missing column(s) {', '.join(missing)}; expected {', '.join(required)}"
                             + ("" if "model" in header else " (or a model column naming a preset or a model file "
                                "instead of the dimensions)"), line=1)
    return header, _rows(path, set(header), records, models or model_cache())


def _rows(path: Path, has: set[str], records: Iterator[tuple[int, dict[str, str]]],
          models: ModelCache) -> Iterator[RunRow]:
    count = 0
    for line, cells in records:
        long = [column for column, cell in cells.items() if len(cell) > MAX_FIELD_CHARS]
        if long:
            raise InputFileError(path, f"a cell of {len(cells[long[0]]):,} characters; expected at most "
                                 f"{MAX_FIELD_CHARS}", line=line, field=f"column '{long[0]}'")
        if count >= MAX_ROWS:
            raise InputFileError(path, f"more than {MAX_ROWS:,} runs", line=line)
        row = parse_row(path, line, dict(cells), has, models)
        _check_work(path, row)
        count += 1
        yield row
    if not count:
        raise InputFileError(path, "no runs: the table has a header but no rows")


def _check_work(path: Path, row: RunRow) -> None:
    """A run the engine can time in bounded work: micro-batches per iteration (the
    fewest the row allows, or with a searched micro-batch size, one sample each) and
    pipeline operations (stages x micro-batches x chunks, the largest searched v)
    within `paraplan.core.limits`."""
    s, m = row.settings, row.model
    per_replica = s.global_batch_size // s.data_parallel_size
    micro_batches = per_replica if row.search_micro_batch_size else s.num_microbatches
    if micro_batches > MAX_NUM_MICROBATCHES:
        raise InputFileError(
            path, f"{micro_batches:,} micro-batches per iteration (global_batch_size / data_parallel_size"
            + (" with micro_batch_size searched from 1" if row.search_micro_batch_size else " / micro_batch_size")
            + f"); expected at most {MAX_NUM_MICROBATCHES:,}: {MICROBATCHES_WHY}", line=row.line)
    chunks = m.num_layers if row.search_virtual_stages else s.virtual_pipeline_model_parallel_size
    ops = 3 * s.pipeline_model_parallel_size * micro_batches * chunks
    if ops > MAX_SIMULATED_OPS:
        raise InputFileError(path, f"{ops:,} pipeline operations (3 x stages x micro-batches x model chunks); "
                             f"expected at most {MAX_SIMULATED_OPS:,}", line=row.line)
