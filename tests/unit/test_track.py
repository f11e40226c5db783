"""Tracking: a RunLog becomes one MLflow run (with children) in the store named by
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


