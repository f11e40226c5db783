"""End to end: the workflow runs in a fresh directory on a tiny config, logs the
expected MLflow runs, does nothing the second time, and a changed config value
reruns exactly the stages that depend on it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

TINY = {
    "bench": {
        "world_sizes": [2],
        "collectives": ["all_reduce", "all_gather"],
        "min_bytes": 1024,
        "max_bytes": 65536,
        "factor": 4,
        "warmup": 1,
        "iters": 3,
    },
    "profile": {
        "repeats": 2,
        "warmup": 1,
        "models": {
            "mlp": {"model": "mlp", "profile_batch_sizes": [4, 8],
                    "settings": {"num_layers": 2, "input_dim": 64, "hidden_dim": 64, "output_dim": 64}},
            # the default's models merge in by name: keep gpt, but tiny
            "gpt": {"model": "gpt", "profile_batch_sizes": [2, 4],
                    "settings": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 2, "seq_length": 16,
                                 "vocab_size": 64}},
        },
    },
    "simulate": {"studies": ["schedules"], "repeats": 1},
    "validate": {"steps": 3, "warmup": 1,
                 "models": {"mlp": {"global_batch_size": 8, "num_microbatches": 2},
                            "gpt": {"global_batch_size": 4, "num_microbatches": 2}}},
}


def _snakemake(workdir: Path, *args: str, timeout: int = 900, config: str = "tiny.yaml") -> subprocess.CompletedProcess:
    exe = shutil.which("snakemake") or str(Path(sys.executable).parent / "snakemake")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PARAPLAN_INVOCATION_ID")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([exe, "--configfile", config, *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _job_counts(stdout: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run: rule -> job count."""
    counts = {}
    in_table = False
    for line in stdout.splitlines():
        if line.startswith("Job stats"):
            in_table = True
            continue
        match = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if in_table and match and match.group(1) != "total":
            counts[match.group(1)] = int(match.group(2))
        elif in_table and line.strip().startswith("total"):
            break
    return counts


@pytest.fixture(scope="module")
def workflow_dir(tmp_path_factory, repo_root):
    work = tmp_path_factory.mktemp("wf")
    for name in ("Snakefile", "workflow", "config", "profiles", "environment.yml"):
        src = repo_root / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, work / name)
    (work / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    first = _snakemake(work)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    return work


def _runs(workdir: Path, stage: str):
    import mlflow

    client = mlflow.tracking.MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name(f"paraplan-{stage}")
    assert exp is not None, f"no experiment paraplan-{stage}"
    return client.search_runs([exp.experiment_id], max_results=1000)


def test_outputs_exist(workflow_dir):
    for path in ("results/collectives/local-cpu/all_reduce_n2.csv",
                 "results/collectives/local-cpu/all_gather_n2.csv",
                 "results/fits/local-cpu/comm_model.json",
                 "results/profiles/mlp.csv",
                 "results/simulations/schedules/results.csv",
                 "results/validation/mlp.csv",
                 "results/validation/gpt.csv",
                 "results/summary.md"):
        assert (workflow_dir / path).is_file(), path
    assert (workflow_dir / "results/figures/bench/local-cpu/all_reduce_n2.png").stat().st_size > 0


def test_mlflow_runs_are_tagged_and_summarised(workflow_dir):
    bench = _runs(workflow_dir, "bench")
    # one job per world size, one run per collective it measured
    assert sorted((r.info.run_name, r.data.tags["wildcards"], r.data.tags["collective"]) for r in bench) == [
        ("all_gather_n2", "cluster=local-cpu,world=2", "all_gather"),
        ("all_reduce_n2", "cluster=local-cpu,world=2", "all_reduce"),
    ]
    # every job's record was logged at the workflow's end, and removed
    assert not list((workflow_dir / ".paraplan/runs").glob("*.json"))
    assert {r.data.tags["rule"] for r in bench} == {"bench"}
    assert all(r.data.metrics["peak_busbw_GBps"] > 0 for r in bench)
    invocations = {r.data.tags["invocation_id"] for r in bench}
    assert len(invocations) == 1
    for stage in ("fit", "profile", "simulate", "validate", "report"):
        runs = _runs(workflow_dir, stage)  # one run per job, no child runs
        assert runs and not any("mlflow.parentRunId" in r.data.tags for r in runs), stage
        assert {r.data.tags["invocation_id"] for r in runs} == invocations, stage
    summary = _runs(workflow_dir, "invocation")
    assert len(summary) == 1
    assert summary[0].data.tags["invocation_id"] in invocations
    assert any(k.startswith("run.bench.") for k in summary[0].data.tags)


def test_second_run_does_nothing_and_logs_nothing(workflow_dir):
    before = len(_runs(workflow_dir, "bench")), len(_runs(workflow_dir, "invocation"))
    again = _snakemake(workflow_dir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Nothing to be done" in again.stdout + again.stderr
    assert (len(_runs(workflow_dir, "bench")), len(_runs(workflow_dir, "invocation"))) == before


def _changed(workdir: Path, stage: str, key: str, value) -> str:
    """A copy of the tiny config with one value changed; returns its file name."""
    config = yaml.safe_load((workdir / "tiny.yaml").read_text())
    config[stage][key] = value
    name = f"tiny_{stage}_{key}.yaml"
    (workdir / name).write_text(yaml.safe_dump(config))
    return name


def test_changed_bench_value_reruns_bench_and_its_dependents_only(workflow_dir):
    out = _snakemake(workflow_dir, "-n", config=_changed(workflow_dir, "bench", "iters", 4))
    assert out.returncode == 0, out.stderr[-3000:]
    counts = _job_counts(out.stdout)
    assert counts.get("bench") == 1 and counts.get("fit") == 1 and counts.get("report") == 1
    assert "profile" not in counts and "simulate" not in counts


def test_changed_profile_value_does_not_rerun_bench(workflow_dir):
    out = _snakemake(workflow_dir, "-n", config=_changed(workflow_dir, "profile", "repeats", 3))
    assert out.returncode == 0, out.stderr[-3000:]
    counts = _job_counts(out.stdout)
    assert counts.get("profile") == 2 and counts.get("validate") == 2  # mlp and gpt
    assert counts.get("report") == 1
    assert {"bench", "fit", "simulate"}.isdisjoint(counts)


def test_rerun_one_stage_alone(workflow_dir):
    out = _snakemake(workflow_dir, "-n", "-R", "bench", "--until", "bench")
    counts = _job_counts(out.stdout)
    assert counts == {"bench": 1}, out.stdout[-2000:]


def test_report_html(workflow_dir):
    out = _snakemake(workflow_dir, "--report", "results/report.html")
    assert out.returncode == 0, out.stderr[-3000:]
    html = (workflow_dir / "results/report.html").read_text(errors="replace")
    assert "all_reduce_n2.png" in html
