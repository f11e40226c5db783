"""Pipeline Gantt charts in the style of docs/pipeline-schedules.md's reference charts:
one row per worker, forward blocks blue with the micro-batch number in white, backward
blocks green with the number in blue; micro-batches numbered across iterations
(e x M + i + 1)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.colors import to_rgba_array
from matplotlib.font_manager import FontProperties, findfont, get_font
from matplotlib.lines import Line2D
from matplotlib.markers import TICKDOWN, MarkerStyle
from matplotlib.patches import PathPatch
from matplotlib.path import Path as MplPath
from matplotlib.textpath import TextPath
from matplotlib.transforms import Affine2D, Bbox, IdentityTransform, blended_transform_factory

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
_OTHER = ("lightgrey", "black")
LABEL_SIZE_PT = 8.0
LABEL_PAD_PT = 1.0
"""A micro-batch number is drawn where its glyphs and this much space on either side fit
inside its block; a narrower block shows no number (it would spill over its neighbours)."""


def _colours() -> tuple[np.ndarray, np.ndarray]:
    """RGBA face and label colours indexed by 2 x kind + chunk parity."""
    pairs = [(_STYLE_ODD_CHUNK if odd else _STYLE).get(kind, _OTHER) for kind in KINDS for odd in (0, 1)]
    return to_rgba_array([f for f, _ in pairs]), to_rgba_array([t for _, t in pairs])


def _chunk_parity(device: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """Rank of each event's stage among the stages its device runs, modulo 2
    (0 everywhere unless a device holds several model chunks)."""
    pairs, pair_of_event = np.unique(np.stack([device, stage]), axis=1, return_inverse=True)
    # pairs are sorted by device, then stage: a pair's rank is its index minus its device's first
    first = np.searchsorted(pairs[0], pairs[0], side="left")
    return ((np.arange(pairs.shape[1]) - first) % 2)[pair_of_event.reshape(-1)]


@cache
def _glyphs(text: str, size_pt: float) -> tuple[MplPath, Bbox]:
    """`text` as a filled outline in points (baseline at y = 0) and its ink's extents: one
    path drawn at many places costs a fraction of a text artist each."""
    path = TextPath((0.0, 0.0), text, prop=FontProperties(size=size_pt))
    return path, path.get_extents()


def _centred(text: str, size_pt: float, baseline_pt: float | None = None) -> tuple[MplPath, float]:
    """`text`'s outline with its ink centred on x = 0 and, vertically, on y = 0 or with its
    baseline at `baseline_pt`; and the ink's width in points."""
    path, box = _glyphs(text, size_pt)
    dy = -(box.y0 + box.y1) / 2 if baseline_pt is None else baseline_pt
    return path.transformed(Affine2D().translate(-(box.x0 + box.x1) / 2, dy)), float(box.width)


def _font_extent_pt(prop: FontProperties) -> tuple[float, float]:
    """The font's ascent and descent in points, as matplotlib 3.11 lays a line of text out:
    from its OS/2 typographic or hhea table, else from the ink of "lp"."""
    font = get_font(findfont(prop))
    scale = prop.get_size_in_points() / font.units_per_EM
    os2, hhea = font.get_sfnt_table("OS/2"), font.get_sfnt_table("hhea")
    if os2 is not None:
        return os2["sTypoAscender"] * scale, -os2["sTypoDescender"] * scale
    if hhea is not None:
        return hhea["ascent"] * scale, -hhea["descent"] * scale
    box = _glyphs("lp", prop.get_size_in_points())[1]
    return float(box.y1), float(-box.y0)


def _rows(timeline: Timeline, devices: list[int] | None) -> list[int]:
    compute = timeline.stream == StreamCode.COMPUTE
    return sorted(int(d) for d in np.unique(timeline.device[compute])) if devices is None else list(devices)


def _row_index(rows: list[int], device: np.ndarray) -> np.ndarray:
    """The row of each of `device` (all in `rows`, which need not be sorted)."""
    order = np.argsort(rows)
    return order[np.searchsorted(np.asarray(rows)[order], device)] if rows else np.zeros(0, dtype=int)


