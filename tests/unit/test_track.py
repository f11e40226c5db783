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


def test_runlog_crosses_to_the_logging_process_as_json_in_its_record(tmp_path):
    import json

    import numpy as np

    from paraplan.track_spool import message_runlog, runlog_message

    run = track.RunLog(
        stage="simulate", run_name="fig4", params={"mode": {"bandwidth_gbps": 200}},
        metrics={"simulate_s": np.float64(0.25), "nan": float("nan")},
        step_metrics={"time_us": [(3, 10.0), (4, float("inf"))]}, artifacts=[tmp_path / "a.csv"], tags={"k": "v"},
        table=track.Table(rows=[{"D": np.int64(2), "speedup": np.float64(1.5), "schedule": "gpipe"},
                                {"D": 4, "speedup": float("nan"), "schedule": None}], metrics=["speedup"]),
    )
    back = message_runlog(json.loads(json.dumps(runlog_message(run))))
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

    from paraplan.track import process_gone

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert process_gone(done.stdout.strip(), 0)  # ended
    now_ms = int(time.time() * 1000)
    assert not process_gone(str(os.getpid()), now_ms)  # this process, started before the run
    assert process_gone(str(os.getpid()), 0)  # a process younger than the run: its pid was reused
    assert not process_gone("not-a-pid", 0)


def test_http_defaults_bound_requests_unless_the_user_set_them(monkeypatch):
    for name in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "3")
    track.http_defaults(2.5)
    import os

    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "3"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "1"
    assert os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] == "3"  # the user's


def _record(spool, uri: str, status: str, pid: int, host: str | None = None, invocation: str = "standalone-x",
            runs=()):
    import socket

    from paraplan.track_spool import RECORD_VERSION, now_ms, write_record

    path = spool / f"{len(list(spool.glob('*.json')))}-{pid}.json"
    write_record(path, {"version": RECORD_VERSION, "status": status, "uri": uri, "stage": "plan", "run_name": "x",
                        "command": "plan", "start_ms": now_ms(), "end_ms": now_ms(), "error": "", "runs": list(runs),
                        "tags": {"rule": "plan", "invocation_id": invocation, "paraplan.pid": str(pid),
                                 "paraplan.host": host or socket.gethostname(), "git_commit": "abc"}})
    return path


def test_a_store_error_is_kept_in_the_record_and_stops_that_store(tmp_path):
    from paraplan.track_job import log_pending
    from paraplan.track_spool import read_record

    (tmp_path / "file").write_text("")
    uri = f"sqlite:///{tmp_path}/file/sub/mlflow.db"  # cannot exist
    first, second = (_record(tmp_path / "runs", uri, "FINISHED", 1), _record(tmp_path / "runs", uri, "FAILED", 1))
    outcome = log_pending(tmp_path / "runs")
    assert list(outcome.errors) == [uri] and outcome.left == 2 and not outcome.run_ids
    error = read_record(first)["log_error"]  # the next command reports it
    assert error.startswith("NotADirectoryError: ") and "file/sub" in error
    assert "log_error" not in read_record(second)  # not tried: the store already failed


def test_which_running_records_are_killed(tmp_path):
    """Same host: by pid. Another host: only a workflow job's, at the workflow's end."""
    import os

    from paraplan.track_job import _status
    from paraplan.track_spool import read_record

    spool = tmp_path / "runs"
    uri = "sqlite:///unused.db"

    def status(path, workflow_end=None):
        return _status(read_record(path), workflow_end)

    assert status(_record(spool, uri, "RUNNING", os.getpid())) is None  # this process: still running
    assert status(_record(spool, uri, "RUNNING", 2 ** 22 + 7)) == "KILLED"  # no such pid
    assert status(_record(spool, uri, "FAILED", os.getpid())) == "FAILED"
    other = _record(spool, uri, "RUNNING", 1, host="elsewhere", invocation="inv-1")
    assert status(other) is None and status(other, workflow_end="inv-2") == "KILLED"
    assert status(_record(spool, uri, "RUNNING", 1, host="elsewhere"), workflow_end="inv-2") is None  # standalone
