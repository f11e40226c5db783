"""Dry runs of the SLURM workflow profile: GPUs per job from the config."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


def _slurm_dry_run(repo_root, tmp_path, config: dict | None = None) -> dict[str, list[dict[str, str]]]:
    """`snakemake -n` with the SLURM profile: rule -> the jobs' threads and resources."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    for name in ("Snakefile", "workflow", "config", "profiles", "environment.yml"):
        source = repo_root / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, tmp_path / name)
    (tmp_path / "extra.yaml").write_text(yaml.safe_dump(config or {}))
    exe = shutil.which("snakemake") or str(Path(sys.executable).parent / "snakemake")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PARAPLAN_INVOCATION_ID")}
    out = subprocess.run([exe, "--workflow-profile", "workflow/profiles/slurm", "-n", "--configfile", "extra.yaml"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    jobs: dict[str, list[dict[str, str]]] = {}
    for block in re.split(r"\n(?=rule \w+:)", out.stdout)[1:]:
        rule = block.split(":", 1)[0].removeprefix("rule ")
        threads = re.search(r"^\s+threads: (\d+)", block, re.M)
        resources = re.search(r"^\s+resources: (.*)$", block, re.M)
        fields = dict(item.split("=", 1) for item in resources.group(1).split(", ")) if resources else {}
        jobs.setdefault(rule, []).append({**fields, "threads": threads.group(1) if threads else "1"})
    return jobs


def test_slurm_profile_dry_run_asks_no_gpu_for_gloo(repo_root, tmp_path):
    jobs = _slurm_dry_run(repo_root, tmp_path)
    assert len(jobs["bench"]) == 2 and len(jobs["validate"]) == 2  # one bench job per world size
    for rule in ("bench", "profile", "validate"):
        assert {job["gpu"] for job in jobs[rule]} == {"0"}, rule
    # the planner's sweep gets the threads the profile gives it, not a --cores cap
    assert {job["threads"] for job in jobs["plan_measured"]} == {"16"}
    assert {job["cpus_per_task"] for job in jobs["plan_measured"]} == {"16"}


def test_slurm_profile_dry_run_asks_one_gpu_per_nccl_rank(repo_root, tmp_path):
    jobs = _slurm_dry_run(repo_root, tmp_path, {"bench": {"backend": "nccl", "world_sizes": [2, 8]},
                                                "validate": {"backend": "nccl"}})
    assert sorted({job["gpu"] for job in jobs["bench"]}) == ["2", "8"]
    assert {job["gpu"] for job in jobs["validate"]} == {"2"}
