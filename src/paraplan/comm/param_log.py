"""Import PARAM comms benchmark output (facebookresearch/param, comms.py).

Both layouts of docs/comm-fitting.md: upstream prints a `COMMS-RES
total-size (B) nElementsPerRank Time(us):p50 p75 p95 Min Max AlgBW BusBW ...`
header and rows starting with `COMMS-RES` (newer versions:
`COMMS-RES-<collective>-<dtype>`); the fork of Lin et al.'s DLRM study prints rows
`COMMS-RES-<coll>-<dtype> size nElementsPerRank p50 p75 p95 min max algBW busBW`.
The first nine numbers of a row are read in that order; `time_us` is p50.

The collective comes from `--collective`, else the row prefix, else the last
`collective=<name>` line; the world size from `--world-size`, else
`world_size: N` / `groupSize N`; nodes from `--nodes`, else the distinct host names
of the `[Rank N] host H` lines. Lines that do not start with `COMMS-RES` are skipped;
one that does is the column header (it names `size` or `p50`) or a row that must parse.
Size, element count and p50 are checked against `paraplan.comm.results.SWEEP_RULES`.
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
    parse_float,
    read_log_text,
)
from paraplan.comm.results import SWEEP_RULES
from paraplan.core import InputFileError
from paraplan.inputs import parse_number

_WORLD_RE = re.compile(r"(?:world_size['\"]?\s*[:=]\s*|groupSize\s+)(\d{1,9})\b")
_HOST_RE = re.compile(r"\[Rank\s+(\d{1,9})\]\s+host\s+([^,\s]+)")
_HEADER_RE = re.compile(r"size|p50", re.IGNORECASE)
_COLLECTIVE_RE = re.compile(r"\bcollective\s*=\s*([A-Za-z_]+)")
_BACKEND_RE = re.compile(r"\bbackend:\s*([A-Za-z0-9_]+)")
_DTYPES_RE = re.compile(r"data_types:\s*\[\s*'([A-Za-z0-9_]+)'")
_ROW_PREFIX = "COMMS-RES"
_NUMBERS = 9  # size, nElementsPerRank, p50, p75, p95, min, max, algbw, busbw


def parse_param(text: str, path: str | Path, options: ImportOptions = DEFAULT_OPTIONS) -> ImportResult:
    """Parse PARAM comms output already read as `text` (`path` names it in messages)."""
    path = Path(path)
    warnings: list[str] = []
    world_match = _WORLD_RE.search(text)
    backend_match = _BACKEND_RE.search(text)
    dtypes_match = _DTYPES_RE.search(text)
    hosts = {int(m.group(1)): m.group(2) for m in _HOST_RE.finditer(text)}
    backend = backend_match.group(1) if backend_match else "unknown"
    default_dtype = dtype_name(dtypes_match.group(1)) if dtypes_match else "unknown"

    if options.world_size:
        world = options.world_size
    elif world_match:
        world = int(world_match.group(1))
    else:
        world = 0  # resolved below: an error only if there are rows
    if options.nodes:
        nodes = options.nodes
    elif hosts:
        nodes = len(set(hosts.values()))
    else:
        nodes = 1
        warnings.append(f"{path}: no host names in the log; assuming 1 node (pass --nodes)")
    host = hosts.get(min(hosts), "") if hosts else ""

    context_collective: tuple[str, int] | None = None
    rows: list[SweepRow] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped.startswith(_ROW_PREFIX):
            found = _COLLECTIVE_RE.search(stripped)
            if found:
                context_collective = (found.group(1), lineno)
            continue
        tokens = stripped.split()
        if _HEADER_RE.search(stripped) and (len(tokens) < 2 or parse_float(tokens[1]) is None):
            continue  # the column header
        prefix = tokens[0][len(_ROW_PREFIX) :].lstrip("-")
        coll_raw, _, dtype_raw = prefix.rpartition("-") if "-" in prefix else (prefix, "", "")
        numbers = [parse_float(t) for t in tokens[1 : 1 + _NUMBERS]]
        if len(numbers) < _NUMBERS or any(v is None for v in numbers[3:]):
            raise InputFileError(
                path, f"truncated or malformed PARAM row: expected {_NUMBERS} numbers after {tokens[0]}", line=lineno
            )
        size = int(parse_number(path, lineno, "column 'total-size (B)'", tokens[1], SWEEP_RULES["size_bytes"]))
        elements = int(parse_number(path, lineno, "column 'nElementsPerRank'", tokens[2], SWEEP_RULES["count"]))
        if size == 0:
            continue
        p50 = float(parse_number(path, lineno, "column 'Time(us):p50'", tokens[3], SWEEP_RULES["time_us"]))
        if options.collective:
            collective = checked_collective(options.collective, path, None)
        elif coll_raw:
            collective = checked_collective(coll_raw, path, lineno)
        elif context_collective:
            collective = checked_collective(context_collective[0], path, context_collective[1])
        else:
            raise InputFileError(path, "cannot tell the collective; pass --collective", line=lineno)
        if not world:
            raise InputFileError(path, "cannot tell the world size (no 'world_size'); pass --world-size", line=lineno)
        warnings += bandwidth_warnings(path, lineno, collective, world, size, p50, numbers[7], numbers[8])
        row = SweepRow(
            collective=collective,
            backend=backend,
            world_size=world,
            nodes=nodes,
            size_bytes=size,
            count=elements,
            dtype=dtype_name(dtype_raw) if dtype_raw else default_dtype,
            time_us=p50,
            in_place=False,
            host=host,
        )
        rows.append(checked_row(path, lineno, row))
    if not rows:
        raise InputFileError(path, f"no PARAM result rows found (expected lines starting with '{_ROW_PREFIX}')")
    return ImportResult(tuple(rows), tuple(warnings))


def read_param(path: str | Path, options: ImportOptions = DEFAULT_OPTIONS) -> ImportResult:
    """Read and parse one PARAM comms output file."""
    return parse_param(read_log_text(path), path, options)
