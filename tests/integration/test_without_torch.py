"""fit, simulate, plan and analytic profiles import and run with torch made
unimportable (the `measure` extra not installed); the measuring commands say how to
get it, in one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.fixture()
def no_torch(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = str(shim)
    work = tmp_path / "work"
    work.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "paraplan", *args, "--no-track"], cwd=work, env=env,
                              capture_output=True, text=True, timeout=300)

    check = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert check.returncode != 0 and "torch" in check.stderr
    return run, work


def test_computing_stages_run_without_torch(no_torch, data_dir):
    run, work = no_torch
    log = data_dir / "nccl-tests/04_gh200_alps_2node_1gpu_all_reduce.txt"
    steps = [
        ("ingest", "--format", "nccl-tests", str(log), "-o", "ar.csv"),
        ("fit", "ar.csv", "-o", "cm.json"),
        ("simulate", "--study", "schedules", "-o", "sim", "--repeats", "1", "--no-plots"),
        ("profile", "--model", "gpt", "--analytic", "--cluster", "dgx-a100", "--profile-batch-size", "8",
         "-o", "gpt.csv"),
        ("plan", "--profile", "gpt.csv", "--cluster", "dgx-a100", "--global-batch-sizes", "8,16", "--jobs", "1",
         "-o", "plan.csv"),
        ("fit", "--kind", "kernels", str(data_dir / "published/gemm/mamf_best_shapes_bf16.csv"),
         str(data_dir / "published/attention/flash2_fwd_bwd.csv"), "--cluster", "dgx-a100", "-o", "a100.json"),
    ]
    for step in steps:
        out = run(*step)
        assert out.returncode == 0, f"{step[0]}: {out.stderr[-2000:]}"
    assert len((work / "sim/results.csv").read_text().splitlines()) == 1 + 18
    assert (work / "plan.csv").read_text().startswith("gbs,")
    assert '"fits"' in (work / "cm.json").read_text()
    assert '"attention_fwd_efficiency"' in (work / "a100.json").read_text()


def test_measuring_stages_name_the_extra(no_torch):
    run, _ = no_torch
    for args in (("bench", "-o", "b"), ("profile", "--model", "mlp", "-o", "m.csv")):
        out = run(*args)
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "pip install 'paraplan[measure]'" in lines[0], out.stderr


def test_the_default_pytest_passes_without_torch(tmp_path, repo_root):
    """`pytest` (tests/unit) on a machine without the measure extra: tests that need torch
    skip, nothing fails to import. (A package that raises ModuleNotFoundError stands for
    the missing torch: a None in sys.modules would trip scipy's array-API checks, which a
    machine without torch never meets.)"""
    shim = tmp_path / "shim"
    (shim / "torch").mkdir(parents=True)
    missing = "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
    (shim / "torch" / "__init__.py").write_text(missing)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = os.pathsep.join([str(shim), str(repo_root / "src")])
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/unit"],
                          cwd=repo_root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1] and " skipped" in done.stdout.splitlines()[-1]
