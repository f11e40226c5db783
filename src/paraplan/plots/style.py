"""House style and the one way figures are saved (PNG + PDF, atomically)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
from cycler import cycler

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from paraplan.files import atomic_path

PALETTE = ("#1f77b4", "#2ca02c", "#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")

plt.rcParams.update(
    {
        "figure.dpi": 110,
        "savefig.dpi": 150,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.prop_cycle": cycler(color=PALETTE),
        "font.size": 9,
        "legend.fontsize": 8,
        "legend.frameon": False,
    }
)


def new_figure(width_in: float = 6.0, height_in: float = 4.0, ncols: int = 1, nrows: int = 1):
    fig, axes = plt.subplots(nrows, ncols, figsize=(width_in, height_in), squeeze=False)
    return fig, axes


# Nothing that changes from run to run goes into a file: no creation date in a PDF, no
# software version in either, so a rerun writes the same bytes (and a changed figure
# shows as a changed file).
_METADATA = {"png": {"Software": None}, "pdf": {"CreationDate": None, "Producer": None, "Creator": None}}


def save_figure(fig, stem: str | Path) -> list[Path]:
    """Save `fig` as `<stem>.png` and `<stem>.pdf` (a dot in the stem stays: `gpt3-1.3b`
    gives `gpt3-1.3b.png`), the same bytes for the same figure; returns both paths."""
    stem = Path(stem)
    paths = []
    fig.tight_layout()
    for suffix in (".png", ".pdf"):
        target = stem.with_name(stem.name + suffix)
        with atomic_path(target) as tmp:
            fig.savefig(tmp, format=suffix[1:], metadata=_METADATA[suffix[1:]])
        paths.append(target)
    plt.close(fig)
    return paths
