"""Per-layer bar chart of a profile: forward and backward time (stacked), and per
layer the activation bytes crossing the cut after it (its output, for a chain) and its
parameter bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from paraplan.core import ModelProfile
from paraplan.plots.style import PALETTE, new_figure, save_figure


def plot_profile(profile: ModelProfile, stem: str | Path, title: str | None = None) -> list[Path]:
    n = profile.num_layers
    x = np.arange(n)
    fig, axes = new_figure(max(6.0, min(16.0, 0.12 * n + 4)), 5.5, nrows=2)
    top, bottom = axes[0, 0], axes[1, 0]
    fwd_ms, bwd_ms = profile.fwd_s * 1e3, profile.bwd_s * 1e3
    top.bar(x, fwd_ms, color=PALETTE[0], label="forward")
    top.bar(x, bwd_ms, bottom=fwd_ms, color=PALETTE[3], label="backward")
    top.set_ylabel(f"time per layer (ms), batch {profile.batch_size}")
    top.legend(loc="upper right")
    top.set_title(title or f"{profile.name}: {n} layers, fwd {fwd_ms.sum():.3g} ms, bwd {bwd_ms.sum():.3g} ms")
    width = 0.4
    bottom.bar(x - width / 2, profile.activation_bytes / 1e6, width, color=PALETTE[1],
               label="activation crossing the cut after the layer")
    bottom.bar(x + width / 2, profile.param_bytes / 1e6, width, color=PALETTE[4], label="parameters")
    bottom.set_ylabel("MB (1e6 bytes)")
    bottom.set_xlabel("layer (execution order)")
    bottom.legend(loc="upper right")
    if n <= 40:
        for ax in (top, bottom):
            ax.set_xticks(x)
        bottom.set_xticklabels([la.name for la in profile.layers], rotation=60, ha="right", fontsize=7)
        top.set_xticklabels([])
    return save_figure(fig, stem)
