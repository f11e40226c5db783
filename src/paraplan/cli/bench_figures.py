"""Draw the bench stage's figures from its CSVs, after the measurement.

For each CSV that `paraplan bench --no-plots` wrote (OUTPUT/<collective>_n<world>.csv),
saves the latency/bandwidth figure `paraplan bench` draws itself
(PLOTS/<collective>_n<world>.png/.pdf). The workflow draws them in a job of their own,
so the measuring job, which has the machine to itself, spends no time on figures.

Example:
  paraplan bench-figures results/collectives/local-cpu/all_reduce_n2.csv --plots figures/
"""

from __future__ import annotations

import argparse
from pathlib import Path

from paraplan.cli.common import add_tracking_arguments, track
from paraplan.core import ConfigError

NAME = "bench-figures"
HELP = "draw the bench stage's latency/bandwidth figures from its CSVs"
ORDER = 11

# The columns the figure reads (every CSV `paraplan bench` writes has them).
FIGURE_COLUMNS: tuple[str, ...] = (
    "collective", "backend", "world_size", "host", "size_bytes",
    "time_us", "time_p10_us", "time_p90_us", "busbw_GBps", "algbw_GBps",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("csvs", nargs="+", type=Path, metavar="CSV",
                        help="bench CSVs (<collective>_n<world>.csv, as `paraplan bench` writes them)")
    parser.add_argument("--plots", type=Path, default=None, metavar="DIR",
                        help="folder for the figures, <CSV's name>.png/.pdf (required)")
    add_tracking_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from paraplan.files import check_outputs
    from paraplan.track import RunLog

    if args.plots is None:
        raise ConfigError("--plots", "the folder for the figures is required (--plots DIR)")
    check_outputs(folders=[args.plots])
    frames = [(path, read_bench_csv(path)) for path in args.csvs]  # every file checked before any figure
    from paraplan.plots.bench import bench_figure

    for path, frame in frames:
        paths = bench_figure(frame, args.plots / path.stem)
        track(args, RunLog(stage=NAME, run_name=f"{path.stem}-figure", artifacts=paths,
                           tags={"collective": str(frame.iloc[0]["collective"])}))
    return 0


def read_bench_csv(path: Path):
    """The CSV as a frame with the figure's columns (an `InputFileError` naming the file
    when one is missing or the file has no rows); an empty host stays empty."""
    import pandas as pd

    from paraplan.core import InputFileError
    from paraplan.inputs import read_csv_table, read_text

    table = read_csv_table(read_text(path, "a bench CSV"), path, FIGURE_COLUMNS)
    if not table.records:
        raise InputFileError(path, "no rows after the header; expected one row per measured size")
    frame = pd.read_csv(path)
    frame["host"] = frame["host"].fillna("").astype(str)
    return frame
