"""The bench CSV (docs/design.md's collective file contract) and its nccl-tests-style table.

Columns, in order: `collective, backend, world_size, nodes, size_bytes, count,
dtype, time_us, time_p10_us, time_p90_us, algbw_GBps, busbw_GBps, in_place, host`,
and for all_to_allv also `sample, global_batch, tables_per_rank, dim`:

- `size_bytes`, `count`: nccl-tests conventions (`paraplan.comm.sizes`); for
  all_to_allv the largest rank's input buffer and its element count (`a2av`).
- `time_us`: median iteration time in microseconds; `time_p10_us`/`time_p90_us`
  the 10th/90th percentiles (empty when an imported log has only one time).
  An iteration's time is the slowest rank's.
- `algbw_GBps` = size_bytes / time; `busbw_GBps` = algbw x busbw_factor(collective,
  world_size) (2(n-1)/n all_reduce; (n-1)/n all_gather, reduce_scatter,
  all_to_all(v); 1 broadcast, reduce); GB/s = 1e9 B/s.
- `in_place`: whether the timed call wrote its result into its input buffer.
- `host`: the host name of rank 0 (imported logs: the first host named).
- all_to_allv only: `sample` (0..N-1), `global_batch` (B; each rank holds B // n
  samples), `tables_per_rank` (T_0..T_{n-1} joined with '-', e.g. "3-17"), `dim` (D).

Every writer of such a CSV (the harness, the log importers) builds it with
`bench_frame`, so the columns and the bandwidth arithmetic exist once; every reader of
measured points (the log importers, the fit's CSV reader) checks them against
`SWEEP_RULES` and `sweep_point_problem`, so what counts as a plausible measurement is
written once too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from paraplan.core import busbw_factor
from paraplan.inputs import NumberRule

COLUMNS: tuple[str, ...] = (
    "collective",
    "backend",
    "world_size",
    "nodes",
    "size_bytes",
    "count",
    "dtype",
    "time_us",
    "time_p10_us",
    "time_p90_us",
    "algbw_GBps",
    "busbw_GBps",
)
EXTRA_COLUMNS: tuple[str, ...] = ("in_place", "host")
A2AV_COLUMNS: tuple[str, ...] = ("sample", "global_batch", "tables_per_rank", "dim")

# What a measured point may hold. The bounds are far outside any real measurement and
# keep every later product (bandwidths, fits, predictions) finite.
MAX_RANKS = 2**20
MAX_SIZE_BYTES = 2**50  # 1 PiB in one rank's buffer
MAX_ALGBW_GBPS = 1e5  # 100 TB/s: ~100x the fastest link of today
MAX_LABEL_CHARS = 256  # backend, dtype, host: short names, which every CSV reader takes back
_TIME_RULE = NumberRule(
    "a time in microseconds", 1e-3, 1e9, why="a collective call takes between 1 ns and 1000 s; wrong unit?"
)
_BANDWIDTH_RULE = NumberRule("a bandwidth in GB/s", 0, 1e15)  # printed values only inform
SWEEP_RULES: dict[str, NumberRule] = {
    "world_size": NumberRule("ranks", 1, MAX_RANKS, integer=True),
    "nodes": NumberRule("nodes", 1, MAX_RANKS, integer=True),
    "size_bytes": NumberRule("a message size in bytes", 0, MAX_SIZE_BYTES, integer=True, why="above 1 PiB"),
    "count": NumberRule("an element count", 0, MAX_SIZE_BYTES, integer=True, why="above 2^50 elements"),
    "time_us": _TIME_RULE,
    "time_p10_us": _TIME_RULE,
    "time_p90_us": _TIME_RULE,
    "algbw_GBps": _BANDWIDTH_RULE,
    "busbw_GBps": _BANDWIDTH_RULE,
}


def sweep_point_problem(
    world_size: int, nodes: int, size_bytes: int, count: int | None, time_us: float
) -> tuple[str, str] | None:
    """(column, why) when values that each pass `SWEEP_RULES` do not fit together: more
    nodes than ranks, more elements than bytes, or a bandwidth no link reaches (the
    mark of a time in the wrong unit). None when they fit."""
    if nodes > world_size:
        return "nodes", f"{nodes} nodes for {world_size} ranks; expected nodes <= ranks"
    if count is not None and count > size_bytes:
        return "count", f"{count} elements in {size_bytes} bytes; expected count <= size_bytes"
    if size_bytes > 0:
        algbw = size_bytes / (time_us * 1e3)
        if algbw > MAX_ALGBW_GBPS:
            return "time_us", (
                f"{size_bytes} B in {time_us:g} us is {algbw:.3g} GB/s, above any link "
                f"({MAX_ALGBW_GBPS:g} GB/s); wrong time unit?"
            )
    return None


_TIME_DECIMALS = 3  # microseconds to the nanosecond; bandwidths follow the rounded time


def summarize_times_us(times_s: Sequence[float]) -> tuple[float, float, float]:
    """(median, p10, p90) in microseconds of per-iteration times in seconds."""
    values = np.asarray(times_s, dtype=float) * 1e6
    if values.size == 0:
        raise ValueError("no timed iterations")
    p10, median, p90 = np.percentile(values, [10.0, 50.0, 90.0])
    return float(median), float(p10), float(p90)


def algbw_GBps(size_bytes: np.ndarray | float, time_us: np.ndarray | float) -> np.ndarray:
    """nccl-tests' algorithm bandwidth: size / time, in GB/s (1e9 B/s)."""
    return np.asarray(size_bytes, dtype=float) / (np.asarray(time_us, dtype=float) * 1e3)


