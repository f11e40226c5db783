"""Pipeline Gantt charts in the style of docs/pipeline-schedules.md's reference charts:
one row per worker, forward blocks blue with the micro-batch number in white, backward
blocks green with the number in blue; micro-batches numbered across iterations
(e x M + i + 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.collections import PatchCollection
from matplotlib.patches import Rectangle

from paraplan.core.glossary import StreamCode
from paraplan.core.timeline import KINDS, Timeline
from paraplan.plots.style import Margins, new_figure, save_figure

# kind -> (face colour, label colour); odd model chunks (interleaved) use the second row
_STYLE = {
    "fwd": ("royalblue", "white"),
    "bwd": ("lightgreen", "blue"),
    "bwd_input": ("lightgreen", "blue"),
    "bwd_weight": ("khaki", "darkgoldenrod"),
}
_STYLE_ODD_CHUNK = {
    "fwd": ("navy", "white"),
    "bwd": ("mediumseagreen", "navy"),
    "bwd_input": ("mediumseagreen", "navy"),
    "bwd_weight": ("goldenrod", "black"),
}


def _chunk_parity(device: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """Rank of each event's stage among the stages its device runs, modulo 2
    (0 everywhere unless a device holds several model chunks)."""
    pairs = np.unique(np.stack([device, stage]), axis=1)
    rank = {}
    for d in np.unique(pairs[0]):
        for i, st in enumerate(pairs[1][pairs[0] == d].tolist()):
            rank[(int(d), st)] = i % 2
    return np.array([rank[(d, st)] for d, st in zip(device.tolist(), stage.tolist(), strict=True)], dtype=int)


def gantt_figure(timeline: Timeline, title: str = "", time_unit_s: float = 1.0,
                 devices: list[int] | None = None, unit_name: str | None = None):
    """Draw the compute stream of `devices` (default: all) with times in units of
    `time_unit_s` (1.0: the reference charts' unit steps), the axis labelled `unit_name` when
    given (e.g. "ms"). Returns the matplotlib figure."""
    compute = timeline.stream == StreamCode.COMPUTE
    rows = sorted(int(d) for d in np.unique(timeline.device[compute])) if devices is None else list(devices)
    row_of = {d: i for i, d in enumerate(rows)}
    sel = compute & np.isin(timeline.device, rows)
    start = timeline.start_s[sel] / time_unit_s
    end = timeline.end_s[sel] / time_unit_s
    span = float(end.max()) if end.size else 1.0
    n_rows = max(len(rows), 1)
    width = float(np.clip(0.32 * span + 1.5, 6.0, 60.0))
    fig, axes = new_figure(width, 0.55 * n_rows + 1.2)
    ax = axes[0, 0]
    ax.set_title(title or _default_title(timeline))
    patches, label_pos = [], []
    odd = _chunk_parity(timeline.device[sel], timeline.stage[sel]) if sel.any() else np.zeros(0, dtype=int)
    for d, k, mb, s0, s1, c in zip(timeline.device[sel].tolist(), timeline.kind[sel].tolist(),
                                   timeline.microbatch[sel].tolist(), start.tolist(), end.tolist(),
                                   odd.tolist(), strict=True):
        face, text_colour = (_STYLE_ODD_CHUNK if c else _STYLE).get(KINDS[k], ("lightgrey", "black"))
        y = row_of[d]
        patches.append(Rectangle((s0, y - 0.5), s1 - s0, 1.0, facecolor=face, edgecolor="black", linewidth=0.8))
        label_pos.append(((s0 + s1) / 2, y, str(mb + 1), text_colour, s1 - s0))
    ax.add_collection(PatchCollection(patches, match_original=True))
    min_width = span / 400
    for x, y, text, colour, w in label_pos:
        if w >= min_width:
            ax.text(x, y, text, color=colour, ha="center", va="center", fontsize=8, clip_on=True)
    ax.set_xlim(0, span)
    ax.set_ylim(n_rows - 0.5, -0.5)
    ax.set_yticks(range(n_rows), labels=[f"worker-{d}" for d in rows])
    if unit_name is not None:
        ax.set_xlabel(f"time ({unit_name})")
    else:
        ax.set_xlabel("time (steps)" if time_unit_s == 1.0 else f"time (x {time_unit_s:g} s)")
    if unit_name is None and time_unit_s == 1.0 and span <= 200:
        ax.set_xticks(np.arange(0, np.ceil(span) + 1, 1 if span <= 60 else 5))
    ax.grid(True, axis="x", color="black", alpha=0.25, linewidth=0.5)
    ax.grid(False, axis="y")
    return fig


def _default_title(tl: Timeline) -> str:
    parts = [f"Pipeline ({tl.schedule})" if tl.schedule else "Timeline"]
    if tl.microbatches:
        parts.append(f"{tl.microbatches} micro-batches")
    if tl.iterations > 1:
        parts.append(f"{tl.iterations} iterations")
    return ", ".join(parts)


def _margins(fig) -> Margins:
    """A fixed layout with room for the row labels ("worker-N": tight_layout gave 0.79 in
    for one digit), the last time tick's label, the time axis' label and the title."""
    digits = max((len(t.get_text()) for t in fig.axes[0].get_yticklabels()), default=8) - len("worker-")
    return Margins(left_in=0.82 + 0.07 * max(digits - 1, 0), right_in=0.27, bottom_in=0.5, top_in=0.32)


def save_gantt(timeline: Timeline, stem: str | Path, title: str = "", time_unit_s: float = 1.0,
               devices: list[int] | None = None, unit_name: str | None = None) -> list[Path]:
    """Draw and save as `<stem>.png` and `<stem>.pdf`."""
    fig = gantt_figure(timeline, title, time_unit_s, devices, unit_name)
    return save_figure(fig, stem, _margins(fig))
