"""The run table: one training run per row, columns named as Megatron-LM's
arguments. `paraplan predict` reads it and writes it back with `predicted_*`
columns; `paraplan calibrate` reads it with `measured_iteration_s`.

Required columns: `REQUIRED`. Optional: `MODEL_COLUMNS`, `SETTINGS_COLUMNS`,
`num_gpus` (checked against t x p x d), `measured_iteration_s`. An empty cell
takes the default; an empty `micro_batch_size` or
`virtual_pipeline_model_parallel_size` means "the fastest that fits" (a missing
`micro_batch_size` column too; a missing virtual-pipeline column means 1). An empty
`use_flash_attn` means flash attention for bf16 and fp8 runs (Megatron Core with
Transformer Engine) and the unfused softmax path for fp16 and fp32 runs (what
Megatron-LM and Megatron-DeepSpeed ran before flash attention).

Every cell is checked once here: an error names the file, the line, the column,
the value and what was expected.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from paraplan.core.errors import InputFileError, StrategyError
from paraplan.core.run_settings import (
    DTYPES,
    PIPELINE_SCHEDULES,
    RECOMPUTE_GRANULARITIES,
    RunSettings,
)
from paraplan.core.transformer import NORMALIZATIONS, POSITION_EMBEDDINGS, TransformerModel

REQUIRED: tuple[str, ...] = (
    "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size", "global_batch_size",
)
MODEL_COLUMNS: tuple[str, ...] = (
    "num_query_groups", "ffn_hidden_size", "swiglu", "untie_embeddings_and_output_weights", "normalization",
    "position_embedding_type", "add_bias_linear", "hidden_dropout", "attention_dropout",
)
SETTINGS_COLUMNS: tuple[str, ...] = (
    "micro_batch_size", "virtual_pipeline_model_parallel_size", "recompute_granularity", "sequence_parallel",
    "use_distributed_optimizer", "zero_stage", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
    "dtype", "schedule", "use_flash_attn",
)
PREDICTED: tuple[str, ...] = (
    "predicted_iteration_s", "predicted_tflops_per_gpu", "predicted_mfu", "predicted_peak_memory_bytes",
    "predicted_weight_state_bytes", "predicted_activation_bytes", "bubble_fraction", "fits_memory", "chosen",
    "calibration",
)
OTHER: tuple[str, ...] = ("name", "num_gpus", "measured_iteration_s")
KNOWN: tuple[str, ...] = (*OTHER[:1], *REQUIRED, *MODEL_COLUMNS, *SETTINGS_COLUMNS, *OTHER[1:], *PREDICTED)
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
    return f"{arch}|gpus={s.num_gpus}|gbs={s.global_batch_size}|dtype={s.dtype}"


def _integer(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = float(text)
        if not math.isfinite(value) or value != int(value) or value < minimum:
            raise ValueError(f"an integer >= {minimum}")
        if value > 2**40:
            raise ValueError("an integer below 2^40")
        return int(value)

    parse.expected = f"an integer >= {minimum}"  # type: ignore[attr-defined]
    return parse


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
    value = float(text)
    if not 0 <= value < 1:
        raise ValueError("a number in [0, 1)")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0 or value > 1e7:
        raise ValueError("a time in seconds > 0 (and below 1e7)")
    return value


_PARSERS: dict[str, Callable[[str], object]] = {
    **{k: _integer(1) for k in REQUIRED},
    "num_query_groups": _integer(1), "ffn_hidden_size": _integer(1), "swiglu": _boolean,
    "untie_embeddings_and_output_weights": _boolean, "normalization": _choice(NORMALIZATIONS),
    "position_embedding_type": _choice(POSITION_EMBEDDINGS), "add_bias_linear": _boolean,
    "hidden_dropout": _fraction, "attention_dropout": _fraction,
    "micro_batch_size": _integer(1), "virtual_pipeline_model_parallel_size": _integer(1),
    "recompute_granularity": _choice(RECOMPUTE_GRANULARITIES), "sequence_parallel": _boolean,
    "use_distributed_optimizer": _boolean, "zero_stage": _choice(("0", "1", "2", "3")),
    "overlap_grad_reduce": _boolean, "overlap_param_gather": _boolean, "tp_comm_overlap": _boolean,
    "dtype": _choice(DTYPES), "schedule": _choice(PIPELINE_SCHEDULES), "use_flash_attn": _boolean,
    "num_gpus": _integer(1), "measured_iteration_s": _seconds,
}
_EXPECTED = {
    **{k: "an integer >= 1" for k in (*REQUIRED, "num_query_groups", "ffn_hidden_size", "micro_batch_size",
                                       "virtual_pipeline_model_parallel_size", "num_gpus")},
    "measured_iteration_s": "a time in seconds > 0",
}


def _cell(path: Path, line: int, column: str, text: str) -> object:
    try:
        return _PARSERS[column](text)
    except ValueError as exc:
        expected = _EXPECTED.get(column) or str(exc)
        if "could not convert" in str(exc) or "invalid literal" in str(exc):
            expected = _EXPECTED.get(column, "a number")
        raise InputFileError(path, f"column '{column}': expected {expected}, got '{text}'", line=line) from None


def default_flash_attention(dtype: str) -> bool:
    """Empty `use_flash_attn`: flash for bf16/fp8 runs, unfused for fp16/fp32 (module doc)."""
    return dtype in ("bf16", "fp8")


def parse_row(path: Path, line: int, cells: dict[str, str], has_columns: set[str]) -> RunRow:
    values: dict[str, object] = {}
    for column, text in cells.items():
        text = text.strip()
        if column in _PARSERS and text:
            values[column] = _cell(path, line, column, text)
    for column in REQUIRED:
        if column not in values:
            raise InputFileError(path, f"column '{column}': expected {_EXPECTED[column]}, got an empty cell",
                                 line=line)
    name = cells.get("name", "").strip() or f"run{line - 1}"
    model_args = {k: values[k] for k in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                                         "vocab_size", *MODEL_COLUMNS) if k in values}
    try:
        model = TransformerModel(name=name, **model_args)  # type: ignore[arg-type]
    except ValueError as exc:
        raise InputFileError(path, str(exc).replace(f"model '{name}': ", ""), line=line) from None
    dtype = str(values.get("dtype", "bf16"))
    search_mbs = "micro_batch_size" not in values
    search_v = ("virtual_pipeline_model_parallel_size" in has_columns
                and "virtual_pipeline_model_parallel_size" not in values)
    settings_args = {k: values[k] for k in SETTINGS_COLUMNS if k in values}
    settings_args.setdefault("use_flash_attn", default_flash_attention(dtype))
    if "zero_stage" in settings_args:
        settings_args["zero_stage"] = int(str(settings_args["zero_stage"]))
    settings = RunSettings(
        tensor_model_parallel_size=int(values["tensor_model_parallel_size"]),  # type: ignore[call-overload]
        pipeline_model_parallel_size=int(values["pipeline_model_parallel_size"]),  # type: ignore[call-overload]
        data_parallel_size=int(values["data_parallel_size"]),  # type: ignore[call-overload]
        global_batch_size=int(values["global_batch_size"]),  # type: ignore[call-overload]
        **settings_args,  # type: ignore[arg-type]
    )
    gpus = values.get("num_gpus")
    if gpus is not None and gpus != settings.num_gpus:
        raise InputFileError(
            path, f"column 'num_gpus': {gpus} is not tensor x pipeline x data parallel size = "
            f"{settings.tensor_model_parallel_size} x {settings.pipeline_model_parallel_size} x "
            f"{settings.data_parallel_size} = {settings.num_gpus}", line=line)
    try:
        probe = settings
        if search_mbs or search_v:
            from dataclasses import replace

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


def read_run_table(path: str | Path) -> tuple[list[str], list[RunRow]]:
    """The header and the parsed rows of a run table (see the module doc)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputFileError(path, "file not found") from None
    except (IsADirectoryError, PermissionError) as exc:
        raise InputFileError(path, f"cannot read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputFileError(path, f"not UTF-8 text (byte {exc.start})") from None
    reader = csv.reader(text.splitlines())
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise InputFileError(path, "empty file; expected a header row") from None
    except csv.Error as exc:
        raise InputFileError(path, f"not CSV: {exc}", line=1) from None
    unknown = [h for h in header if h not in KNOWN]
    if unknown:
        raise InputFileError(path, f"unknown column '{unknown[0]}'; expected the run-table columns "
                             f"({', '.join(REQUIRED)}, ...; see `paraplan predict --help`)", line=1)
    duplicated = sorted({h for h in header if header.count(h) > 1})
    if duplicated:
        raise InputFileError(path, f"column '{duplicated[0]}' appears twice", line=1)
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise InputFileError(path, f"missing required column '{missing[0]}'", line=1)
    rows: list[RunRow] = []
    has = set(header)
    for line, fields in enumerate(reader, start=2):
        if not any(f.strip() for f in fields):
            continue
        if len(fields) != len(header):
            raise InputFileError(path, f"expected {len(header)} fields, got {len(fields)}", line=line)
        long = [f for f in fields if len(f) > MAX_FIELD_CHARS]
        if long:
            raise InputFileError(path, f"a field of {len(long[0])} characters; at most {MAX_FIELD_CHARS}",
                                 line=line)
        if len(rows) >= MAX_ROWS:
            raise InputFileError(path, f"more than {MAX_ROWS} runs", line=line)
        rows.append(parse_row(path, line, dict(zip(header, fields, strict=True)), has))
    if not rows:
        raise InputFileError(path, "no runs: the table has a header but no rows")
    return header, rows
