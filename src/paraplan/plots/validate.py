"""Predicted vs measured step time per strategy (the validate stage's figure)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from paraplan.plots.style import PALETTE, new_figure, save_figure

TARGET_REL_ERR = 0.15  # the stage's target: |predicted / measured - 1| <= 15%
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")


def plot_validation(table, stem: str | Path, title: str = "",
                    uncorrected_s: Mapping[str, float] | None = None) -> list[Path]:
    """Left: measured (median, p10-p90 whiskers) and predicted step time per strategy,
    with the signed error (and the simulator's uncorrected prediction as a mark).
    Right: predicted against measured with the +-15% band, one marker per strategy."""
    fig, axes = new_figure(9.5, 3.8, ncols=2)
    left, right = axes[0]
    names = list(table["strategy"])
    x = np.arange(len(names))
    measured = table["measured_s"].to_numpy() * 1e3
    lo = measured - table["measured_p10_s"].to_numpy() * 1e3
    hi = table["measured_p90_s"].to_numpy() * 1e3 - measured
    predicted = table["predicted_s"].to_numpy() * 1e3
    raw = np.array([uncorrected_s[n] * 1e3 for n in names]) if uncorrected_s else None
    width = 0.38
    left.bar(x - width / 2, measured, width, yerr=[lo, hi], capsize=3, color=PALETTE[0],
             label="measured (median, p10-p90)")
    left.bar(x + width / 2, predicted, width, color=PALETTE[3], label="predicted")
    if raw is not None:
        left.plot(x + width / 2, raw, "_", color="black", markersize=14, mew=2,
                  label="simulator, uncorrected")
    top_left = np.maximum(measured + hi, predicted)
    for xi, top, err in zip(x, top_left, table["rel_err"], strict=True):
        left.annotate(f"{err:+.0%}", (xi, top), xytext=(0, 3), textcoords="offset points",
                      ha="center", fontsize=8)
    left.set_xticks(x, names)
    left.set_ylabel("step time (ms)")
    left.set_ylim(0, float(top_left.max()) * 1.3)
    left.legend(loc="upper left")

    top = float(max(measured.max(), predicted.max(), raw.max() if raw is not None else 0.0)) * 1.15
    line = np.array([0.0, top])
    right.fill_between(line, line * (1 - TARGET_REL_ERR), line * (1 + TARGET_REL_ERR),
                       color="0.88", label=f"±{TARGET_REL_ERR:.0%}")
    right.plot(line, line, color="0.4", lw=1)
    for i, name in enumerate(names):
        color, marker = PALETTE[i % len(PALETTE)], _MARKERS[i % len(_MARKERS)]
        right.errorbar(measured[i], predicted[i], xerr=[[lo[i]], [hi[i]]], fmt=marker, color=color,
                       capsize=3, label=name)
        if raw is not None:
            right.plot(measured[i], raw[i], marker, mfc="none", color=color)
    right.set_xlim(0, top)
    right.set_ylim(0, top)
    right.set_xlabel("measured step time (ms)")
    right.set_ylabel("predicted step time (ms)" + (" (hollow: uncorrected)" if raw is not None else ""))
    right.legend(loc="upper left", ncols=2)
    if title:
        fig.suptitle(title)
    return save_figure(fig, stem)
