"""Many `paraplan` commands started at once on a fresh SQLite store: each records its
run, logged by the background logging processes they start, each run once (issue 15;
without the lock beside the database, MLflow's concurrent schema creation broke the
store and 0 of 16 runs were recorded)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from paraplan.comm.results import bench_frame
from paraplan.files import write_csv

pytestmark = pytest.mark.integration

COMMANDS = 16


def test_sixteen_commands_started_together_record_sixteen_runs(tmp_path):
    sizes = 2 ** np.arange(10, 16)
    sweep = tmp_path / "sweep.csv"
    write_csv(sweep, bench_frame("all_reduce", "gloo", 2, 1, sizes, sizes // 4, "float32", 30 + sizes / 1e3))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    env.pop("PARAPLAN_TRACKING", None)
    paraplan = [sys.executable, "-m", "paraplan"]
    processes = [
        subprocess.Popen([*paraplan, "fit", str(sweep), "-o", str(tmp_path / f"cm{i}.json"), "--wildcards", f"job={i}"],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(COMMANDS)
    ]
    outputs = [p.communicate(timeout=540)[0] for p in processes]
    failed = [(i, out[-600:]) for i, (p, out) in enumerate(zip(processes, outputs, strict=True)) if p.returncode]
    assert not failed, failed
    from paraplan.track_job import log_pending

    assert not log_pending(tmp_path / ".paraplan/runs", wait=True).errors  # waits for the background loggers

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("paraplan-fit")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    assert len(runs) == COMMANDS
    assert {r.info.status for r in runs} == {"FINISHED"}
    # the lock that serialised the schema creation, marked so later jobs skip it
    assert (tmp_path / "mlflow.db.lock").read_text() == "schema ready\n"
