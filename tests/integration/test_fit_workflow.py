"""The workflow's ingest and fit_log rules on a shared log listed in config
(fit.logs), run by Snakemake in a copy of the repository's workflow files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml


def test_ingest_and_fit_a_listed_log(repo_root, data_dir, tmp_path):
    for name in ("Snakefile", "workflow", "config", "profiles", "environment.yml"):
        source = repo_root / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, tmp_path / name)
    log = data_dir / "nccl-tests/04_gh200_alps_2node_1gpu_all_reduce.txt"
    (tmp_path / "logs.yaml").write_text(
        yaml.safe_dump({"fit": {"logs": [{"name": "gh200", "path": str(log), "format": "nccl-tests"}]}})
    )
    exe = shutil.which("snakemake") or str(Path(sys.executable).parent / "snakemake")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PARAPLAN_INVOCATION_ID")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    command = [exe, "--configfile", "config/config.yaml", "logs.yaml", "-c1", "results/fits/gh200/comm_model.json"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    csv = (tmp_path / "results/collectives/gh200/ingested.csv").read_text().splitlines()
    assert len(csv) == 1 + 8  # header + 8 sizes (1 MiB .. 128 MiB)
    fits = json.loads((tmp_path / "results/fits/gh200/comm_model.json").read_text())["fits"]
    assert {(f["collective"], f["world_size"], f["nodes"], f["tier"]) for f in fits} == {("all_reduce", 2, 2, "inter")}
    assert (tmp_path / "results/figures/fit/gh200/fit_all_reduce_n2.png").is_file()
    again = subprocess.run([*command, "-n"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "Nothing to be done" in again.stdout + again.stderr
