"""The DistIR paper's Figures 3 and 4 from results.csv rows (one mode at a time), with the
published points beside the simulated lines."""

from __future__ import annotations

from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd

from paraplan.plots.style import new_figure, save_figure

_MARKERS = ("o", "D", "v", "s", "<", "x")
_STYLES = ("-", "--", "-.", (0, (3, 1, 1, 1, 1, 1)), (0, (5, 2)))  # ":" is kept for overlap lines
_MODE_TITLES = {
    "distir-v0.1": "DistIR v0.1 semantics",
    "corrected": "paraplan physical engine",
}


def _shades(cmap_name: str, n: int) -> list:
    cmap = mpl.colormaps[cmap_name]
    return [cmap(x) for x in np.linspace(0.45, 0.95, max(n, 1))]


def _log2_devices(ax, devices) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(devices)
    ax.set_xticklabels([str(int(d)) for d in devices])
    ax.minorticks_off()


def figure3(rows: pd.DataFrame, published: pd.DataFrame | None, mode: str, stem: str | Path,
            reference_label: str = "published", subtitle: str = "") -> list[Path]:
    """Two panels: data-parallel speedup per batch size, pipeline speedup per micro-batch
    count, against devices; published points as black crosses. A `<series>_overlap`
    series (e.g. `DP_overlap`) is drawn dotted in its batch size's colour."""
    data = rows[rows["mode"] == mode]
    pub = published[published["mode"] == mode] if published is not None else None
    fig, axes = new_figure(6.4, 5.2, nrows=2)
    ax_dp, ax_pp = axes[0, 0], axes[1, 0]
    panels = (
        (ax_dp, "DP", "batch_size", "Blues", "Batch size {}", "Data parallelism"),
        (ax_pp, "PP", "microbatches", "Greens", "{} micro-batches", "Pipeline parallelism"),
    )
    devices = sorted(data["devices"].unique())
    for ax, series, key, cmap, label, title in panels:
        part = data[data["series"] == series]
        values = sorted(part[key].unique())
        colors = _shades(cmap, len(values))
        overlap_labelled = False
        for i, value in enumerate(values):
            line = part[part[key] == value].sort_values("devices")
            ax.plot(line["devices"], line["speedup"], marker=_MARKERS[i % len(_MARKERS)],
                    linestyle=_STYLES[i % len(_STYLES)], color=colors[i], label=label.format(value))
            overlap = data[(data["series"] == f"{series}_overlap") & (data[key] == value)]
            if not overlap.empty:
                overlap = overlap.sort_values("devices")
                ax.plot(overlap["devices"], overlap["speedup"], linestyle=":", linewidth=1.2,
                        marker=".", color=colors[i],
                        label=None if overlap_labelled else "dotted: all-reduce overlapped with backward")
                overlap_labelled = True
        if pub is not None and not pub.empty:
            ref = pub[pub["series"] == series]
            if not ref.empty:
                ax.scatter(ref["devices"], ref["speedup"], marker="x", color="black", s=22,
                           zorder=5, label=reference_label)
        ax.set_title(title)
        ax.set_ylabel("Speedup")
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
        if devices:
            _log2_devices(ax, devices)
    ax_pp.set_xlabel("# Devices")
    title = f"DistIR Figure 3: 64-layer MLP, {_MODE_TITLES.get(mode, mode)}"
    fig.suptitle(f"{title}\n{subtitle}" if subtitle else title, fontsize=9)
    return save_figure(fig, stem)


def figure4(rows: pd.DataFrame, published: pd.DataFrame | None, mode: str, stem: str | Path,
            published_baseline: float | None = None, subtitle: str = "") -> list[Path]:
    """Speedup against devices: pure D, pure H (T), best P (over micro-batches), D = H,
    and every grid point as a grey cross; published points as small black dots."""
    data = rows[(rows["mode"] == mode) & (rows["series"] == "grid")]
    fig, axes = new_figure(5.6, 3.6)
    ax = axes[0, 0]
    colors = _shades("Reds", 4)
    ax.scatter(data["devices"], data["speedup"], marker="x", color="lightgray", alpha=0.7,
               label="all configurations", zorder=1)
    lines = (
        ("Data parallelism", data[(data["T"] == 1) & (data["P"] == 1)]),
        ("Horizontal parallelism", data[(data["D"] == 1) & (data["P"] == 1)]),
        ("Pipeline parallelism (best M)", _best_pipeline(data)),
        ("D+H parallelism (D = H)", data[(data["D"] == data["T"]) & (data["P"] == 1)]),
    )
    for i, (label, line) in enumerate(lines):
        line = line.sort_values("devices")
        ax.plot(line["devices"], line["speedup"], marker=_MARKERS[i], linestyle=_STYLES[i],
                color=colors[i], label=label, zorder=3)
    if published is not None and published_baseline:
        pub = published[published["mode"] == mode]
        if not pub.empty:
            ax.scatter(pub["devices"], pub["throughput"] / published_baseline, marker=".",
                       color="black", s=10, label="published", zorder=4)
    devices = sorted(data["devices"].unique())
    if devices:
        _log2_devices(ax, devices)
    ax.set_xlabel("# Devices")
    ax.set_ylabel("Speedup")
    # the setting goes on a line of its own: one line overflows the figure's width
    title = f"DistIR Figure 4: grid search, {_MODE_TITLES.get(mode, mode)}"
    ax.set_title(f"{title}\n{subtitle}" if subtitle else title, fontsize=9)
    ax.legend(loc="upper left")
    return save_figure(fig, stem)


def _best_pipeline(data: pd.DataFrame) -> pd.DataFrame:
    """Pure pipelining (D = H = 1) with the best micro-batch count per P (not always the most)."""
    pp = data[(data["D"] == 1) & (data["T"] == 1)]
    if pp.empty:
        return pp
    return pp.loc[pp.groupby("P")["throughput"].idxmax()]
