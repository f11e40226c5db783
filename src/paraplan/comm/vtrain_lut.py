"""Import vTrain's all-reduce look-up tables (VIA-Research/vTrain `trace/<gpu>/AR_GPU<n>_*_LUT`)
into bench-CSV rows.

vTrain's authors measured NCCL all_reduce inside one node of their GPUs for 2 to 8 ranks
and kept each sweep as a small CSV: a header `size(B),count,type,time(ns),busbw(GB/s),
time(ns),busbw(GB/s)` and one line per size, the first time/busbw pair out-of-place and
the second in-place (nccl-tests' columns, with the time in nanoseconds). The collective is
all_reduce (the `AR_` of the file name), the world size the `GPU<n>` of the file name
unless `--world-size` gives it, one node unless `--nodes` does; the backend is NCCL.
Printed bus bandwidths are checked against the size and time as for nccl-tests logs
(`paraplan.comm.log_common.bandwidth_warnings`).
"""

from __future__ import annotations

import re
from pathlib import Path

from paraplan.comm.log_common import (
    DEFAULT_OPTIONS,
    ImportOptions,
    ImportResult,
    SweepRow,
    bandwidth_warnings,
    checked_collective,
    checked_row,
    dtype_name,
    is_int,
    parse_float,
    read_log_text,
)
from paraplan.core import InputFileError

HEADER = ("size(B)", "count", "type", "time(ns)", "busbw(GB/s)", "time(ns)", "busbw(GB/s)")
_NAME_RE = re.compile(r"AR_GPU(\d{1,4})_", re.ASCII)


def world_size_from_name(path: Path) -> int | None:
    """The `n` of `AR_GPU<n>_...`, or None when the file name does not say."""
    found = _NAME_RE.search(path.name)
    return int(found.group(1)) if found else None


def read_vtrain_lut(path: str | Path, options: ImportOptions = DEFAULT_OPTIONS) -> ImportResult:
    """Rows of one vTrain all-reduce table (module doc); an `InputFileError` naming the
    line and column for anything else."""
    path = Path(path)
    lines = read_log_text(path).lstrip("\ufeff").splitlines()
    header = tuple(cell.strip() for cell in lines[0].split(","))
    if header != HEADER:
        raise InputFileError(path, f"expected the header {','.join(HEADER)}, got {lines[0][:80]!r}", line=1)
    world = options.world_size or world_size_from_name(path)
    if world is None:
        raise InputFileError(path, "the file name does not say the world size (AR_GPU<n>_...); give --world-size")
    collective = checked_collective(options.collective or "all_reduce", path, None)
    nodes = options.nodes or 1
    time_column = 5 if options.in_place else 3
    rows: list[SweepRow] = []
    warnings: list[str] = []
    for number, text in enumerate(lines[1:], start=2):
        if not text.strip():
            continue
        cells = [cell.strip() for cell in text.split(",")]
        if len(cells) != len(HEADER):
            raise InputFileError(path, f"expected {len(HEADER)} comma-separated values, got {len(cells)}",
                                 line=number)
        for column, key in ((0, "size(B)"), (1, "count")):
            if not is_int(cells[column]):
                raise InputFileError(path, f"expected an integer, got {cells[column]!r}", line=number, field=key)
        time_ns = parse_float(cells[time_column])
        if time_ns is None:
            raise InputFileError(path, f"expected a time in ns, got {cells[time_column]!r}", line=number,
                                 field="time(ns)")
        size = int(cells[0])
        if size == 0:
            continue
        row = checked_row(path, number, SweepRow(
            collective=collective, backend="nccl", world_size=world, nodes=nodes, size_bytes=size,
            count=int(cells[1]), dtype=dtype_name(cells[2]), time_us=time_ns / 1e3, in_place=options.in_place,
            host=""))
        warnings += bandwidth_warnings(path, number, collective, world, size, row.time_us, None,
                                       parse_float(cells[time_column + 1]))
        rows.append(row)
    if not rows:
        raise InputFileError(path, "no table rows: expected one line per size after the header")
    return ImportResult(tuple(rows), tuple(warnings))
