"""Import nccl-tests / rccl-tests stdout (same layout) into bench-CSV rows.

A table row is `size count type [redop [root]] | time algbw busbw #wrong` for
out-of-place, then the same four for in-place. Launcher tags (OpenMPI
`[1,0]<stdout>:`, `srun -l`'s `0: `) are removed first. Everything that does not start like
a row (shell prompts, prose, `#` comments, environment dumps, footers) is skipped;
a line whose first two tokens are integers, or whose third token is a type name
(`float`, `half`, ...), starts like a row and must parse, or it is an `InputFileError`
naming the file, line and column. Sizes, counts and times are checked against
`paraplan.comm.results.SWEEP_RULES` (finite, in range, integers where they should be);
zero-size rows are dropped.

Per table (one log may hold several, e.g. concatenated runs): the collective comes
from `--collective`, else the `*_perf` command line or `# Collective test starting`
header; the world size from `--world-size`, else the `#  Rank N ... on HOST` lines,
else the printed busbw/algbw ratio; the node count from `--nodes`, else the
distinct host names of the rank lines (1 when there are none, with a warning).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from paraplan.comm.log_common import (
    DEFAULT_OPTIONS,
    PRINTED_DTYPES,
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
from paraplan.comm.results import MAX_RANKS, SWEEP_RULES
from paraplan.core import InputFileError
from paraplan.inputs import parse_number, shown

# "Group N" is absent in nccl-tests before 2.11
_RANK_RE = re.compile(r"#\s*Rank\s+(\d{1,9})\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)")
_PERF_RE = re.compile(r"\b([A-Za-z_]+?)_perf(?:_mpi)?\b")
# Launcher tags in front of every line: OpenMPI --tag-output "[1,0]<stdout>:", srun -l "0: ".
_TAG_RE = re.compile(r"^\s*(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:(?=\s))\s?")
_STARTING_RE = re.compile(r"Collective test starting:\s*([A-Za-z_]+?)(?:_perf)?\b")


@dataclass
class _RawRow:
    line: int
    size_bytes: int
    count: int
    dtype: str
    time_us: float
    algbw: float | None
    busbw: float | None


@dataclass
class _Table:
    """Rows that share one collective and one rank block."""

    collective_raw: str | None
    collective_line: int | None
    ranks: dict[int, str]
    rows: list[_RawRow] = field(default_factory=list)


def _starts_like_row(tokens: list[str]) -> bool:
    """Two leading integers (size, count), or a type name third: a table row, which must
    parse. Anything else (prose, prompts, footers) is skipped."""
    leading_ints = is_int(tokens[0]) and (len(tokens) == 1 or is_int(tokens[1]))
    return leading_ints or (len(tokens) >= 6 and tokens[2].lower() in PRINTED_DTYPES)


def _header_has_root(tokens: list[str]) -> bool | None:
    if "size" in tokens and "time" in tokens:
        return "root" in tokens
    return None


def _parse_row(
    tokens: list[str], lineno: int, path: Path, has_root: bool | None, in_place: bool
) -> _RawRow | str | None:
    """A `_RawRow`, a warning string (row without a usable time), or None (zero size)."""
    if len(tokens) < 3 or is_int(tokens[2]) or parse_float(tokens[2]) is not None:
        raise InputFileError(path, f"truncated or malformed table row: {shown(' '.join(tokens), 120)}", line=lineno)
    size = int(parse_number(path, lineno, "column 'size'", tokens[0], SWEEP_RULES["size_bytes"]))
    count = int(parse_number(path, lineno, "column 'count'", tokens[1], SWEEP_RULES["count"]))
    pos = 3
    if len(tokens) > pos and parse_float(tokens[pos]) is None and tokens[pos].upper() != "N/A":
        pos += 1  # redop (sum, none, ...)
    rest = len(tokens) - pos
    if has_root is None:
        has_root = rest in (5, 9)
    if has_root:
        pos += 1
    group = pos + 4 if in_place else pos
    if len(tokens) < group + 3:
        which = "in-place" if in_place else "out-of-place"
        raise InputFileError(
            path, f"truncated table row: no {which} time/algbw/busbw in {shown(' '.join(tokens), 120)}", line=lineno
        )
    if len(tokens) - pos not in (4, 8):  # a lost or split token would shift every column
        raise InputFileError(
            path, f"expected 4 values (time algbw busbw #wrong) out-of-place, and 4 in-place, after the "
            f"type/redop/root columns; got {len(tokens) - pos} in {shown(' '.join(tokens), 120)}", line=lineno,
        )
    if size == 0:
        return None
    if tokens[group].upper() in ("N/A", "NA", "-"):
        return f"{path}:{lineno}: no time ({tokens[group]}); row skipped"
    which = "in-place" if in_place else "out-of-place"
    time_us = float(parse_number(path, lineno, f"column 'time' ({which})", tokens[group], SWEEP_RULES["time_us"]))
    return _RawRow(
        line=lineno,
        size_bytes=size,
        count=count,
        dtype=dtype_name(tokens[2]),
        time_us=time_us,
        algbw=parse_float(tokens[group + 1]),
        busbw=parse_float(tokens[group + 2]),
    )


def _infer_world_size(collective: str, rows: list[_RawRow]) -> int | None:
    """World size from the printed busbw/algbw ratio (all_reduce: 2(n-1)/n, ...)."""
    ratios = [
        r.busbw / r.algbw for r in rows
        if r.algbw and r.busbw and np.isfinite(r.algbw) and np.isfinite(r.busbw) and r.algbw >= 1.0
    ]
    if not ratios or collective in ("broadcast", "reduce"):
        return None
    ratio = float(np.median(ratios))
    scale = 2.0 if collective == "all_reduce" else 1.0
    if ratio >= scale * 0.999:
        return None
    n = round(scale / (scale - ratio))
    return n if 2 <= n <= MAX_RANKS else None


def parse_nccl_tests(text: str, path: str | Path, options: ImportOptions = DEFAULT_OPTIONS) -> ImportResult:
    """Parse nccl-tests/rccl-tests stdout already read as `text` (`path` names it in messages)."""
    path = Path(path)
    backend = "rccl" if re.search(r"\brccl", text, re.IGNORECASE) else "nccl"
    tables: list[_Table] = []
    current = _Table(None, None, {})
    ranks_done = False  # a row came after the last rank line: the next rank line starts a new block
    has_root: bool | None = None
    warnings: list[str] = []

    def close() -> None:
        nonlocal current
        if current.rows:
            tables.append(current)
            current = _Table(current.collective_raw, current.collective_line, dict(current.ranks))

    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = _TAG_RE.sub("", line, count=1).strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            rank = _RANK_RE.search(stripped)
            if rank:
                if ranks_done:
                    close()
                    current.ranks = {}
                    ranks_done = False
                current.ranks[int(rank.group(1))] = rank.group(2)
                continue
            starting = _STARTING_RE.search(stripped)
            if starting:
                close()
                current.collective_raw, current.collective_line = starting.group(1), lineno
                continue
            header = _header_has_root(stripped.lstrip("#").split())
            if header is not None:
                has_root = header
            continue
        tokens = stripped.split()
        if _starts_like_row(tokens):
            parsed = _parse_row(tokens, lineno, path, has_root, options.in_place)
            if isinstance(parsed, str):
                warnings.append(parsed)
            elif parsed is not None:
                current.rows.append(parsed)
                ranks_done = True
            continue
        perf = _PERF_RE.search(stripped)
        if perf:
            close()
            current.collective_raw, current.collective_line = perf.group(1), lineno
    if current.rows:
        tables.append(current)
    if not tables:
        raise InputFileError(
            path, "no nccl-tests table rows found (expected lines 'size count type ... time algbw busbw')"
        )

    rows: list[SweepRow] = []
    for table in tables:
        rows.extend(_resolve(table, path, backend, options, warnings))
    return ImportResult(tuple(rows), tuple(warnings))


def _resolve(
    table: _Table, path: Path, backend: str, options: ImportOptions, warnings: list[str]
) -> list[SweepRow]:
    first_line = table.rows[0].line
    if options.collective:
        collective = checked_collective(options.collective, path, None)
    elif table.collective_raw:
        collective = checked_collective(table.collective_raw, path, table.collective_line)
    else:
        raise InputFileError(
            path, "cannot tell the collective (no '*_perf' command line or header); pass --collective", line=first_line
        )
    from_ranks = len(table.ranks) or None
    if options.world_size:
        world = options.world_size
        if from_ranks and from_ranks != world:
            warnings.append(f"{path}:{first_line}: --world-size {world} overrides the {from_ranks} rank lines")
    elif from_ranks:
        world = from_ranks
    else:
        inferred = _infer_world_size(collective, table.rows)
        if inferred is None:
            raise InputFileError(path, "cannot tell the world size (no '# Rank' lines); pass --world-size",
                                 line=first_line)
        world = inferred
        warnings.append(f"{path}:{first_line}: no rank lines; world size {world} inferred from busbw/algbw")
    hosts = sorted(set(table.ranks.values()))
    if options.nodes:
        nodes = options.nodes
    elif hosts:
        nodes = len(hosts)
    else:
        nodes = 1
        warnings.append(f"{path}:{first_line}: no host names in the log; assuming 1 node (pass --nodes)")
    host = table.ranks.get(min(table.ranks), "") if table.ranks else ""
    out = []
    for raw in table.rows:
        warnings += bandwidth_warnings(path, raw.line, collective, world, raw.size_bytes, raw.time_us, raw.algbw,
                                       raw.busbw)
        row = SweepRow(
            collective=collective,
            backend=backend,
            world_size=world,
            nodes=nodes,
            size_bytes=raw.size_bytes,
            count=raw.count,
            dtype=raw.dtype,
            time_us=raw.time_us,
            in_place=options.in_place,
            host=host,
        )
        out.append(checked_row(path, raw.line, row))
    return out


def read_nccl_tests(path: str | Path, options: ImportOptions = DEFAULT_OPTIONS) -> ImportResult:
    """Read and parse one nccl-tests/rccl-tests log file."""
    return parse_nccl_tests(read_log_text(path), path, options)
