"""The `--config` overrides of docs/configuration.md work as written (Snakemake 9 hands nested values
over as text), and a config that cannot run here stops Snakemake with one line naming
the key before any job starts (issue 15)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def workdir(repo_root, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("workflow")
    for name in ("Snakefile", "workflow", "config", "profiles", "environment.yml"):
        source = repo_root / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, folder / name)
    return folder


def _dry_run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("snakemake") or str(Path(sys.executable).parent / "snakemake")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PARAPLAN_INVOCATION_ID")}
    return subprocess.run([exe, "-n", "--nolock", *args], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_readme_config_override_works_as_written(workdir):
    out = _dry_run(workdir, "--config", "bench={iters: 50, world_sizes: [2]}")
    assert out.returncode == 0, out.stderr[-3000:]
    bench = [line for line in out.stdout.splitlines() if line.startswith("Shell command: paraplan bench --backend")]
    (line,) = bench  # one job measures the six collectives at the one world size (the GEMM bench is --kind gemm)
    assert "--world-size 2 " in line and "--iters 50 " in line
    assert "--collectives all_reduce,all_gather,reduce_scatter,all_to_all,broadcast,all_to_allv " in line


def test_tracking_off_from_the_command_line(repo_root, tmp_path):
    """`mlflow={enabled: false}` on the command line: the simulate stage runs for real (about
    10 s) and writes its tables, and nothing reaches MLflow: no store at the tracking URI
    the environment names, none in the folder, no run records spooled for it."""
    from paraplan.studies.simulate import RESULT_COLUMNS

    folder = tmp_path / "workflow"
    folder.mkdir()
    for name in ("Snakefile", "workflow", "config", "profiles", "environment.yml"):
        source = repo_root / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, folder / name)
    store = tmp_path / "store" / "mlflow.db"
    store.parent.mkdir()
    exe = shutil.which("snakemake") or str(Path(sys.executable).parent / "snakemake")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PARAPLAN_INVOCATION_ID")}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{store}"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the jobs' `paraplan`
    out = subprocess.run([exe, "--nolock", "-c1", "--config", "mlflow={enabled: false}", "--until", "simulate_all"],
                         cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "paraplan: MLflow tracking is off (mlflow.enabled: false)" in out.stderr.splitlines()
    tables = sorted((folder / "results" / "simulations").glob("*/results.csv"))
    studies = sorted(p.stem for p in (folder / "config" / "studies" / "simulate").glob("*.yaml"))
    assert [t.parent.name for t in tables] == studies
    for table in tables:
        assert table.read_text().splitlines()[0] == ",".join(RESULT_COLUMNS)
    assert not store.exists() and not list(store.parent.iterdir())
    assert not (folder / "mlruns").exists() and not (folder / "mlflow.db").exists()
    assert not (folder / ".paraplan" / "runs").exists() or not any((folder / ".paraplan" / "runs").iterdir())


@pytest.mark.parametrize(("config", "line"), [
    ("cluster=nope", "paraplan: error: config key 'cluster' in --config: no cluster file config/clusters/nope.yaml; "
                     "known clusters: "),
    ("bench={min_bytes: 4096, max_bytes: 1024}",
     "paraplan: error: config key 'bench.min_bytes' in --config: 4096 is above bench.max_bytes (1024); "
     "expected min_bytes <= max_bytes"),
    (f"bench={{world_sizes: [2, {4 * (os.cpu_count() or 1)}]}}",
     f"paraplan: error: config key 'bench.world_sizes' in --config: {4 * (os.cpu_count() or 1)} ranks on this "
     "machine's "),
])
def test_a_config_that_cannot_run_stops_before_any_job(workdir, config, line):
    out = _dry_run(workdir, "--config", config)
    assert out.returncode == 1
    errors = [text for text in out.stderr.splitlines() if "error" in text.lower()]
    assert len(errors) == 1 and errors[0].startswith(line), out.stderr[-2000:]
    assert "Building DAG" not in out.stderr + out.stdout


def test_a_missing_fit_log_stops_before_any_job(workdir):
    (workdir / "logs.yaml").write_text(
        "fit:\n  logs:\n    - {name: a100, path: ../nowhere/a100.txt, format: nccl-tests}\n")
    out = _dry_run(workdir, "--configfile", "logs.yaml")
    assert out.returncode == 1
    assert ("paraplan: error: config key 'fit.logs[0].path' in logs.yaml: ../nowhere/a100.txt does not exist; "
            "expected the nccl-tests log named 'a100'") in out.stderr


@pytest.mark.parametrize(("text", "line"), [
    ("clustr: local-cpu\n", "unknown key 'clustr' in mine.yaml; did you mean 'cluster'?"),
    ("bench:\n  itres: 3\n", "unknown key 'bench.itres' in mine.yaml; did you mean 'bench.iters'?"),
    ("predict:\n  tables:\n    '..': {runs: config/runs/llm_a100.csv, cluster: dgx-a100, calibration: a100-vtrain}\n",
     "config key 'predict.tables' in mine.yaml: '..' is not a usable name; expected letters, digits"),
    ("bench:\n  iters: 3\n  iters: 4\n",
     "mine.yaml:3: key 'iters' appears twice (lines 2 and 3); expected each key once"),
    # q4-hostile: a wrong value was Snakemake's 10-line schema quote, naming neither path nor file
    ("bench:\n  iters: abc\n", "config key 'bench.iters' in mine.yaml: 'abc' is not of type 'integer'"),
])
def test_a_config_mistake_costs_one_line(workdir, text, line):
    """Issue 21: before, a misspelled key printed 140 (nested) to 1,297 lines (top level)
    of Snakemake's schema dump, and a `..` table name made Snakemake delete results/figures/."""
    (workdir / "mine.yaml").write_text(text)
    figure = workdir / "results" / "figures" / "kept.png"
    figure.parent.mkdir(parents=True, exist_ok=True)
    figure.write_bytes(b"png")
    out = _dry_run(workdir, "--configfile", "mine.yaml")
    assert out.returncode == 1
    errors = [text for text in out.stderr.splitlines() if "error" in text.lower()]
    assert len(errors) == 1 and errors[0].startswith("paraplan: error: ") and line in errors[0], out.stderr
    assert len(out.stderr.splitlines()) <= 4, out.stderr  # the profile and config notes, then the line
    assert figure.read_bytes() == b"png"


@pytest.mark.parametrize("profile", [[], ["--workflow-profile", "workflow/profiles/slurm"]])
def test_a_missing_configfile_costs_one_line(workdir, profile):
    """Issue 21: Snakemake reads --configfile before the Snakefile and printed a 27-line
    traceback for a missing one; the profiles check it first."""
    out = _dry_run(workdir, *profile, "--configfile", "nothere.yaml")
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == (
        f"paraplan: error: --configfile nothere.yaml: does not exist (paths are relative to {workdir}); expected a "
        "YAML file of config keys (config/config.yaml shows them all)"), out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) <= 2
