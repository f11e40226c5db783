"""Predicted vs measured step time per strategy (the validate stage's figure)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from paraplan.plots.style import PALETTE, new_figure, save_figure

TARGET_REL_ERR = 0.15  # the stage's target: |predicted / measured - 1| <= 15%


def plot_validation(table, stem: str | Path, title: str = "") -> list[Path]:
    """Left: measured (median, p10-p90 whiskers) and predicted step time per strategy,
    with the signed error. Right: predicted against measured with the +-15% band."""
    fig, axes = new_figure(9.0, 3.6, ncols=2)
    left, right = axes[0]
    names = list(table["strategy"])
    x = np.arange(len(names))
    measured = table["measured_s"].to_numpy() * 1e3
    lo = measured - table["measured_p10_s"].to_numpy() * 1e3
    hi = table["measured_p90_s"].to_numpy() * 1e3 - measured
    predicted = table["predicted_s"].to_numpy() * 1e3
    width = 0.38
    left.bar(x - width / 2, measured, width, yerr=[lo, hi], capsize=3, color=PALETTE[0],
             label="measured (median, p10-p90)")
    left.bar(x + width / 2, predicted, width, color=PALETTE[3], label="predicted")
    for xi, top, err in zip(x, np.maximum(measured + hi, predicted), table["rel_err"], strict=True):
        left.annotate(f"{err:+.0%}", (xi, top), xytext=(0, 3), textcoords="offset points",
                      ha="center", fontsize=8)
    left.set_xticks(x, names)
    left.set_ylabel("step time (ms)")
    left.set_ylim(0, float(np.max(np.maximum(measured + hi, predicted))) * 1.18)
    left.legend(loc="upper left")

    top = float(max(measured.max(), predicted.max())) * 1.15
    line = np.array([0.0, top])
    right.fill_between(line, line * (1 - TARGET_REL_ERR), line * (1 + TARGET_REL_ERR),
                       color="0.85", label=f"±{TARGET_REL_ERR:.0%}")
    right.plot(line, line, color="0.4", lw=1)
    right.errorbar(measured, predicted, xerr=[lo, hi], fmt="o", color=PALETTE[0], capsize=3)
    for name, mx, py in zip(names, measured, predicted, strict=True):
        right.annotate(name, (mx, py), xytext=(4, -10), textcoords="offset points", fontsize=8)
    right.set_xlim(0, top)
    right.set_ylim(0, top)
    right.set_xlabel("measured step time (ms)")
    right.set_ylabel("predicted step time (ms)")
    right.legend(loc="upper left")
    if title:
        fig.suptitle(title)
    return save_figure(fig, stem)
