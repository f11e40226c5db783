"""Config values reach shell commands only quoted: a fit.logs path holding quotes, a
semicolon and a command goes through the real ingest and fit_log rules as one
argument, and nothing of it runs. Also runs with tracking off (mlflow.enabled)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

HOSTILE = """it's "odd"; touch PWNED; echo $(touch PWNED2) `touch PWNED3`.txt"""


def test_a_config_path_with_quotes_and_a_semicolon_is_one_argument(repo_root, data_dir, tmp_path):
    for name in ("Snakefile", "workflow", "config", "profiles", "environment.yml"):
        source = repo_root / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, tmp_path / name)
    log = tmp_path / "logs" / HOSTILE
    log.parent.mkdir()
    shutil.copyfile(data_dir / "nccl-tests/04_gh200_alps_2node_1gpu_all_reduce.txt", log)
    (tmp_path / "q.yaml").write_text(yaml.safe_dump({
        "mlflow": {"enabled": False},
        "fit": {"logs": [{"name": "odd", "path": f"logs/{HOSTILE}", "format": "nccl-tests",
                          "collective": "all_reduce"}]},
    }))
    exe = shutil.which("snakemake") or str(Path(sys.executable).parent / "snakemake")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PARAPLAN_INVOCATION_ID",
                                                              "PARAPLAN_TRACKING")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run([exe, "--configfile", "q.yaml", "-c1", "results/fits/odd/comm_model.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    fits = json.loads((tmp_path / "results/fits/odd/comm_model.json").read_text())["fits"]
    assert {(f["collective"], f["world_size"], f["nodes"]) for f in fits} == {("all_reduce", 2, 2)}
    ingest_log = (tmp_path / "results/logs/ingest/odd.log").read_text()
    assert HOSTILE in ingest_log  # the importer saw the whole name as one path
    assert not list(tmp_path.rglob("PWNED*"))
    # tracking off: no store was created, and the jobs said nothing about MLflow runs
    assert not (tmp_path / "mlflow.db").exists()
    assert "logged MLflow run" not in ingest_log
