"""Figures of the fit stage: per sweep (latency and busbw vs size with every model's
curve and the sigmoid's turning points, histogram of held-out errors), and per
world size the uneven all_to_allv study (Lin et al.'s scatter and histograms)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from paraplan.comm.fit_errors import histogram_pct
from paraplan.comm.fit_sweep import FitEntry, predict
from paraplan.plots.style import PALETTE, Margins, new_figure, save_figure

# Fixed layouts with room for the widest log-axis tick labels (e.g. 2x10^-1) the sweeps
# draw: tight_layout gave at most 0.86 in left, 0.23 in right, 0.57 in bottom and 0.34 in
# top on the default workflow's fits.
_SWEEP_MARGINS = Margins(left_in=0.9, right_in=0.25, bottom_in=0.6, top_in=0.36, wspace=0.2)
_A2AV_MARGINS = Margins(left_in=0.9, right_in=0.25, bottom_in=0.56, top_in=0.36, wspace=0.22, hspace=0.28)

_MODEL_COLORS = {"alpha_beta": PALETTE[2], "sigmoid_bw": PALETTE[1], "table": PALETTE[3]}


def _label(entry: FitEntry) -> str:
    star = " (chosen)" if entry.chosen else ""
    return f"{entry.model}{star}: GMAE {entry.gmae:.1%}, held-out {entry.heldout_gmae:.1%}"


def plot_sweep(entries: list[FitEntry], size_bytes: np.ndarray, time_s: np.ndarray, stem: str | Path) -> list[Path]:
    """One sweep's figure: latency, busbw, held-out error histogram."""
    first = entries[0]
    factor = next((e.params["busbw_factor"] for e in entries if "busbw_factor" in e.params), 1.0)
    order = np.argsort(size_bytes)
    sizes, times = np.asarray(size_bytes, float)[order], np.asarray(time_s, float)[order]
    grid = np.geomspace(sizes[0], sizes[-1], 400)
    fig, axes = new_figure(15.0, 4.2, ncols=3)
    lat, bw, hist = axes[0]
    lat.loglog(sizes, times * 1e6, "o", color="black", ms=3.5, label="measured", zorder=3)
    bw.loglog(sizes, sizes * factor / times / 1e9, "o", color="black", ms=3.5, label="measured", zorder=3)
    for entry in entries:
        curve = predict(entry.model, entry.params, grid)
        style = {"color": _MODEL_COLORS.get(entry.model), "lw": 2.2 if entry.chosen else 1.2}
        lat.loglog(grid, curve * 1e6, label=_label(entry), **style)
        bw.loglog(grid, grid * factor / curve / 1e9, label=entry.model, **style)
        if entry.model == "sigmoid_bw":
            for key in ("ln_p_log2_bytes", "sats_p_log2_bytes"):
                x = 2.0 ** entry.params[key]
                if sizes[0] <= x <= sizes[-1]:
                    for ax in (lat, bw):
                        ax.axvline(x, ls="--", color=_MODEL_COLORS["sigmoid_bw"], lw=0.8, alpha=0.7)
    title = f"{first.collective}, {first.world_size} ranks, {first.nodes} node(s)"
    lat.set(xlabel="message size (bytes)", ylabel="latency (us)", title=title)
    bw.set(xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)",
           title="bus bandwidth; dashed: sigmoid turning points")
    lat.legend(loc="upper left")
    bw.legend(loc="upper left")
    held = [e for e in entries if e.heldout_rel_errors]
    if held:
        top = max(max(e.heldout_rel_errors) for e in held) * 100.0
        step = max(1.0, float(np.ceil(top / 20.0)))
        for entry in held:
            counts, edges = histogram_pct(np.array(entry.heldout_rel_errors), step_pct=step, max_pct=step * 21)
            hist.stairs(counts, edges, label=entry.model, color=_MODEL_COLORS.get(entry.model), lw=1.5)
        hist.legend()
    hist.set(xlabel="held-out relative error (%)", ylabel="sizes", title="leave-one-out errors")
    return save_figure(fig, stem, _SWEEP_MARGINS)


def plot_a2av(results: list, curve_sizes: np.ndarray, curve_s: np.ndarray, stem: str | Path) -> list[Path]:
    """Uneven all_to_allv at one world size: per effective-size variant, measured
    latency vs effective size with the all_to_all model's curve, and the histogram
    of relative errors (Lin et al.'s bins of 5%)."""
    fig, axes = new_figure(5.0 * len(results), 7.5, ncols=len(results), nrows=2)
    for column, result in enumerate(results):
        scatter, hist = axes[0][column], axes[1][column]
        sizes = np.array(result.effective_size_bytes, float)
        scatter.loglog(sizes, np.array(result.measured_s) * 1e6, ".", ms=4, color="black", label="measured")
        scatter.loglog(curve_sizes, curve_s * 1e6, color=PALETTE[3], lw=2.5, label="all_to_all model")
        scatter.set(
            xlabel="effective size (bytes)", ylabel="latency (us)",
            title=f"{result.variant}: GMAE {result.gmae:.1%}, mean {result.mean_abs_rel_err:.1%}",
        )
        scatter.legend(loc="upper left")
        max_pct = min(400.0, 5.0 * np.ceil(max(20.0, 100 * result.rel_errors.max() + 5) / 5.0))
        counts, edges = histogram_pct(result.rel_errors, step_pct=5.0, max_pct=max_pct)
        hist.stairs(counts, edges, fill=True, color=PALETTE[0], alpha=0.7)
        hist.set(xlabel="relative error (%)", ylabel="exchanges",
                 title=f"{result.world_size} ranks, {result.n_points} exchanges")
    return save_figure(fig, stem, _A2AV_MARGINS)
