"""Figures: a rerun writes the same bytes (no creation date or software version in a
PDF or PNG), a dot in a name stays in the file name, and `paraplan predict --plots`
draws a figure for every table, measured or not (issue 21: PDFs embedded their
creation date; two predict figure folders came out empty)."""

from __future__ import annotations

import time

from paraplan.cli.main import main
from paraplan.plots.style import new_figure, save_figure


def _draw(stem):
    fig, axes = new_figure(4, 3)
    axes[0][0].plot([1, 2, 3], [3, 1, 2], label="a line")
    axes[0][0].legend()
    axes[0][0].set_title("the same figure")
    return save_figure(fig, stem)


def test_a_figure_saved_twice_is_byte_identical(tmp_path):
    first = _draw(tmp_path / "one")
    time.sleep(1.1)  # a PDF creation date has whole seconds
    second = _draw(tmp_path / "two")
    assert [p.suffix for p in first] == [".png", ".pdf"]
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.suffix
    pdf = first[1].read_bytes()
    assert b"CreationDate" not in pdf and b"Matplotlib" not in pdf
    assert b"Matplotlib" not in first[0].read_bytes()


def test_a_dot_in_the_stem_stays_in_the_file_name(tmp_path):
    paths = _draw(tmp_path / "gpt3-1.3b")
    assert [p.name for p in paths] == ["gpt3-1.3b.png", "gpt3-1.3b.pdf"]


def test_predict_draws_every_table_even_without_measured_times(repo_root, tmp_path):
    figures = tmp_path / "figures"
    assert main(["predict", str(repo_root / "config/runs/llm_h100.csv"), "--cluster", "dgx-h100", "-o",
                 str(tmp_path / "p.csv"), "--plots", str(figures), "--no-track"]) == 0
    assert sorted(p.name for p in figures.iterdir()) == ["llm_h100_predicted.pdf", "llm_h100_predicted.png"]
