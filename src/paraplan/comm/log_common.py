"""What the log importers (nccl-tests, PARAM) share: reading a text log safely,
options, names of collectives and dtypes, the printed-bandwidth check, and
`checked_row`, the one check every imported row passes (`paraplan.comm.results`'
rules for measured points)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from paraplan.comm.results import MAX_LABEL_CHARS, SWEEP_RULES, bench_frame, sweep_point_problem
from paraplan.core import InputFileError, busbw_factor
from paraplan.core.names import formula_problem
from paraplan.inputs import check_number, read_text

# Printed bandwidths below this are too coarse (two decimals) to check.
CHECK_MIN_GBPS = 1.0
CHECK_TOLERANCE = 0.05

_COLLECTIVE_ALIASES = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "all_gather": "all_gather",
    "allgather": "all_gather",
    "all_gather_base": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "all_to_all_single": "all_to_all",
    "all_to_allv": "all_to_allv",
    "alltoallv": "all_to_allv",
    "broadcast": "broadcast",
    "reduce": "reduce",
}
KNOWN_COLLECTIVES = tuple(sorted(set(_COLLECTIVE_ALIASES.values())))

_DTYPE_ALIASES = {
    "float": "float32",
    "float32": "float32",
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "double": "float64",
    "float64": "float64",
    "int": "int32",
    "int32": "int32",
    "uint32": "uint32",
    "int64": "int64",
    "uint64": "uint64",
    "int8": "int8",
    "uint8": "uint8",
    "char": "int8",
}

# Type names nccl-tests prints in its `type` column: a line with one third is a table row.
PRINTED_DTYPES = frozenset((*_DTYPE_ALIASES, "fp8_e4m3", "fp8_e5m2", "f8e4m3", "f8e5m2", "bf16"))

_INT_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)


@dataclass(frozen=True)
class ImportOptions:
    """Command-line overrides; None means "read it from the log"."""

    in_place: bool = False
    world_size: int | None = None
    nodes: int | None = None
    collective: str | None = None


DEFAULT_OPTIONS = ImportOptions()


@dataclass(frozen=True)
class SweepRow:
    """One measured size of one collective, as an importer reads it."""

    collective: str
    backend: str
    world_size: int
    nodes: int
    size_bytes: int
    count: int
    dtype: str
    time_us: float
    in_place: bool
    host: str


@dataclass(frozen=True)
class ImportResult:
    """Rows in the bench-CSV shape, and warnings that name file and line."""

    rows: tuple[SweepRow, ...]
    warnings: tuple[str, ...]


def is_int(token: str) -> bool:
    return bool(_INT_RE.fullmatch(token))


def parse_float(token: str) -> float | None:
    """A number, or None for `N/A`, `-` and other non-numbers."""
    try:
        value = float(token)
    except ValueError:
        return None
    return value


def collective_name(raw: str) -> str | None:
    """`alltoall_perf`, `AllReduce`, `all_gather_base` -> our name; None if unknown."""
    key = raw.strip().lower()
    key = key.removesuffix("_perf").removesuffix("_mpi")
    return _COLLECTIVE_ALIASES.get(key) or _COLLECTIVE_ALIASES.get(key.replace("_", ""))


def checked_collective(raw: str, path: Path, line: int | None) -> str:
    name = collective_name(raw)
    if name is None:
        raise InputFileError(
            path,
            f"unknown collective '{raw}'; known: {', '.join(KNOWN_COLLECTIVES)} "
            "(or pass --collective)",
            line=line,
        )
    return name


def dtype_name(raw: str) -> str:
    return _DTYPE_ALIASES.get(raw.strip().lower(), raw.strip().lower())


def read_log_text(path: str | Path) -> str:
    """The log as UTF-8 text (`paraplan.inputs.read_text`); an empty one is an error too."""
    text = read_text(path, "a text benchmark log")
    if not text.strip():
        raise InputFileError(path, "empty file: expected a benchmark log")
    return text


def checked_row(path: Path, line: int, row: SweepRow) -> SweepRow:
    """`row` if its world size, nodes, size, count and time are plausible together
    (`SWEEP_RULES`, `sweep_point_problem`) and its backend, dtype and host are short
    names; else an `InputFileError` at `line`."""
    for key in ("world_size", "nodes", "size_bytes", "count", "time_us"):
        check_number(path, line, key.replace("_", " "), getattr(row, key), SWEEP_RULES[key])
    for key in ("backend", "dtype", "host"):
        if len(getattr(row, key)) > MAX_LABEL_CHARS:
            raise InputFileError(
                path, f"expected a name of at most {MAX_LABEL_CHARS} characters, got {len(getattr(row, key))}",
                line=line, field=key,
            )
        formula = formula_problem(getattr(row, key))  # it is written into the ingested CSV
        if formula:
            raise InputFileError(path, formula, line=line, field=key)
    problem = sweep_point_problem(row.world_size, row.nodes, row.size_bytes, row.count, row.time_us)
    if problem:
        raise InputFileError(path, problem[1], line=line)
    return row


def bandwidth_warning(
    path: Path, line: int, name: str, printed_GBps: float | None, recomputed_GBps: float
) -> str | None:
    """The warning for a printed bandwidth (>= 1.00 GB/s) more than 5% off the recomputed one."""
    if printed_GBps is not None and not math.isfinite(printed_GBps):
        return f"{path}:{line}: printed {name} '{printed_GBps}' is not a finite number; not checked"
    if printed_GBps is None or printed_GBps < CHECK_MIN_GBPS:
        return None
    mismatch = abs(recomputed_GBps - printed_GBps) / printed_GBps
    if mismatch <= CHECK_TOLERANCE:
        return None
    return (
        f"{path}:{line}: printed {name} {printed_GBps:.2f} GB/s differs from the recomputed "
        f"{recomputed_GBps:.2f} GB/s by {mismatch:.0%} (wrong world size or collective?)"
    )


def bandwidth_warnings(path: Path, line: int, collective: str, world_size: int, size_bytes: float, time_us: float,
                       printed_algbw_GBps: float | None, printed_busbw_GBps: float | None) -> list[str]:
    """A log row's printed algbw and busbw against the values its size and time give
    (nccl-tests conventions): one `bandwidth_warning` each where they disagree."""
    algbw = size_bytes / (time_us * 1e3)
    busbw = algbw * busbw_factor(collective, world_size)
    found = (bandwidth_warning(path, line, "algbw", printed_algbw_GBps, algbw),
             bandwidth_warning(path, line, "busbw", printed_busbw_GBps, busbw))
    return [message for message in found if message]


def rows_frame(rows: tuple[SweepRow, ...] | list[SweepRow]) -> pd.DataFrame:
    """Imported rows -> the bench CSV frame (`paraplan.comm.results.bench_frame`, which
    recomputes algbw/busbw), one block per run of rows that share their settings."""
    blocks = []
    start = 0
    for end in range(1, len(rows) + 1):
        if end < len(rows) and _block_key(rows[end]) == _block_key(rows[start]):
            continue
        block = rows[start:end]
        first = block[0]
        blocks.append(
            bench_frame(
                collective=first.collective,
                backend=first.backend,
                world_size=first.world_size,
                nodes=first.nodes,
                size_bytes=[r.size_bytes for r in block],
                count=[r.count for r in block],
                dtype=first.dtype,
                time_us=[r.time_us for r in block],
                in_place=first.in_place,
                host=first.host,
            )
        )
        start = end
    return pd.concat(blocks, ignore_index=True) if blocks else pd.DataFrame()


def _block_key(row: SweepRow) -> tuple:
    return (row.collective, row.backend, row.world_size, row.nodes, row.dtype, row.in_place, row.host)
