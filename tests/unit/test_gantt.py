"""Gantt charts (`paraplan.plots.gantt`): every compute event is drawn as one block where
the timeline puts it, in its kind's colour, and its micro-batch number is drawn on it
wherever the number fits (the charts are drawn as a few collections, not an artist per
event: a regression that drops events or labels fails here)."""

from __future__ import annotations

from collections import Counter

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.colors import to_rgba

from paraplan.plots.gantt import gantt_figure, save_gantt
from paraplan.sim import simulate_pipeline


def _blocks(fig) -> PolyCollection:
    (blocks,) = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    return blocks


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
    paths = _blocks(fig).get_paths()
    assert len(paths) == tl.num_events == 48
    corners = np.array([p.vertices[[0, 2]] for p in paths])  # (x0, y0), (x1, y1) per block
    np.testing.assert_allclose(corners[:, 0, 0], tl.start_s)
    np.testing.assert_allclose(corners[:, 1, 0], tl.end_s)
    np.testing.assert_allclose(corners[:, 0, 1], tl.device - 0.5)
    np.testing.assert_allclose(corners[:, 1, 1], tl.device + 0.5)
    # every block is at least one unit step (0.32 in) wide: all 48 numbers are drawn, centred
    labels = _labels(fig)
    assert sum(labels.values()) == 48
    assert set(labels) == {((s + e) / 2, float(d)) for s, e, d in zip(tl.start_s, tl.end_s, tl.device, strict=True)}
    # forward blue, backward (input) green, weight-gradient khaki
    faces = {tuple(f) for f in _blocks(fig).get_facecolor()}
    assert faces == {to_rgba("royalblue"), to_rgba("lightgreen"), to_rgba("khaki")}
    plt.close(fig)


def test_a_block_too_narrow_for_its_number_is_drawn_without_it():
    # 1F1B, 2 stages, 2 micro-batches: 1 s forwards, 0.01 s backwards (0.2 pt wide on the chart)
    tl = simulate_pipeline("1f1b", 2, 2, 1.0, 0.01)
    fig = gantt_figure(tl)
    assert len(_blocks(fig).get_paths()) == tl.num_events == 8
    forward = tl.kind == 0
    assert sum(_labels(fig).values()) == int(forward.sum()) == 4
    assert set(_labels(fig)) == {((s + e) / 2, float(d)) for s, e, d in
                                 zip(tl.start_s[forward], tl.end_s[forward], tl.device[forward], strict=True)}
    plt.close(fig)


def test_interleaved_odd_chunks_are_darker_and_numbers_count_across_iterations():
    tl = simulate_pipeline("interleaved_1f1b", 2, 4, 1.0, 2.0, virtual_stages=2, iterations=2)
    fig = gantt_figure(tl, devices=[1, 0])  # rows in the order given
    blocks = _blocks(fig)
    assert len(blocks.get_paths()) == tl.num_events == 2 * 2 * 4 * 2 * 2
    first = np.array([p.vertices[0] for p in blocks.get_paths()])
    np.testing.assert_allclose(first[:, 1], np.where(tl.device == 1, 0, 1) - 0.5)
    faces = Counter(tuple(f) for f in blocks.get_facecolor())
    assert faces == {to_rgba(c): 16 for c in ("royalblue", "navy", "lightgreen", "mediumseagreen")}
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
