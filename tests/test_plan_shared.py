"""Sanity against the DAPPLE paper on the shared PipeDream profiles (DAPPLE's V100
constants: 16 GB, 25 GB/s inside a machine, 3 GB/s across), and the plan command."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from paraplan.clusters import load_cluster
from paraplan.plan.comm_constants import DappleConstantsModel
from paraplan.plan.problem import MemorySettings
from paraplan.plan.search import plan_hybrid
from paraplan.plan.sweep import COLUMNS, PlanSettings, plan_batch


def _settings(shared_dir, name, shape=(2, 8), peak=None, verify=False):
    from paraplan.profile.pipedream import read_pipedream

    profile = read_pipedream(shared_dir / "data/pipedream-profiles" / f"{name}.txt")
    cluster = load_cluster("dgx1-v100").with_shape(*shape)
    return PlanSettings(profile, cluster, DappleConstantsModel(), MemorySettings(16e9, 2.0, peak),
                        profile.batch_size, verify=verify)


@pytest.mark.parametrize("shape", [(2, 8), (16, 1)])
def test_vgg19_uneven_two_stage_plan(shared_dir, shape):
    # DAPPLE's released plan for VGG-19 on 16 GPUs is 15:1: the convolutions replicated,
    # the 470 MB of fully connected layers on one GPU with no all-reduce
    settings = _settings(shared_dir, "vgg-19-pbs-32", shape)
    plan = plan_hybrid(settings.problem(2048))[0]
    assert plan.num_stages == 2
    assert tuple(s.replicas for s in plan.stages) == (15, 1)
    assert plan.stages[1].first_layer >= 16  # the FC layers (after the last conv) on one GPU


def test_xlnet36_two_stages(shared_dir):
    settings = _settings(shared_dir, "xlnet-36-pbs-1")
    plan = plan_hybrid(settings.problem(2048))[0]
    assert plan.num_stages == 2
    assert 15 <= plan.stages[1].first_layer <= 25  # the paper splits at layer 19 of 42


@pytest.mark.parametrize("name", ["vgg-19-pbs-32", "gnmt-16-pbs-64", "amoeba-18-pbs-8"])
def test_hybrid_beats_every_data_parallel_baseline(shared_dir, name):
    row = plan_batch(_settings(shared_dir, name, verify=True), 128)  # the paper compares at 128
    assert row.best_hybrid > max(row.dp_no_overlap, row.dp_overlap, row.dp_p3)
    assert row.dp_p3 >= row.dp_overlap * (1 - 1e-9)  # P3 is never slower than normal overlap
    assert row.dp_p3 == pytest.approx(row.dp_p3_est, rel=0.05)  # simulated P3 beside its estimate
    assert row.best_hybrid_est > max(row.dp_no_overlap_est, row.dp_overlap_est, row.dp_p3_est)
    assert abs(row.hybrid_est_vs_sim) < 0.25


@pytest.mark.slow
def test_plan_command(shared_dir, tmp_path):
    out = tmp_path / "vgg.csv"
    cmd = [sys.executable, "-m", "paraplan.cli.main", "plan",
           "--profile", str(shared_dir / "data/pipedream-profiles/vgg-19-pbs-32.txt"),
           "--cluster", "2x8", "--gbs", "64,128", "-o", str(out), "--plots", str(tmp_path),
           "--jobs", "2", "--no-track"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    frame = pd.read_csv(out)
    assert list(frame.columns) == list(COLUMNS)
    assert frame["gbs"].tolist() == [64, 128]
    assert frame["dp_p3"].notna().all()  # simulated, the estimate dp_p3_est beside it
    assert (frame["dp_p3"] >= frame["dp_overlap"] * (1 - 1e-9)).all()
    assert (frame["best_hybrid"] > frame["dp_overlap"]).all()
    assert frame["stages"].str.match(r"^\[\d+-\d+\]x\d+( \| \[\d+-\d+\]x\d+)*$").all()
    assert (tmp_path / "vgg.png").is_file() and (tmp_path / "vgg.pdf").is_file()


@pytest.mark.slow
def test_plan_command_bad_input_is_a_clean_error(tmp_path):
    cmd = [sys.executable, "-m", "paraplan.cli.main", "plan", "--profile", str(tmp_path / "none.csv"),
           "--gbs-range", "32:16:8", "-o", str(tmp_path / "x.csv"), "--no-track"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "gbs-range" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.slow
def test_plan_command_nothing_fits(shared_dir, tmp_path):
    # GNMT-16's 1.16 GB of parameters x 2 do not fit 1 GB devices: an error, no CSV
    cmd = [sys.executable, "-m", "paraplan.cli.main", "plan",
           "--profile", str(shared_dir / "data/pipedream-profiles/gnmt-16-pbs-64.txt"),
           "--cluster", "1x2", "--gbs", "64", "--memory-gb", "1", "-o", str(tmp_path / "x.csv"), "--no-track"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "no plan fits in 1 GB per device" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.csv").exists()
