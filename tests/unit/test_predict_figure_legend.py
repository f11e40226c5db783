"""The predicted-runs figure's 'does not fit device memory' key sits above the bars: in
the lower right it covered the last run's bar and value, and its proxy was a bar of
its own drawn at 0."""

import numpy as np

import paraplan.plots.predict as plots


def test_the_key_hides_no_bar(tmp_path, monkeypatch):
    captured = {}

    def keep(fig, stem):
        captured["fig"] = fig
        return []

    monkeypatch.setattr(plots, "save_figure", keep)
    plots.plot_predicted_runs(["a", "b", "c"], np.array([6.4, 2.8, 4.35]), np.array([0.498, 0.291, 0.294]),
                              [False, True, False], tmp_path / "runs", "title")
    fig = captured["fig"]
    ax = fig.axes[1]
    fig.canvas.draw()
    key = ax.get_legend().get_window_extent()
    assert key.y0 >= ax.get_window_extent().y1  # above the plotting area
    assert len(ax.patches) == 3  # the three runs' bars, no proxy bar
