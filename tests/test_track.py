"""Tracking: a RunLog becomes one MLflow run (with children) in the store named by
MLFLOW_TRACKING_URI; failures name the store."""

from __future__ import annotations

import pytest

from paraplan import track
from paraplan.core import TrackingError


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv(track.ENV_INVOCATION, "inv-123")
    monkeypatch.setenv(track.ENV_CONFIG_DIGEST, "abcd")
    return uri


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


@pytest.mark.slow
def test_log_run_with_children_metrics_and_artifacts(store, tmp_path):
    import mlflow

    artifact = tmp_path / "out.csv"
    artifact.write_text("a,b\n1,2\n")
    run = track.RunLog(
        stage="bench",
        run_name="all_reduce_n2",
        params={"bench": {"iters": 20, "world_sizes": [2, 4]}},
        metrics={"peak_busbw_GBps": 1.25, "nan_is_dropped": float("nan")},
        step_metrics={"time_us": [(3, 10.0), (4, 12.0)]},
        artifacts=[artifact],
        children=[track.RunLog(stage="bench", run_name="child", metrics={"speedup": 2.0})],
    )
    track.ensure_store(store)
    run_id = track.log_run(run, base_tags=track.job_tags("bench", "w=1"))

    client = mlflow.tracking.MlflowClient(store)
    got = client.get_run(run_id)
    assert got.data.params == {"bench.iters": "20", "bench.world_sizes": "2,4"}
    assert got.data.metrics["peak_busbw_GBps"] == 1.25
    assert "nan_is_dropped" not in got.data.metrics
    assert got.data.tags["invocation_id"] == "inv-123"
    history = client.get_metric_history(run_id, "time_us")
    assert sorted((m.step, m.value) for m in history) == [(3, 10.0), (4, 12.0)]
    assert [a.path for a in client.list_artifacts(run_id)] == ["out.csv"]
    exp = client.get_experiment_by_name("paraplan-bench")
    runs = mlflow.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run_id}'")
    assert list(runs["tags.mlflow.runName"]) == ["child"]
    assert exp.artifact_location == (tmp_path / "mlruns" / "paraplan-bench").as_uri()


def test_unusable_store_is_a_tracking_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    uri = f"sqlite:///{blocker}/sub/mlflow.db"  # a path under a regular file cannot exist
    with pytest.raises(TrackingError, match=r"sub/mlflow\.db"):
        track.log_run(track.RunLog(stage="bench", run_name="x"), uri=uri)


@pytest.mark.slow
def test_invocation_summary_links_the_invocations_runs(store):
    import mlflow

    track.ensure_store(store)
    ids = [
        track.log_run(track.RunLog(stage=stage, run_name=name), base_tags=track.job_tags(stage))
        for stage, name in [("bench", "all_reduce_n2"), ("fit", "local-cpu")]
    ]
    # a run of another invocation is not listed
    track.log_run(track.RunLog(stage="bench", run_name="other"), base_tags={"invocation_id": "zzz"})

    summary_id = track.log_invocation_summary("inv-123", uri=store)
    client = mlflow.tracking.MlflowClient(store)
    tags = client.get_run(summary_id).data.tags
    assert tags["run.bench.all_reduce_n2"] == ids[0]
    assert tags["run.fit.local-cpu"] == ids[1]
    assert not any(key.endswith(".other") for key in tags)
    assert track.log_invocation_summary("nothing-ran", uri=store) is None
