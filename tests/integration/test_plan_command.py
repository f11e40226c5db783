"""`paraplan plan` as a command on the shared PipeDream profiles."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd

from paraplan.plan.hybrid.sweep import COLUMNS


def test_plan_command(data_dir, tmp_path):
    out = tmp_path / "vgg.csv"
    cmd = [sys.executable, "-m", "paraplan.cli.main", "plan",
           "--profile", str(data_dir / "pipedream-profiles/vgg-19-pbs-32.txt"),
           "--shapes", "2x8", "--global-batch-sizes", "64,128", "-o", str(out), "--plots", str(tmp_path),
           "--jobs", "2", "--no-track"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    frame = pd.read_csv(out)
    assert list(frame.columns) == list(COLUMNS)
    assert frame["gbs"].tolist() == [64, 128]
    assert frame["dp_p3"].notna().all()  # simulated, the estimate dp_p3_est beside it
    assert (frame["dp_p3"] >= frame["dp_overlap"] * (1 - 1e-9)).all()
    assert (frame["best_hybrid"] > frame["dp_overlap"]).all()
    # the best is the best of the hybrid plans and the baselines, never slower than one
    baselines = frame[["dp_no_overlap", "dp_overlap", "dp_p3"]].max(axis=1)
    assert (frame["best_hybrid"] >= baselines * (1 - 1e-12)).all()
    assert frame["stages"].str.match(r"^\[\d+-\d+\]x\d+( \| \[\d+-\d+\]x\d+)*( sync=(overlap|p3))?$").all()
    assert (tmp_path / "vgg.png").is_file() and (tmp_path / "vgg.pdf").is_file()


def test_plan_command_bad_input_is_a_clean_error(tmp_path):
    cmd = [sys.executable, "-m", "paraplan.cli.main", "plan", "--profile", str(tmp_path / "none.csv"),
           "--global-batch-sizes", "32:16:8", "-o", str(tmp_path / "x.csv"), "--no-track"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == ("paraplan plan: error: option --global-batch-sizes: expected 1 <= A <= B "
                                            "and S >= 1 in A:B:S, got '32:16:8'"), done.stderr
    assert not (tmp_path / "x.csv").exists()


def test_plan_command_nothing_fits(data_dir, tmp_path):
    # GNMT-16's 1.16 GB of parameters x 2 do not fit 1 GB devices: an error, no CSV
    cmd = [sys.executable, "-m", "paraplan.cli.main", "plan",
           "--profile", str(data_dir / "pipedream-profiles/gnmt-16-pbs-64.txt"),
           "--shapes", "1x2", "--global-batch-sizes", "64", "--memory-gb", "1", "-o", str(tmp_path / "x.csv"),
           "--no-track"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "no plan fits in 1 GB per device" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.csv").exists()