def gantt_figure(timeline: Timeline, title: str = "", time_unit_s: float = 1.0,
                 devices: list[int] | None = None, unit_name: str | None = None):
    """Draw the compute stream of `devices` (default: all) with times in units of
    `time_unit_s` (1.0: the reference charts' unit steps), the axis labelled `unit_name` when
    given (e.g. "ms"). Returns the matplotlib figure, laid out (`_margins`): its axes hold
    the blocks as a `PathPatch` per colour (a closed rectangle per event), then the
    micro-batch numbers as `PathCollection`s (one per number, an offset per block it labels)."""
    rows = _rows(timeline, devices)
    sel = (timeline.stream == StreamCode.COMPUTE) & np.isin(timeline.device, rows)
    start = timeline.start_s[sel] / time_unit_s
    end = timeline.end_s[sel] / time_unit_s
    span = float(end.max()) if end.size else 1.0
    n_rows = max(len(rows), 1)
    width = float(np.clip(0.32 * span + 1.5, 6.0, 60.0))
    fig, axes = new_figure(width, 0.55 * n_rows + 1.2)
    margins = _margins(rows)
    margins.apply(fig)
    ax = axes[0, 0]
    ax.set_title(title or _default_title(timeline))
    device = timeline.device[sel]
    y = _row_index(rows, device).astype(float)
    odd = _chunk_parity(device, timeline.stage[sel]) if sel.any() else np.zeros(0, dtype=int)
    style = 2 * timeline.kind[sel].astype(int) + odd
    faces, label_colours = _colours()
    _add_blocks(ax, start, end, y, style, faces)
    _add_labels(ax, (start + end) / 2, y, (end - start) * _points_per_unit(fig, margins, span),
                timeline.microbatch[sel] + 1, label_colours[style])
    ax.set_xlim(0, span)
    ax.set_ylim(n_rows - 0.5, -0.5)
    ax.set_yticks(range(n_rows), labels=[f"worker-{d}" for d in rows])
    if unit_name is not None:
        ax.set_xlabel(f"time ({unit_name})")
    else:
        ax.set_xlabel("time (steps)" if time_unit_s == 1.0 else f"time (x {time_unit_s:g} s)")
    ax.grid(False, axis="y")
    if unit_name is None and time_unit_s == 1.0 and span <= 200:
        steps = np.arange(0, np.ceil(span) + 1, 1 if span <= 60 else 5)
        _step_axis(ax, steps[steps <= span * (1 + 1e-9)], fig.get_size_inches()[1] - margins.bottom_in - margins.top_in)
    else:
        ax.grid(True, axis="x", color="black", alpha=0.25, linewidth=0.5)
    return fig


def _step_axis(ax, steps: np.ndarray, axes_height_in: float) -> None:
    """The reference charts' time axis, a tick, a grid line and a number at every step (up
    to 61), drawn as it would be by `ax.set_xticks(steps)` with the house style and
    `ax.grid(...)` above, but as three artists: matplotlib's axis makes five of each tick
    and cost half of a chart's drawing time. Sizes come from rcParams, as the axis' do."""
    rc = matplotlib.rcParams
    ax.set_xticks([])
    under = blended_transform_factory(ax.transData, ax.transAxes)  # x: time, y: 0 bottom, 1 top
    grid = LineCollection([[(x, 0.0), (x, 1.0)] for x in steps.tolist()], transform=under, colors="black",
                          alpha=0.25, linewidths=0.5, zorder=1.5)
    ax.add_collection(grid, autolim=False)
    tick_pt, pad_pt = rc["xtick.major.size"], rc["xtick.major.pad"]
    ax.add_artist(Line2D(steps, np.zeros_like(steps), transform=under, linestyle="none", marker=MarkerStyle(TICKDOWN),
                         markersize=tick_pt, markeredgewidth=rc["xtick.major.width"], color=rc["xtick.color"],
                         clip_on=False, zorder=1.5))
    # each number's text box (the font's ascent above the baseline, descent below, or the
    # ink's where it reaches further) hangs from `top_pt`, centred on its tick
    prop = FontProperties(size=rc["xtick.labelsize"])
    size_pt = prop.get_size_in_points()
    ascent_pt, descent_pt = _font_extent_pt(prop)
    top_pt = -(tick_pt + pad_pt)
    bottom_pt, numbers = top_pt, []
    for x in steps.tolist():
        text = f"{x:g}"
        box = _glyphs(text, size_pt)[1]
        baseline_pt = top_pt - max(ascent_pt, box.y1)
        bottom_pt = min(bottom_pt, baseline_pt - max(descent_pt, -box.y0))
        numbers.append(_centred(text, size_pt, baseline_pt)[0])
    labels = PathCollection(numbers, sizes=[1.0], offsets=np.column_stack([steps, np.zeros_like(steps)]),
                            offset_transform=under, facecolors=rc["xtick.color"], edgecolors="none", linewidths=0.0,
                            clip_on=False, zorder=1.5)
    labels.set_transform(IdentityTransform())
    ax.add_collection(labels, autolim=False)
    # the axis' label below the numbers, as matplotlib places it
    ax.xaxis.set_label_coords(0.5, (bottom_pt - rc["axes.labelpad"]) / (72 * axes_height_in))


