"""Plan figure: speedup vs global batch size for the data-parallel baselines (no
overlap, P3, normal overlap) and the best hybrid plan, all simulated and drawn solid;
a series with no simulated value at any batch size (`PlanSettings.verify` off)
falls back to the planner's estimate, dashed. When DP and DP + normal overlap
coincide (within 1% at every batch size) the figure says why under the axes."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

from paraplan.plots.style import new_figure, save_figure

# key, label, line style, marker: the DP lines often lie on each other, so each keeps
# a style and marker of its own and stays visible under the others
_SERIES = (
    ("dp_no_overlap", "DP, no overlap", "-", "o"),
    ("dp_p3", "DP + P3", (0, (4, 2)), "^"),
    ("dp_overlap", "DP + normal overlap", ":", "s"),
    ("best_hybrid", "best hybrid (pipeline x data)", "-", "."),
)
_DP = ("dp_no_overlap", "dp_p3", "dp_overlap")
COINCIDE_REL = 0.01


def dp_lines_coincide(records: Sequence[dict]) -> bool:
    """True when DP with and without normal overlap agree within 1% at every batch size."""
    pairs = [(r["dp_no_overlap"], r["dp_overlap"]) for r in records]
    finite = [(a, b) for a, b in pairs if not (math.isnan(a) or math.isnan(b)) and a > 0]
    return bool(finite) and all(abs(b / a - 1) < COINCIDE_REL for a, b in finite)


def coincidence_note(records: Sequence[dict], num_devices: int) -> str:
    """Why overlapping the gradient all-reduce gains nothing on this chart."""
    best_dp = max(r["dp_no_overlap"] for r in records)
    if best_dp < 0.5 * num_devices:
        why = ("communication-bound: the gradient all-reduce takes far longer than the backward "
               "pass, the only work normal overlap can hide it behind (P3 also hides it behind "
               "the next forward)")
    else:
        why = "the gradient all-reduce is short next to the compute, so hiding it changes little"
    return f"DP and DP + normal overlap coincide (within {COINCIDE_REL:.0%}): {why}."


def plot_plan_speedups(records: Sequence[dict], title: str, stem: str | Path, num_devices: int) -> list[Path]:
    fig, axes = new_figure(6.4, 4.4)
    ax = axes[0][0]
    gbs = [r["gbs"] for r in records]
    for key, label, style, marker in _SERIES:
        sim = [r[key] for r in records]
        fill = "none" if key in _DP[1:] else None
        if all(math.isnan(v) for v in sim):
            est = [r[f"{key}_est"] for r in records]
            ax.plot(gbs, est, linestyle="--", marker=marker, fillstyle=fill or "full",
                    label=f"{label} (planner estimate)")
        else:
            ax.plot(gbs, sim, linestyle=style, marker=marker, fillstyle=fill or "full", label=label)
    ax.axhline(num_devices, color="0.6", lw=0.8, ls=":", label=f"{num_devices} devices")
    ax.set_xscale("log", base=2)
    xlabel = "global batch size (samples)"
    if dp_lines_coincide(records):
        # under the axis label, so the layout makes room for it
        xlabel += "\n\n" + "\n".join(textwrap.wrap(coincidence_note(records, num_devices), 90))
    ax.set_xlabel(xlabel, fontsize=8 if "\n" in xlabel else None)
    ax.set_ylabel("speedup over one device")
    ax.set_title(title)
    ax.legend(loc="center left", fontsize=8)
    return save_figure(fig, stem)
