"""Commands and RunLogs logged to a real MLflow store: runs, child runs, metrics, artifacts."""

from __future__ import annotations

import json

import pytest
import yaml

from paraplan import track
from paraplan.cli.main import main
from paraplan.comm.log_common import rows_frame
from paraplan.comm.nccl_tests import read_nccl_tests
from paraplan.files import write_csv

VENDOR_LOG = "04_gh200_alps_2node_1gpu_all_reduce"


def test_fit_logs_to_mlflow(data_dir, tmp_path, monkeypatch):
    csv = tmp_path / "04.csv"
    write_csv(csv, rows_frame(read_nccl_tests(data_dir / "nccl-tests" / f"{VENDOR_LOG}.txt").rows))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert main(["fit", str(csv), "-o", str(tmp_path / "cm.json")]) == 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("paraplan-fit")
    runs = client.search_runs([experiment.experiment_id])
    (run,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    # one child per sweep, metric names shared across sweeps (the UI compares them)
    (child,) = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == run.info.run_id]
    assert child.data.tags["mlflow.runName"] == "all_reduce_n2"
    fits = json.loads((tmp_path / "cm.json").read_text())["fits"]
    table = next(f for f in fits if f["model"] == "table")
    chosen = next(f for f in fits if f["chosen"])
    assert child.data.metrics["heldout_gmae__table"] == pytest.approx(table["heldout_gmae"])
    assert child.data.metrics["chosen_heldout_gmae"] == pytest.approx(chosen["heldout_gmae"])
    assert "gmae__sigmoid_bw" in child.data.metrics
    assert child.data.params["chosen_model"] == chosen["model"] and child.data.params["world_size"] == "2"
    assert run.data.metrics["max_chosen_heldout_gmae"] == pytest.approx(chosen["heldout_gmae"])
    assert run.data.params["chosen.all_reduce_n2.model"] == chosen["model"]
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.source.name"] == "paraplan fit"


def test_tracking_logs_one_parent_with_one_child_per_configuration(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = tmp_path / "tiny.yaml"
    exp.write_text(yaml.safe_dump({
        "name": "tiny", "model": {"kind": "mlp", "num_layers": 8, "hidden_dim": 128},
        "modes": {"distir-v0.1": {"bandwidth_gbps": 200}},
        "series": [{"name": "PP", "parallelism": "pipeline", "batch_sizes": [64], "devices": [2, 4],
                    "microbatches": [2, 4]}],
    }))
    assert main(["simulate", "--study", str(exp), "-o", str(tmp_path / "out"),
                 "--rule", "simulate", "--wildcards", "study=tiny"]) == 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("paraplan-simulate")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 4
    assert parents[0].data.tags["rule"] == "simulate"
    assert "simulate_s" in parents[0].data.metrics
    child = children[0].data
    assert {"D", "T", "P", "microbatches", "schedule", "batch_size", "mode"} <= set(child.params)
    assert {"step_time_s", "throughput", "speedup", "bubble_fraction"} <= set(child.metrics)
    artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert "results.csv" in artifacts


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
