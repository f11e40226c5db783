"""Tracking: a RunLog becomes one MLflow run (its sweep a table) in the store named by
MLFLOW_TRACKING_URI; failures name the store."""

from __future__ import annotations

import pytest

from paraplan import track
from paraplan.core import TrackingError


def test_flatten_nests_and_joins():
    assert track.flatten({"a": {"b": 1, "c": [2, 4]}, "d": None}) == {"a.b": "1", "a.c": "2,4", "d": ""}


def test_default_uri_is_sqlite_in_working_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert track.tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_job_tags_come_from_environment(store):
    tags = track.job_tags("bench", "collective=all_reduce,world=2")
    assert tags["invocation_id"] == "inv-123"
    assert tags["config_digest"] == "abcd"
    assert tags["rule"] == "bench" and tags["wildcards"] == "collective=all_reduce,world=2"
    assert tags["git_commit"]




def test_unusable_store_is_a_tracking_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    uri = f"sqlite:///{blocker}/sub/mlflow.db"  # a path under a regular file cannot exist
    with pytest.raises(TrackingError, match=r"sub/mlflow\.db"):
        track.log_run(track.RunLog(stage="bench", run_name="x"), uri=uri)




def test_a_metric_is_a_summary_or_a_series_never_both():
    table = track.Table(rows=[{"speedup": 2.0}], metrics=["speedup"])
    with pytest.raises(ValueError, match=r"metric \['speedup'\] logged twice"):
        track.RunLog(stage="plan", run_name="x", metrics={"speedup": 2.0}, table=table)
    with pytest.raises(ValueError, match="logged twice"):
        track.RunLog(stage="plan", run_name="x", step_metrics={"speedup": [(0, 1.0)]}, table=table)


def test_runlog_crosses_to_the_logging_process_as_json(tmp_path):
    import json

    import numpy as np

    from paraplan.track_job import _message, _runlog

    run = track.RunLog(
        stage="simulate", run_name="fig4", params={"mode": {"bandwidth_gbps": 200}},
        metrics={"simulate_s": np.float64(0.25), "nan": float("nan")},
        step_metrics={"time_us": [(3, 10.0), (4, float("inf"))]}, artifacts=[tmp_path / "a.csv"], tags={"k": "v"},
        table=track.Table(rows=[{"D": np.int64(2), "speedup": np.float64(1.5), "schedule": "gpipe"},
                                {"D": 4, "speedup": float("nan"), "schedule": None}], metrics=["speedup"]),
    )
    back = _runlog(json.loads(json.dumps(_message(run))))
    assert back.params == {"mode.bandwidth_gbps": "200"}
    assert back.metrics == {"simulate_s": 0.25}  # NaN dropped
    assert back.step_metrics == {"time_us": [(3, 10.0)]}
    assert back.artifacts == [(tmp_path / "a.csv").resolve()] and back.tags == {"k": "v"}
    assert back.table == track.Table(rows=[{"D": 2, "speedup": 1.5, "schedule": "gpipe"},
                                           {"D": 4, "speedup": None, "schedule": None}],
                                     metrics=["speedup"], name="configurations")


def test_process_gone_by_pid():
    import os
    import subprocess
    import sys
    import time

    from paraplan.track import _process_gone

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert _process_gone(done.stdout.strip(), 0)  # ended
    now_ms = int(time.time() * 1000)
    assert not _process_gone(str(os.getpid()), now_ms)  # this process, started before the run
    assert _process_gone(str(os.getpid()), 0)  # a process younger than the run: its pid was reused
    assert not _process_gone("not-a-pid", 0)


def test_http_defaults_bound_requests_unless_the_user_set_them(monkeypatch):
    for name in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "3")
    track.http_defaults(2.5)
    import os

    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "3"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "1"
    assert os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] == "3"  # the user's


def test_logging_process_answers_a_store_error_once_and_then_repeats_it(tmp_path, monkeypatch):
    import io
    import json

    from paraplan.track_job import serve

    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("")
    uri = f"sqlite:///{tmp_path}/file/sub/mlflow.db"  # cannot exist
    requests = io.StringIO("".join(json.dumps(m) + "\n" for m in (
        {"op": "open", "uri": uri, "stage": "plan", "run_name": "x", "rule": "plan", "wildcards": "",
         "command": "plan", "pid": 1, "start_ms": 0},
        {"op": "close"})))
    answers = io.StringIO()
    assert serve(requests, answers) == 0
    first, second = (json.loads(line) for line in answers.getvalue().splitlines())
    assert not first["ok"] and first["error"].startswith("NotADirectoryError: ") and "file/sub" in first["error"]
    assert second == first
