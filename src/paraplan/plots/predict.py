"""Predicted iteration times: against measured ones (log-log, one colour per (TP, PP)),
per run of a table (iteration time and MFU side by side), and where each run's time
goes (stacked bars)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from paraplan.plots.style import PALETTE, new_figure, save_figure

_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">")


def plot_predicted_vs_measured(measured_s: np.ndarray, predicted_s: np.ndarray, tp: np.ndarray, pp: np.ndarray,
                               stem: str | Path, title: str, band: float = 0.10) -> list[Path]:
    measured_s = np.asarray(measured_s, float)
    predicted_s = np.asarray(predicted_s, float)
    fig, axes = new_figure(5.6, 5.0)
    ax = axes[0][0]
    lo = float(min(measured_s.min(), predicted_s.min())) / 1.3
    hi = float(max(measured_s.max(), predicted_s.max())) * 1.3
    line = np.geomspace(lo, hi, 50)
    ax.fill_between(line, line * (1 - band), line * (1 + band), color="0.9", label=f"±{band:.0%}")
    ax.plot(line, line, color="0.4", lw=1)
    pairs = sorted({(int(t), int(p)) for t, p in zip(tp, pp, strict=True)})
    for i, (t, p) in enumerate(pairs):
        sel = (np.asarray(tp) == t) & (np.asarray(pp) == p)
        ax.scatter(measured_s[sel], predicted_s[sel], s=9, alpha=0.7, color=PALETTE[i % len(PALETTE)],
                   marker=_MARKERS[i % len(_MARKERS)], label=f"TP {t}, PP {p}", linewidths=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured iteration time (s)")
    ax.set_ylabel("predicted iteration time (s)")
    ax.set_aspect("equal")
    ax.legend(loc="upper left", ncols=2, markerscale=1.5)
    ax.set_title(title, fontsize=9)
    return save_figure(fig, stem)


def plot_predicted_runs(names: list[str], iteration_s: np.ndarray, mfu: np.ndarray, fits_memory: list[bool],
                        stem: str | Path, title: str) -> list[Path]:
    """One bar per run, labelled with its value: predicted iteration time and MFU; a run
    that does not fit device memory is hatched grey."""
    iteration_s = np.asarray(iteration_s, float)
    mfu = np.asarray(mfu, float)
    height = max(2.4, 0.32 * len(names) + 1.2)
    fig, axes = new_figure(8.0, height, ncols=2)
    rows = np.arange(len(names))
    colours = [PALETTE[0] if fits else "0.75" for fits in fits_memory]
    hatches = ["" if fits else "//" for fits in fits_memory]
    for ax, values, label, text in ((axes[0][0], iteration_s, "predicted iteration time (s)", "{:.3g} s"),
                                    (axes[0][1], 100 * mfu, "predicted MFU (%)", "{:.1f}%")):
        bars = ax.barh(rows, values, color=colours)
        for bar, hatch in zip(bars, hatches, strict=True):
            bar.set_hatch(hatch)
        ax.bar_label(bars, [text.format(v) for v in values], padding=2, fontsize=7)
        ax.set_xlim(0, 1.2 * float(values.max()))
        ax.set_xlabel(label)
        ax.invert_yaxis()
        ax.grid(axis="y", visible=False)
    axes[0][0].set_yticks(rows, names)
    axes[0][1].set_yticks(rows, [""] * len(names))
    if not all(fits_memory):  # above the bars, where it hides no value
        from matplotlib.patches import Patch

        axes[0][1].legend(handles=[Patch(facecolor="0.75", hatch="//", label="does not fit device memory")],
                          loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=7)
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, stem)


PART_COLOURS = ("#1f77b4", "#17becf", "#9467bd", "#d62728", "#bcbd22", "#f7b6d2", "#ff7f0e", "#8c564b", "#c7c7c7",
                "#2ca02c", "#98df8a", "#e377c2", "#393b79")
"""One colour per part of `paraplan.predict.explain.PARTS`, in its order (bubble: green,
imbalance: light green, the other idle time; host: dark blue)."""


def plot_time_breakdown(names: list[str], seconds: np.ndarray, parts: tuple[str, ...], stem: str | Path,
                        title: str) -> list[Path]:
    """One horizontal bar per run, stacked by where its iteration time goes
    (`paraplan.predict.explain.PARTS`); `seconds` is (runs, parts)."""
    seconds = np.asarray(seconds, float)
    fig, axes = new_figure(8.0, 1.6 + 0.32 * len(names))
    ax = axes[0][0]
    y = np.arange(len(names))[::-1]
    left = np.zeros(len(names))
    for j, part in enumerate(parts):
        ax.barh(y, seconds[:, j], left=left, height=0.7, color=PART_COLOURS[j % len(PART_COLOURS)],
                label=part.replace("_", " "))
        left += seconds[:, j]
    ax.set_yticks(y, names)
    ax.set_xlabel("predicted iteration time (s)")
    ax.grid(axis="y", visible=False)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), ncols=1)
    ax.set_title(title, fontsize=9)
    return save_figure(fig, stem)
