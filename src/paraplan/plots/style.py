"""House style and the one way figures are saved (PNG + PDF, atomically)."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class Margins:
    """A fixed layout: the space around the grid of axes in inches (room for the tick
    labels, axis labels and titles the figure's kind has) and between panels as a
    fraction of a panel (matplotlib's wspace/hspace). Setting it costs nothing, where
    `tight_layout` measures every text of the figure (a third of a figure's drawing
    time for the fit stage's log-log panels)."""

    left_in: float
    right_in: float
    bottom_in: float
    top_in: float
    wspace: float = 0.2
    hspace: float = 0.2

    def apply(self, fig) -> None:
        width_in, height_in = fig.get_size_inches()
        fig.subplots_adjust(
            left=self.left_in / width_in, right=1.0 - self.right_in / width_in,
            bottom=self.bottom_in / height_in, top=1.0 - self.top_in / height_in,
            wspace=self.wspace, hspace=self.hspace,
        )


def new_figure(width_in: float = 6.0, height_in: float = 4.0, ncols: int = 1, nrows: int = 1):
    fig, axes = plt.subplots(nrows, ncols, figsize=(width_in, height_in), squeeze=False)
    return fig, axes


# Nothing that changes from run to run goes into a file: no creation date in a PDF, no
# software version in either, so a rerun writes the same bytes (and a changed figure
# shows as a changed file).
_METADATA = {"png": {"Software": None}, "pdf": {"CreationDate": None, "Producer": None, "Creator": None}}


def save_figure(fig, stem: str | Path, margins: Margins | None = None) -> list[Path]:
    """Save `fig` as `<stem>.png` and `<stem>.pdf` (a dot in the stem stays: `gpt3-1.3b`
    gives `gpt3-1.3b.png`), the same bytes for the same figure; returns both paths.
    The layout: `margins` when given, else matplotlib's `tight_layout`."""
    stem = Path(stem)
    paths = []
    if margins is None:
        fig.tight_layout()
    else:
        margins.apply(fig)
    for suffix in (".png", ".pdf"):
        target = stem.with_name(stem.name + suffix)
        with atomic_path(target) as tmp:
            fig.savefig(tmp, format=suffix[1:], metadata=_METADATA[suffix[1:]])
        paths.append(target)
    plt.close(fig)
    return paths
