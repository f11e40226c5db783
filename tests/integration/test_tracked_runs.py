"""Commands and RunLogs logged to a real MLflow store: one run per job, its sweep as a
table artifact plus metrics with step = the row index, artifacts; no child runs."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml

from paraplan import track
from paraplan.cli.main import main
from paraplan.comm.log_common import rows_frame
from paraplan.comm.nccl_tests import read_nccl_tests
from paraplan.files import write_csv
from paraplan.track_job import log_pending

VENDOR_LOG = "04_gh200_alps_2node_1gpu_all_reduce"


def test_fit_logs_to_mlflow(data_dir, tmp_path, monkeypatch):
    csv = tmp_path / "04.csv"
    write_csv(csv, rows_frame(read_nccl_tests(data_dir / "nccl-tests" / f"{VENDOR_LOG}.txt").rows))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert main(["fit", str(csv), "-o", str(tmp_path / "cm.json")]) == 0
    assert not log_pending(tmp_path / ".paraplan/runs", wait=True).errors  # the background logging, awaited
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("paraplan-fit")
    (run,) = client.search_runs([experiment.experiment_id])  # one run, no child runs
    run_id = run.info.run_id
    fits = json.loads((tmp_path / "cm.json").read_text())["fits"]
    table = next(f for f in fits if f["model"] == "table")
    chosen = next(f for f in fits if f["chosen"])
    # one row per sweep (here one, all_reduce_n2); its errors are metrics at step = row
    (row,) = _table(client, run_id, "sweeps.json")
    assert row["sweep"] == "all_reduce_n2" and row["world_size"] == 2 and row["chosen_model"] == chosen["model"]
    assert _history(client, run_id, "heldout_gmae__table") == [(0, pytest.approx(table["heldout_gmae"]))]
    assert _history(client, run_id, "chosen_heldout_gmae") == [(0, pytest.approx(chosen["heldout_gmae"]))]
    assert "gmae__sigmoid_bw" in run.data.metrics
    assert run.data.metrics["max_chosen_heldout_gmae"] == pytest.approx(chosen["heldout_gmae"])
    assert run.data.params["chosen.all_reduce_n2.model"] == chosen["model"]
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.source.name"] == "paraplan fit"


def _table(client, run_id: str, name: str) -> list[dict]:
    """A table artifact (MLflow's `log_table` JSON: columns + data) as row dicts."""
    document = json.loads(Path(client.download_artifacts(run_id, name)).read_text())
    return [dict(zip(document["columns"], values, strict=True)) for values in document["data"]]


def _history(client, run_id: str, metric: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, metric))


def test_simulate_logs_one_run_with_its_configurations_as_table_and_stepped_metrics(tmp_path, monkeypatch):
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
    assert not log_pending(tmp_path / ".paraplan/runs", wait=True).errors
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("paraplan-simulate")
    (run,) = client.search_runs([experiment.experiment_id])  # 4 configurations, one run
    assert "mlflow.parentRunId" not in run.data.tags and run.data.tags["rule"] == "simulate"
    assert "simulate_s" in run.data.metrics
    with (tmp_path / "out/results.csv").open() as f:
        written = list(csv.DictReader(f))
    assert len(written) == 4
    rows = _table(client, run.info.run_id, "configurations.json")
    # the table is results.csv, row for row
    assert [(r["D"], r["P"], r["microbatches"], r["mode"]) for r in rows] == [
        (int(w["D"]), int(w["P"]), int(w["microbatches"]), w["mode"]) for w in written]
    for name in ("step_time_s", "throughput", "speedup", "bubble_fraction"):
        assert _history(client, run.info.run_id, name) == [
            (i, pytest.approx(float(w[name]))) for i, w in enumerate(written)], name
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"results.csv", "configurations.json"} <= artifacts


def test_log_run_with_table_metrics_and_artifacts(store, tmp_path):
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
        table=track.Table(rows=[{"size": 8, "speedup": 2.0}, {"size": 16, "speedup": math.nan},
                                {"size": 32, "speedup": 3.5}], metrics=["speedup"]),
    )
    track.ensure_store(store)
    run_id = track.log_run(run, base_tags=track.job_tags("bench", "w=1"))

    client = mlflow.tracking.MlflowClient(store)
    got = client.get_run(run_id)
    assert got.data.params == {"bench.iters": "20", "bench.world_sizes": "2,4"}
    assert got.data.metrics["peak_busbw_GBps"] == 1.25
    assert "nan_is_dropped" not in got.data.metrics
    assert got.data.tags["invocation_id"] == "inv-123"
    assert _history(client, run_id, "time_us") == [(3, 10.0), (4, 12.0)]
    # a NaN cell is no metric point, and an empty cell of the table
    assert _history(client, run_id, "speedup") == [(0, 2.0), (2, 3.5)]
    assert _table(client, run_id, "configurations.json") == [
        {"size": 8, "speedup": 2.0}, {"size": 16, "speedup": None}, {"size": 32, "speedup": 3.5}]
    assert sorted(a.path for a in client.list_artifacts(run_id)) == ["configurations.json", "out.csv"]
    exp = client.get_experiment_by_name("paraplan-bench")
    assert len(client.search_runs([exp.experiment_id])) == 1
    assert exp.artifact_location == (tmp_path / "mlruns" / "paraplan-bench").as_uri()


def test_invocation_summary_links_the_invocations_runs(store):
    import mlflow

    track.ensure_store(store)
    ids = [
        track.log_run(track.RunLog(stage=stage, run_name=name), base_tags=track.job_tags(stage))
        for stage, name in [("bench", "all_reduce_n2"), ("fit", "local-cpu"), ("predict", "llm.csv@dgx-h100")]
    ]
    # a run of another invocation is not listed
    track.log_run(track.RunLog(stage="bench", run_name="other"), base_tags={"invocation_id": "zzz"})

    summary_id = track.log_invocation_summary("inv-123", uri=store)
    client = mlflow.tracking.MlflowClient(store)
    tags = client.get_run(summary_id).data.tags
    assert tags["run.bench.all_reduce_n2"] == ids[0]
    assert tags["run.fit.local-cpu"] == ids[1]
    assert tags["run.predict.llm.csv_dgx-h100"] == ids[2]  # '@' is no tag key character
    assert not any(key.endswith(".other") for key in tags)
    assert track.log_invocation_summary("nothing-ran", uri=store) is None
