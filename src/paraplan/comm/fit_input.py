"""Read bench CSVs (ours, or ones `paraplan ingest` wrote) for fitting: the one check
every measured point passes on its way into a fit.

A file is read as UTF-8 CSV (`paraplan.inputs`); every known numeric column is checked
against `paraplan.comm.results.SWEEP_RULES` and the points against
`sweep_point_problem`; the collective must be one paraplan knows; a world size must
be at least 2 (one rank moves no data: the comm model prices a group of one at 0);
all_to_allv sample rows need a global batch of at least one sample per rank, one
table count per rank and a positive dimension. Across files, every sweep (collective,
world size, nodes) needs two distinct sizes. Each error names the file, line, column
and value. A frame that passes is fitted without further checks
(`paraplan.comm.fit_sweep.fit_frame`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paraplan.comm.fit_a2av import sample_rows
from paraplan.comm.results import A2AV_COLUMNS, SWEEP_RULES, sweep_point_problem
from paraplan.core import COLLECTIVES, InputFileError
from paraplan.inputs import NumberRule, parse_number, read_csv_table, read_text, shown

# Columns a CSV must have to be fitted (the rest are informative).
REQUIRED_FOR_FIT: tuple[str, ...] = ("collective", "world_size", "nodes", "size_bytes", "time_us")
FITTED_COLLECTIVES: tuple[str, ...] = (*COLLECTIVES, "all_to_allv")

_MAX_A2AV = 2**31
_FIT_WORLD_RULE = NumberRule(
    "ranks", 2, SWEEP_RULES["world_size"].high, integer=True,
    why="one rank moves no data; the comm model prices a group of one rank at 0",
)
_FIT_SIZE_RULE = NumberRule(
    "a message size in bytes", 0, SWEEP_RULES["size_bytes"].high, integer=True, low_inclusive=False,
    why="zero-size rows are never written; above 1 PiB",
)
_A2AV_RULES: dict[str, NumberRule] = {
    "sample": NumberRule("a sample number", 0, _MAX_A2AV, integer=True),
    "global_batch": NumberRule("a global batch in samples", 1, _MAX_A2AV, integer=True),
    "dim": NumberRule("an embedding dimension", 1, 2**20, integer=True),
}
_TABLES_RULE = NumberRule("a table count", 0, 2**20, integer=True)
_OPTIONAL_NUMBERS = ("count", "time_p10_us", "time_p90_us", "algbw_GBps", "busbw_GBps")
_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}


def read_sweep_csv(path: str | Path) -> pd.DataFrame:
    """Read and check one bench CSV (see the module docstring)."""
    return _read(Path(path))[0]


def read_sweeps(paths: Sequence[str | Path]) -> pd.DataFrame:
    """Read and check several bench CSVs into one frame; across them, every sweep
    needs two distinct sizes (the error names the file and line of its first row)."""
    frames: list[pd.DataFrame] = []
    first_rows: dict[tuple, tuple[Path, int]] = {}
    for path in paths:
        frame, lines = _read(Path(path))
        frames.append(frame)
        for key, rows in fitted_sweeps(frame):
            first_rows.setdefault(key, (Path(path), lines[int(rows.index[0])]))
    frame = pd.concat(frames, ignore_index=True, sort=False)
    for key, rows in fitted_sweeps(frame):
        sizes = np.unique(rows["size_bytes"].to_numpy())
        if sizes.size < 2:
            path, line = first_rows[key]
            raise InputFileError(
                path, f"{key[0]} at {key[1]} ranks on {key[2]} node(s) has one message size "
                f"({int(sizes[0])} B); a fit needs at least 2 distinct sizes", line=line,
            )
    return frame


def fitted_sweeps(frame: pd.DataFrame) -> Iterator[tuple[tuple[str, int, int], pd.DataFrame]]:
    """((collective, world size, nodes), rows) of every size sweep in a checked frame,
    sorted; all_to_allv samples are not sweeps (`fit_a2av` predicts them). Where a sweep
    has both in-place and out-of-place rows, the out-of-place ones."""
    sweeps = frame.loc[~sample_rows(frame)]
    for (collective, world, nodes), rows in sweeps.groupby(["collective", "world_size", "nodes"], sort=True):
        if "in_place" in rows.columns and rows["in_place"].nunique() > 1:
            rows = rows.loc[~rows["in_place"].eq(True)]
        yield (str(collective), int(world), int(nodes)), rows


def _read(path: Path) -> tuple[pd.DataFrame, list[int]]:
    """The checked frame and the line of each of its rows."""
    table = read_csv_table(read_text(path, "a bench CSV"), path, REQUIRED_FOR_FIT)
    if not table.records:
        raise InputFileError(path, "no rows after the header; expected one row per measured size")
    columns: dict[str, list[object]] = {name: [] for name in table.header}
    for line, cells in table.records:
        for name, value in _checked_record(path, line, cells).items():
            columns[name].append(value)
    return pd.DataFrame(columns), [line for line, _ in table.records]


def _checked_record(path: Path, line: int, cells: Mapping[str, str]) -> dict[str, object]:
    def number(name: str, rule: NumberRule) -> int | float:
        return parse_number(path, line, f"column '{name}'", cells[name], rule)

    def optional(name: str, rule: NumberRule) -> float:
        return float(number(name, rule)) if name in cells and cells[name] != "" else np.nan

    collective = cells["collective"]
    if collective not in FITTED_COLLECTIVES:
        raise InputFileError(
            path, f"expected one of {', '.join(FITTED_COLLECTIVES)}, got {shown(collective)}",
            line=line, field="column 'collective'",
        )
    record: dict[str, Any] = dict(cells)
    record.update(
        collective=collective,
        world_size=int(number("world_size", _FIT_WORLD_RULE)),
        nodes=int(number("nodes", SWEEP_RULES["nodes"])),
        size_bytes=int(number("size_bytes", _FIT_SIZE_RULE)),
        time_us=float(number("time_us", SWEEP_RULES["time_us"])),
    )
    for name in _OPTIONAL_NUMBERS:
        if name in cells:
            record[name] = optional(name, SWEEP_RULES[name])
    count = record.get("count")
    problem = sweep_point_problem(
        record["world_size"], record["nodes"], record["size_bytes"],
        None if count is None or np.isnan(count) else int(count), record["time_us"],
    )
    if problem:
        raise InputFileError(path, problem[1], line=line, field=f"column '{problem[0]}'")
    p10, p90 = record.get("time_p10_us", np.nan), record.get("time_p90_us", np.nan)
    if not (np.isnan(p10) or p10 <= record["time_us"]) or not (np.isnan(p90) or record["time_us"] <= p90):
        raise InputFileError(
            path, f"expected time_p10_us <= time_us <= time_p90_us, got {p10:g}, {record['time_us']:g}, {p90:g}",
            line=line,
        )
    if "in_place" in cells:
        flag = cells["in_place"].lower()
        if flag not in _BOOLEANS and flag != "":
            raise InputFileError(path, f"expected True or False, got {shown(cells['in_place'])}",
                                 line=line, field="column 'in_place'")
        record["in_place"] = _BOOLEANS.get(flag, False)
    if collective == "all_to_allv" and cells.get("global_batch", "") != "":
        record.update(_a2av_fields(path, line, cells, record["world_size"]))
    else:  # a size sweep; sample columns (empty, or of another collective) are not used
        record.update({name: optional(name, rule) for name, rule in _A2AV_RULES.items() if name in cells})
    return record


def _a2av_fields(path: Path, line: int, cells: Mapping[str, str], world_size: int) -> dict[str, object]:
    """An uneven all_to_allv sample's columns, checked so that every effective size
    (`fit_a2av.effective_size_bytes`) is positive."""
    missing = [name for name in A2AV_COLUMNS if name not in cells or (name != "sample" and cells[name] == "")]
    if missing:
        raise InputFileError(
            path, f"an all_to_allv sample needs {', '.join(A2AV_COLUMNS[1:])}; missing {', '.join(missing)}",
            line=line,
        )
    fields: dict[str, Any] = {
        name: float(parse_number(path, line, f"column '{name}'", cells[name], rule)) if cells[name] else np.nan
        for name, rule in _A2AV_RULES.items()
    }
    if fields["global_batch"] < world_size:
        raise InputFileError(
            path, f"expected at least one sample per rank ({world_size}), got {int(fields['global_batch'])}",
            line=line, field="column 'global_batch'",
        )
    parts = cells["tables_per_rank"].split("-")
    tables = [parse_number(path, line, "column 'tables_per_rank'", part, _TABLES_RULE) for part in parts]
    if len(tables) != world_size or sum(tables) < 1:
        raise InputFileError(
            path, f"expected {world_size} table counts joined by '-' (e.g. 3-17), not all 0, "
            f"got {shown(cells['tables_per_rank'])}", line=line, field="column 'tables_per_rank'",
        )
    fields["tables_per_rank"] = "-".join(str(t) for t in tables)
    return fields