def bench_frame(
    collective: str,
    backend: str,
    world_size: int,
    nodes: int,
    size_bytes: Sequence[int],
    count: Sequence[int],
    dtype: str,
    time_us: Sequence[float],
    time_p10_us: Sequence[float] | None = None,
    time_p90_us: Sequence[float] | None = None,
    in_place: bool | Sequence[bool] = False,
    host: str = "",
    extra: Mapping[str, Sequence[object]] | None = None,
) -> pd.DataFrame:
    """One collective's rows with the docs/design.md columns, then `in_place, host`, then
    `extra` columns in the given order. algbw/busbw are computed here from size and
    time (rounded to the nanosecond); rows of size 0 are dropped, the others need
    positive times."""
    sizes = np.asarray(size_bytes, dtype=np.int64)
    n_rows = sizes.size
    times = np.round(np.asarray(time_us, dtype=float), _TIME_DECIMALS)

    def column(values: Sequence[float] | None, name: str) -> np.ndarray:
        if values is None:
            return np.full(n_rows, np.nan)
        array = np.round(np.asarray(values, dtype=float), _TIME_DECIMALS)
        if array.shape != (n_rows,):
            raise ValueError(f"{name}: expected {n_rows} values, got {array.shape}")
        return array

    counts = np.asarray(count, dtype=np.int64)
    if counts.shape != (n_rows,) or times.shape != (n_rows,):
        raise ValueError(f"size_bytes, count and time_us must have equal lengths ({n_rows})")
    kept = sizes > 0
    if not np.all(np.isfinite(times[kept]) & (times[kept] > 0)):
        raise ValueError(f"{collective}: times must be positive and finite")
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = algbw_GBps(sizes, times)
    data: dict[str, object] = {
        "collective": collective,
        "backend": backend,
        "world_size": int(world_size),
        "nodes": int(nodes),
        "size_bytes": sizes,
        "count": counts,
        "dtype": dtype,
        "time_us": times,
        "time_p10_us": column(time_p10_us, "time_p10_us"),
        "time_p90_us": column(time_p90_us, "time_p90_us"),
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * busbw_factor(collective, int(world_size)),
        "in_place": np.broadcast_to(np.asarray(in_place, dtype=bool), (n_rows,)),
        "host": host,
    }
    for name, values in (extra or {}).items():
        if len(values) != n_rows:
            raise ValueError(f"extra column {name}: expected {n_rows} values, got {len(values)}")
        data[name] = list(values)
    frame = pd.DataFrame(data, index=range(n_rows))
    return frame.loc[kept].reset_index(drop=True)


# ---- nccl-tests-style table --------------------------------------------------------

_HEADER = (
    f"#{'size':>12} {'count':>12} {'type':>9} {'redop':>6} {'root':>5}"
    f" {'time':>10} {'p10':>10} {'p90':>10} {'algbw':>8} {'busbw':>8}"
)
_UNITS = (
    f"#{'(B)':>12} {'(elements)':>12} {'':>9} {'':>6} {'':>5}"
    f" {'(us)':>10} {'(us)':>10} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}"
)
_REDOP = {"all_reduce": "sum", "reduce_scatter": "sum", "reduce": "sum"}
_ROOT = {"broadcast": 0, "reduce": 0}


def table_header(collective: str, backend: str, world_size: int, nodes: int, host: str) -> str:
    """The title and column heads printed before a collective's rows."""
    title = (
        f"# paraplan bench: {collective}, backend {backend}, {world_size} ranks on "
        f"{nodes} node(s), host {host or '?'}; time = median over iterations of the slowest rank"
    )
    return "\n".join((title, "#", _HEADER, _UNITS))


def table_row(row: Mapping[str, Any]) -> str:
    """One row of a `bench_frame` as nccl-tests prints it (plus p10/p90)."""
    collective = str(row["collective"])
    return (
        f" {int(row['size_bytes']):>12} {int(row['count']):>12} {row['dtype']!s:>9}"
        f" {_REDOP.get(collective, 'none'):>6} {_ROOT.get(collective, -1):>5}"
        f" {float(row['time_us']):>10.2f} {float(row['time_p10_us']):>10.2f}"
        f" {float(row['time_p90_us']):>10.2f}"
        f" {float(row['algbw_GBps']):>8.3f} {float(row['busbw_GBps']):>8.3f}"
    )


def table_footer(frame: pd.DataFrame) -> str:
    """nccl-tests' footer (average bus bandwidth over sizes) plus the peak."""
    if frame.empty:
        return "# no rows"
    return (
        f"# Avg bus bandwidth    : {frame['busbw_GBps'].mean():.4f} GB/s\n"
        f"# Peak bus bandwidth   : {frame['busbw_GBps'].max():.4f} GB/s"
    )