def _add_blocks(ax, start: np.ndarray, end: np.ndarray, y: np.ndarray, style: np.ndarray,
                faces: np.ndarray) -> None:
    """One patch per colour whose path holds a closed rectangle per event of that colour, in
    event order: a PDF then gets one path operation per colour instead of one per event
    (compute blocks of one device never overlap, so drawing the colours one after the other
    looks as drawing the events in order). Snapped to pixels, as matplotlib snaps a lone
    rectangle."""
    corners = np.stack([np.stack([start, y - 0.5], axis=-1), np.stack([end, y - 0.5], axis=-1),
                        np.stack([end, y + 0.5], axis=-1), np.stack([start, y + 0.5], axis=-1),
                        np.stack([start, y - 0.5], axis=-1)], axis=1)  # (events, 5, 2)
    rectangle = [MplPath.MOVETO, MplPath.LINETO, MplPath.LINETO, MplPath.LINETO, MplPath.CLOSEPOLY]
    for key in np.unique(style).tolist():
        mine = corners[style == key]
        path = MplPath(mine.reshape(-1, 2), np.tile(rectangle, len(mine)))
        ax.add_artist(PathPatch(path, facecolor=faces[key], edgecolor="black", linewidth=0.8, snap=True))


def _points_per_unit(fig, margins: Margins, span: float) -> float:
    """Points of axis per unit of time: the layout is fixed, so known before drawing."""
    width_in = fig.get_size_inches()[0] - margins.left_in - margins.right_in
    return 72.0 * width_in / span


def _add_labels(ax, x: np.ndarray, y: np.ndarray, block_pt: np.ndarray, number: np.ndarray,
                colour: np.ndarray) -> None:
    """The micro-batch numbers centred on their blocks, where they fit (`LABEL_PAD_PT`): one
    collection per number, its one path drawn at every block that shows it (a PDF then
    holds each number's outline once)."""
    for n in np.unique(number).tolist():
        glyphs, ink_pt = _centred(str(n), LABEL_SIZE_PT)
        at = np.flatnonzero((number == n) & (block_pt >= ink_pt + 2 * LABEL_PAD_PT))
        if at.size == 0:
            continue
        labels = PathCollection([glyphs], sizes=[1.0],  # the path is in points
                                offsets=np.column_stack([x[at], y[at]]), offset_transform=ax.transData,
                                facecolors=colour[at], edgecolors="none", linewidths=0.0)
        labels.set_transform(IdentityTransform())
        ax.add_collection(labels, autolim=False)


def _default_title(tl: Timeline) -> str:
    parts = [f"Pipeline ({tl.schedule})" if tl.schedule else "Timeline"]
    if tl.microbatches:
        parts.append(f"{tl.microbatches} micro-batches")
    if tl.iterations > 1:
        parts.append(f"{tl.iterations} iterations")
    return ", ".join(parts)


def _margins(rows: list[int]) -> Margins:
    """A fixed layout with room for the row labels ("worker-N": tight_layout gave 0.79 in
    for one digit), the last time tick's label, the time axis' label and the title."""
    digits = max((len(str(d)) for d in rows), default=1)
    return Margins(left_in=0.82 + 0.07 * max(digits - 1, 0), right_in=0.27, bottom_in=0.5, top_in=0.32)


def save_gantt(timeline: Timeline, stem: str | Path, title: str = "", time_unit_s: float = 1.0,
               devices: list[int] | None = None, unit_name: str | None = None) -> list[Path]:
    """Draw and save as `<stem>.png` and `<stem>.pdf`."""
    fig = gantt_figure(timeline, title, time_unit_s, devices, unit_name)
    return save_figure(fig, stem, _margins(_rows(timeline, devices)))
