"""The stages' result files as `paraplan report` reads them, checked at the edge: UTF-8
text (a byte-order mark allowed), a CSV header holding the columns the summary prints,
numbers where it computes with them, and JSON objects. A file that fails is one
`InputFileError` naming it, the line and the column, never a traceback from pandas
halfway through the summary.

The columns are those `paraplan.report.summary` reads without a default; a result
written by the stage has all of them (the file contracts of docs/design.md), so valid results
summarise exactly as before.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from paraplan.core import InputFileError
from paraplan.inputs import read_csv_table, read_text, shown

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class ResultColumns:
    """What one kind of result CSV must hold: `text` columns (any cell), `numbers` (a
    finite number in every cell) and `integers` (a whole number in every cell);
    `optional_numbers` may be absent or empty, and a cell they have is a finite number."""

    what: str
    text: tuple[str, ...] = ()
    numbers: tuple[str, ...] = ()
    integers: tuple[str, ...] = ()
    optional_numbers: tuple[str, ...] = ()


_LAYOUT = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size")
COLLECTIVES = ResultColumns("a bench CSV (paraplan bench or ingest)", text=("backend",),
                            numbers=("time_us", "busbw_GBps"), integers=("size_bytes",))
PROFILE = ResultColumns("a profile CSV (paraplan profile or ingest)", numbers=("fwd_s", "bwd_s", "param_bytes"))
SIMULATION = ResultColumns("a simulation's results.csv (paraplan simulate)", text=("D", "T", "P"),
                          optional_numbers=("speedup",))
COMPARISON = ResultColumns("a published_comparison.csv (paraplan simulate)", text=("mode", "reference"),
                           numbers=("rel_diff",))
PLAN = ResultColumns("a plan CSV (paraplan plan --profile)", integers=("gbs",))
VALIDATION = ResultColumns("a validation CSV (paraplan validate)", text=("strategy",),
                           numbers=("measured_s", "measured_p10_s", "measured_p90_s", "predicted_s", "rel_err"))
PREDICTION = ResultColumns("a predicted.csv (paraplan predict)", text=(*_LAYOUT, "fits_memory"),
                           numbers=("predicted_iteration_s", "predicted_tflops_per_gpu", "predicted_mfu",
                                    "predicted_peak_memory_bytes"),
                           optional_numbers=("context_parallel_size",))
LLM_PLAN = ResultColumns("a plan CSV (paraplan plan --model)",
                         text=(*_LAYOUT, "schedule", "recompute_granularity", "sequence_parallel",
                               "use_distributed_optimizer"),
                         numbers=("predicted_iteration_s", "predicted_mfu", "predicted_peak_memory_bytes",
                                  "search_s"),
                         integers=("micro_batch_size", "virtual_pipeline_model_parallel_size", "zero_stage"),
                         optional_numbers=("context_parallel_size",))


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def read_result_csv(path: Path, columns: ResultColumns) -> pd.DataFrame:
    """The CSV at `path` as a DataFrame, once its header and cells pass `columns`."""
    import pandas as pd

    text = read_text(path, columns.what)
    required = (*columns.text, *columns.numbers, *columns.integers)
    table = read_csv_table(text, path, required)
    checked = (*columns.numbers, *columns.integers, *(c for c in columns.optional_numbers if c in table.header))
    for line, cells in table.records:
        for column in checked:
            cell = cells[column]
            if column in columns.optional_numbers and not cell:
                continue
            value = _number(cell)
            if value is None or (column in columns.integers and not value.is_integer()):
                kind = "an integer" if column in columns.integers else "a finite number"
                raise InputFileError(path, f"expected {kind}, got {shown(cell)}", line=line, field=f"column '{column}'")
    return pd.read_csv(io.StringIO(text))

