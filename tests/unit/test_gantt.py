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
    """Label positions (data x, row) -> how many labels are drawn there."""
    at: Counter[tuple[float, float]] = Counter()
    for c in fig.axes[0].collections:
        if isinstance(c, PathCollection):
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
    numbers = sorted(int(c.get_offsets().shape[0]) for c in fig.axes[0].collections if isinstance(c, PathCollection))
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
