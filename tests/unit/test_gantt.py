"""Gantt charts (`paraplan.plots.gantt`): every compute event is drawn as one block where
the timeline puts it, in its kind's colour, and its micro-batch number is drawn on it
wherever the number fits (the charts are drawn as a patch per colour and a few
collections, not an artist per event: a regression that drops events or labels fails here)."""

from __future__ import annotations

from collections import Counter

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.colors import to_rgba
from matplotlib.path import Path

from paraplan.plots.gantt import gantt_figure, save_gantt
from paraplan.sim import simulate_pipeline


def _blocks(fig) -> tuple[np.ndarray, list[tuple[float, ...]]]:
    """Every rectangle drawn, as rows (x0, x1, y0, y1) sorted, and the face colour of each
    (in the same order): the blocks' patches hold one closed rectangle per event."""
    rows, faces = [], []
    for patch in fig.axes[0].patches:
        path = patch.get_path()
        assert list(path.codes) == [Path.MOVETO, *[Path.LINETO] * 3, Path.CLOSEPOLY] * (len(path.vertices) // 5)
        corners = path.vertices.reshape(-1, 5, 2)
        rows += [(c[0, 0], c[2, 0], c[0, 1], c[2, 1]) for c in corners]
        faces += [tuple(patch.get_facecolor())] * len(corners)
    order = np.lexsort(np.array(rows).T[::-1]) if rows else np.zeros(0, dtype=int)
    return np.array(rows)[order], [faces[i] for i in order]


def _events(tl, rows: np.ndarray) -> np.ndarray:
    """The timeline's compute events as the rectangles (x0, x1, y0, y1) they should be, sorted."""
    events = np.column_stack([tl.start_s, tl.end_s, rows - 0.5, rows + 0.5])
    return events[np.lexsort(events.T[::-1])]


def _labels(fig) -> Counter[tuple[float, float]]:
    """Label positions (data x, row) -> how many micro-batch numbers are drawn there (the
    time axis' numbers, outside the axes, are not clipped)."""
    at: Counter[tuple[float, float]] = Counter()
    for c in fig.axes[0].collections:
        if isinstance(c, PathCollection) and c.get_clip_on():
            at.update((float(x), float(y)) for x, y in np.asarray(c.get_offsets()))
    return at


def test_every_zb_h1_op_is_one_block_at_its_times_with_its_number():
    tl = simulate_pipeline("zb_h1", 4, 4, 1.0, 2.0)  # 4 stages x 4 micro-batches x F, B, W
    fig = gantt_figure(tl)
    blocks, faces = _blocks(fig)
    assert len(blocks) == tl.num_events == 48
    np.testing.assert_allclose(blocks, _events(tl, tl.device))
    # every block is at least one unit step (0.32 in) wide: all 48 numbers are drawn, centred
    labels = _labels(fig)
    assert sum(labels.values()) == 48
    assert set(labels) == {((s + e) / 2, float(d)) for s, e, d in zip(tl.start_s, tl.end_s, tl.device, strict=True)}
    # forward blue, backward (input) green, weight-gradient khaki
    assert Counter(faces) == {to_rgba("royalblue"): 16, to_rgba("lightgreen"): 16, to_rgba("khaki"): 16}
    plt.close(fig)


def test_a_block_too_narrow_for_its_number_is_drawn_without_it():
    # 1F1B, 2 stages, 2 micro-batches: 1 s forwards, 0.01 s backwards (0.2 pt wide on the chart)
    tl = simulate_pipeline("1f1b", 2, 2, 1.0, 0.01)
    fig = gantt_figure(tl)
    np.testing.assert_allclose(_blocks(fig)[0], _events(tl, tl.device))
    assert tl.num_events == 8
    forward = tl.kind == 0
    assert sum(_labels(fig).values()) == int(forward.sum()) == 4
    assert set(_labels(fig)) == {((s + e) / 2, float(d)) for s, e, d in
                                 zip(tl.start_s[forward], tl.end_s[forward], tl.device[forward], strict=True)}
    plt.close(fig)


def test_interleaved_odd_chunks_are_darker_and_numbers_count_across_iterations():
    tl = simulate_pipeline("interleaved_1f1b", 2, 4, 1.0, 2.0, virtual_stages=2, iterations=2)
    fig = gantt_figure(tl, devices=[1, 0])  # rows in the order given
    blocks, faces = _blocks(fig)
    assert len(blocks) == tl.num_events == 2 * 2 * 4 * 2 * 2
    np.testing.assert_allclose(blocks, _events(tl, np.where(tl.device == 1, 0, 1)))
    assert Counter(faces) == {to_rgba(c): 16 for c in ("royalblue", "navy", "lightgreen", "mediumseagreen")}
    numbers = sorted(int(c.get_offsets().shape[0]) for c in fig.axes[0].collections
                     if isinstance(c, PathCollection) and c.get_clip_on())
    assert numbers == [8] * 8  # micro-batches 1..8 over two iterations, 2 devices x 2 chunks x F, B each
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["worker-1", "worker-0"]
    plt.close(fig)


@pytest.mark.parametrize("events", [0, 48])
def test_gantt_saves_png_and_pdf(tmp_path, events):
    tl = simulate_pipeline("zb_h1", 4, 4, 1.0, 2.0)
    # a device list with no compute events draws an empty row
    paths = save_gantt(tl, tmp_path / "zb", devices=[7] if events == 0 else None)
    assert [p.suffix for p in paths] == [".png", ".pdf"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_the_step_axis_has_a_tick_and_number_per_step_and_its_label_where_matplotlib_puts_it():
    from matplotlib.lines import Line2D

    from paraplan.plots.gantt import _margins
    from paraplan.plots.style import new_figure

    tl = simulate_pipeline("zb_h1", 4, 4, 1.0, 2.0)  # 15 steps: ticks 0..15
    fig = gantt_figure(tl)
    ax = fig.axes[0]
    (ticks,) = [a for a in ax.get_children() if isinstance(a, Line2D) and a.get_marker() is not None
                and len(a.get_xdata()) > 1]
    assert list(ticks.get_xdata()) == list(range(16))
    numbers = [c for c in ax.collections if isinstance(c, PathCollection) and not c.get_clip_on()]
    assert len(numbers) == 1 and len(numbers[0].get_paths()) == 16
    # the same chart with matplotlib's own axis (one Tick artist per step) places the axis label
    ref, axes = new_figure(*fig.get_size_inches())
    _margins([0, 1, 2, 3]).apply(ref)
    axes[0, 0].set_xlim(ax.get_xlim())
    axes[0, 0].set_xticks(range(16))
    axes[0, 0].set_xlabel("time (steps)")
    for f in (fig, ref):
        f.canvas.draw()  # places the axis label
    ours, theirs = (f.axes[0].xaxis.label.get_window_extent() for f in (fig, ref))
    assert ours.y0 == pytest.approx(theirs.y0, abs=0.5) and ours.x0 == pytest.approx(theirs.x0, abs=0.5)
    plt.close(fig)
    plt.close(ref)
