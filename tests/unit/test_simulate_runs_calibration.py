"""`paraplan simulate --runs` times a run table with the calibration `paraplan predict`
uses (the one made for the cluster's device), so its timelines are predict's numbers on
every cluster: on dgx-h100 it used a100-vtrain, 13.0 s where predict says 15.9 s for
config/runs/llm_h100.csv's first run."""

import csv
import json

import pytest

from paraplan.cli.main import main


def test_h100_timelines_use_predicts_calibration(tmp_path, repo_root):
    runs = repo_root / "config/runs/llm_h100.csv"
    predicted, out = tmp_path / "pred.csv", tmp_path / "timelines"
    assert main(["predict", str(runs), "--cluster", "dgx-h100", "-o", str(predicted), "--no-track"]) == 0
    assert main(["simulate", "--runs", str(runs), "--cluster", "dgx-h100", "-o", str(out), "--no-plots",
                 "--no-track"]) == 0
    summary = json.loads((out / "timelines.json").read_text())
    assert summary["calibration"].startswith("h100-transfer@")
    with predicted.open() as handle:
        expected = {r["name"]: float(r["predicted_iteration_s"]) for r in csv.DictReader(handle)}
    assert {r["name"]: pytest.approx(expected[r["name"]], rel=1e-5) for r in summary["runs"]} == expected
