"""Plan figure: speedup vs global batch size for the data-parallel baselines (no
overlap, P3, normal overlap) and the best hybrid plan, all simulated and drawn solid;
a series with no simulated value at any batch size (`PlanSettings.verify` off)
falls back to the planner's estimate, dashed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from paraplan.plots.style import new_figure, save_figure

_SERIES = (
    ("dp_no_overlap", "DP, no overlap"),
    ("dp_p3", "DP + P3"),
    ("dp_overlap", "DP + normal overlap"),
    ("best_hybrid", "best hybrid (pipeline x data)"),
)


def plot_plan_speedups(records: Sequence[dict], title: str, stem: str | Path, num_devices: int) -> list[Path]:
    fig, axes = new_figure(6.4, 4.0)
    ax = axes[0][0]
    gbs = [r["gbs"] for r in records]
    for key, label in _SERIES:
        sim = [r[key] for r in records]
        if all(math.isnan(v) for v in sim):
            est = [r[f"{key}_est"] for r in records]
            ax.plot(gbs, est, "--", marker=".", label=f"{label} (planner estimate)")
        else:
            ax.plot(gbs, sim, "-", marker=".", label=label)
    ax.axhline(num_devices, color="0.6", lw=0.8, ls=":", label=f"{num_devices} devices")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("global batch size (samples)")
    ax.set_ylabel("speedup over one device")
    ax.set_title(title)
    ax.legend(loc="lower right")
    return save_figure(fig, stem)
