"""Figures of the bench stage: latency and bus bandwidth against message size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from paraplan.plots.style import PALETTE, Margins, new_figure, save_figure

# A fixed layout: tight_layout gave at most 0.85 in left, 0.14 in right, 0.47 in bottom,
# 0.40 in top (the suptitle) and a gap of 0.25 panel widths on the default workflow's and
# the ingested a100 logs' figures.
_MARGINS = Margins(left_in=0.88, right_in=0.15, bottom_in=0.5, top_in=0.42, wspace=0.26)


def _size_axis(ax, sweep: bool) -> None:
    ax.set_xscale("log", base=2)
    if sweep:
        ax.set_xlabel("message size (bytes, nccl-tests convention)")
    else:
        ax.set_xlabel("largest rank's input buffer (bytes)")


def bench_figure(frame: pd.DataFrame, stem: str | Path) -> list[Path]:
    """Two log-log panels for one collective and world size: median latency with its
    p10-p90 band, and bus bandwidth. all_to_allv samples (uneven exchanges, not a
    sweep) are drawn as points. Saves `<stem>.png` and `<stem>.pdf`."""
    first = frame.iloc[0]
    collective = str(first["collective"])
    title = (
        f"{collective}, {first['backend']}, {int(first['world_size'])} ranks"
        f" ({first['host'] or 'unknown host'})"
    )
    data = frame.sort_values("size_bytes")
    sizes = data["size_bytes"].to_numpy(dtype=float)
    fig, axes = new_figure(width_in=9.0, height_in=3.6, ncols=2)
    lat_ax, bw_ax = axes[0]
    sweep = collective != "all_to_allv"
    p10 = data["time_p10_us"].to_numpy(dtype=float)
    p90 = data["time_p90_us"].to_numpy(dtype=float)
    if sweep:
        lat_ax.plot(sizes, data["time_us"], marker="o", ms=3, color=PALETTE[0], label="median")
        if np.isfinite(p10).all() and np.isfinite(p90).all():
            lat_ax.fill_between(sizes, p10, p90, color=PALETTE[0], alpha=0.2, label="p10-p90")
        bw_ax.plot(sizes, data["busbw_GBps"], marker="o", ms=3, color=PALETTE[1], label="busbw")
        bw_ax.plot(sizes, data["algbw_GBps"], ls="--", color=PALETTE[3], label="algbw")
    else:
        err = np.vstack([data["time_us"] - p10, p90 - data["time_us"]])
        lat_ax.errorbar(sizes, data["time_us"], yerr=err, fmt="o", ms=3, color=PALETTE[0],
                        elinewidth=0.6, label="median and p10-p90 per exchange")
        bw_ax.scatter(sizes, data["busbw_GBps"], s=9, color=PALETTE[1], label="busbw")
    lat_ax.set_yscale("log")
    lat_ax.set_ylabel("time per call (us)")
    bw_ax.set_yscale("log")
    bw_ax.set_ylabel("bandwidth (GB/s)")
    for ax in (lat_ax, bw_ax):
        _size_axis(ax, sweep)
        ax.legend(loc="upper left")
    fig.suptitle(title)
    return save_figure(fig, stem, _MARGINS)
