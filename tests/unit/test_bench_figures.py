"""The bench figures drawn after the measurement (`paraplan bench-figures`, the
workflow's bench_figures rule) are the ones the measuring job drew before: the same
bytes from the CSV as from the frame in memory, an empty host included; a CSV without a
column the figure reads is one error line naming it; a fixed layout (`Margins`) puts the
axes where its inches say."""

from __future__ import annotations

import pandas as pd

from paraplan.cli.main import main
from paraplan.files import write_csv
from paraplan.plots.bench import bench_figure
from paraplan.plots.style import Margins, new_figure


def _frame(host: str) -> pd.DataFrame:
    sizes = [1024, 4096, 16384]
    times = [10.0, 20.0, 55.0]
    return pd.DataFrame({
        "collective": ["all_reduce"] * 3, "backend": ["gloo"] * 3, "world_size": [2] * 3, "host": [host] * 3,
        "size_bytes": sizes, "time_us": times, "time_p10_us": [t * 0.9 for t in times],
        "time_p90_us": [t * 1.2 for t in times],
        "busbw_GBps": [s / t / 1e3 for s, t in zip(sizes, times, strict=True)],
        "algbw_GBps": [s / t / 1e3 for s, t in zip(sizes, times, strict=True)],
    })


def test_figures_from_the_csv_are_the_measuring_jobs_figures(tmp_path):
    for host in ("node-1", ""):
        frame = _frame(host)
        csv = tmp_path / f"all_reduce_n2{host}.csv"
        write_csv(csv, frame)
        expected = bench_figure(frame, tmp_path / "in-memory")
        assert main(["bench-figures", str(csv), "--plots", str(tmp_path / "figs"), "--no-track"]) == 0
        drawn = [tmp_path / "figs" / f"{csv.stem}{suffix}" for suffix in (".png", ".pdf")]
        for a, b in zip(expected, drawn, strict=True):
            assert a.read_bytes() == b.read_bytes(), (host, b.name)


def test_a_csv_without_a_figure_column_is_one_error_line(tmp_path, capsys):
    csv = tmp_path / "all_reduce_n2.csv"
    write_csv(csv, _frame("h").drop(columns=["time_p90_us"]))
    assert main(["bench-figures", str(csv), "--plots", str(tmp_path / "figs"), "--no-track"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "time_p90_us" in err[0] and err[0].startswith(f"paraplan bench-figures: error: {csv}")
    assert not (tmp_path / "figs").exists() or not any((tmp_path / "figs").iterdir())


def test_margins_place_the_axes_by_inches():
    fig, _ = new_figure(10.0, 4.0, ncols=2)
    Margins(left_in=1.0, right_in=0.5, bottom_in=0.8, top_in=0.4, wspace=0.3).apply(fig)
    pars = fig.subplotpars
    assert (pars.left, pars.right, pars.bottom, pars.top, pars.wspace) == (0.1, 0.95, 0.2, 0.9, 0.3)
