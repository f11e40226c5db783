"""What a user sees of a command's MLflow run: it starts when the job starts (its
Duration is the job's, though it is logged afterwards), FAILED with the error when the
job fails, MLflow's standard tags, a fast error when the server does not answer (the
results kept), and no store and no record at all untracked."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from paraplan import track
from paraplan.cli.main import main
from paraplan.track_job import log_pending


def _logged(tmp_path) -> None:
    """Wait for the background logging process (or log in its place)."""
    assert not log_pending(tmp_path / ".paraplan/runs", wait=True).errors


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv(track.ENV_INVOCATION, "inv-cli")
    monkeypatch.delenv(track.ENV_TRACKING, raising=False)
    track.ensure_store(uri)
    return uri


def _runs(uri: str, stage: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(f"paraplan-{stage}")
    return [] if exp is None else client.search_runs([exp.experiment_id])


def test_run_spans_the_job_and_carries_standard_tags(store, tmp_path):
    assert main(["simulate", "--study", "schedules", "-o", "sim", "--repeats", "1"]) == 0
    _logged(tmp_path)
    (run,) = _runs(store, "simulate")
    written_ms = (tmp_path / "sim/results.csv").stat().st_mtime * 1000
    # opened before the results were written, closed after the figures were
    assert run.info.start_time < written_ms < run.info.end_time
    assert run.info.status == "FINISHED" and run.info.run_name == "schedules"
    tags = run.data.tags
    assert tags["mlflow.source.name"] == "paraplan simulate"
    assert tags["mlflow.user"]
    assert tags["mlflow.source.git.commit"] == tags["git_commit"].removesuffix("-dirty")
    assert len(tags["mlflow.source.git.commit"]) == 40
    assert tags["invocation_id"] == "inv-cli"


def test_failed_job_leaves_a_failed_run_with_the_error(store, capsys, tmp_path):
    assert main(["simulate", "--study", "no_such_study", "-o", "sim"]) == 2
    _logged(tmp_path)
    (run,) = _runs(store, "simulate")
    assert run.info.status == "FAILED"
    assert run.data.tags["error"].startswith("option --study: no simulate study named 'no_such_study' (")
    assert run.data.tags["error"].endswith("known: distir_fig3, distir_fig4, schedules")
    assert "marked FAILED" in capsys.readouterr().err


def test_failed_invocation_summary_is_failed(store, tmp_path):
    assert main(["simulate", "--study", "no_such_study", "-o", "sim"]) == 2
    _logged(tmp_path)
    summary_id = track.log_invocation_summary("inv-cli", uri=store, failed=True, error="job simulate failed",
                                              start_ms=int(time.time() * 1000) - 60_000)
    (summary,) = _runs(store, "invocation")
    assert summary.info.run_id == summary_id and summary.info.status == "FAILED"
    assert summary.data.metrics["runs_failed"] == 1.0
    assert summary.info.end_time - summary.info.start_time >= 60_000
    assert "FAILED" in summary.data.tags["mlflow.note.content"]


def test_workflow_jobs_only_record_and_the_workflow_end_logs_them(store, tmp_path, monkeypatch, capsys):
    """Under Snakemake (PARAPLAN_TRACKING_SPOOL set), a job writes its record and starts
    no logging process; the `onerror` handler logs the jobs' runs (a failed job's
    FAILED, a killed job's KILLED) and the invocation's FAILED summary."""
    import json

    from paraplan import workflow_env
    from paraplan.track_spool import ENV_SPOOL, read_record, records

    spool = tmp_path / "spool"
    monkeypatch.setenv(ENV_SPOOL, str(spool))
    monkeypatch.setenv(track.ENV_INVOCATION_START, str(int(time.time() * 1000) - 60_000))
    assert main(["simulate", "--study", "schedules", "-o", "sim", "--repeats", "1", "--no-plots"]) == 0
    assert main(["simulate", "--study", "no_such_study", "-o", "sim2"]) == 2
    killed = spool / "0-killed.json"  # a job SIGKILLed mid-way: its record still RUNNING, its pid gone
    record = read_record(records(spool)[0])
    killed.write_text(json.dumps({**record, "status": "RUNNING", "runs": [], "start_ms": 1,
                                                "tags": {**record["tags"], "paraplan.pid": str(2 ** 22 + 7)}}))
    time.sleep(1)
    assert not _runs(store, "simulate") and len(records(spool)) == 3  # nothing logged by the jobs
    assert not (tmp_path / ".paraplan").exists()
    assert workflow_env.log_invocation(failed=True, log="snakemake.log") is True
    by_status = {r.info.status: r for r in _runs(store, "simulate")}
    assert set(by_status) == {"FINISHED", "FAILED", "KILLED"}
    assert by_status["FAILED"].data.tags["error"].startswith(
        "option --study: no simulate study named 'no_such_study' (")
    assert by_status["FINISHED"].info.run_name == "schedules"
    (summary,) = _runs(store, "invocation")
    assert summary.info.status == "FAILED" and summary.data.metrics["runs_failed"] == 1.0
    assert summary.info.end_time - summary.info.start_time >= 60_000
    assert not records(spool)
    err = capsys.readouterr().err
    assert "logged KILLED" in err and "logged 3 MLflow run(s) from 3 pending record(s)\n" in err


def test_untracked_creates_no_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv(track.ENV_TRACKING, "off")
    assert main(["simulate", "--study", "schedules", "-o", "sim", "--repeats", "1", "--no-plots"]) == 0
    assert (tmp_path / "sim/results.csv").is_file()
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    assert not (tmp_path / ".paraplan").exists()


def _silent_server() -> tuple[socket.socket, int]:
    """A TCP server that accepts connections and never answers (a hung tracking server)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return server, server.getsockname()[1]


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_unreachable_server_fails_in_seconds_naming_it_results_kept(tmp_path, monkeypatch, capsys, kind):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(track.ENV_TRACKING, raising=False)
    monkeypatch.setenv(track.ENV_TIMEOUT, "1.5")
    if kind == "silent":
        server, port = _silent_server()
    else:
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()  # nothing listens there now
    uri = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    start = time.perf_counter()
    code = main(["simulate", "--study", "schedules", "-o", "sim", "--repeats", "1", "--no-plots"])
    elapsed = time.perf_counter() - start
    if kind == "silent":
        server.close()
    err = capsys.readouterr().err
    assert code == 2
    # the store was probed while the study ran (1.5 s at most), not MLflow's minutes of retries
    assert elapsed < 10, elapsed
    (line,) = [x for x in err.splitlines() if "error" in x]
    assert line.startswith(f"paraplan simulate: error: MLflow tracking store '{uri}': unreachable")
    assert "--no-track" in line and "results written, not logged" in line and "Traceback" not in err
    assert (tmp_path / "sim/results.csv").is_file()  # tracking runs after the results are written
