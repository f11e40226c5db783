"""A tracked command's run when things go wrong (docs/tracking.md): a job killed with
SIGKILL leaves its record RUNNING, and the next logging process (the next command's,
the workflow's end, `paraplan track`) logs it KILLED; a server that freezes after
answering fails the logging within the documented bound, the command's results and
record kept, and the next command says so; the command's own process never imports
mlflow and never waits for the store."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from paraplan import track
from paraplan.track_job import log_pending
from paraplan.track_spool import read_record, records

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "config/runs/llm_a100.csv"


def _env(uri: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(REPO / "src"), **extra}
    for name in (track.ENV_TRACKING, track.ENV_INVOCATION):
        env.pop(name, None)
    return env


def _predict(runs: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "paraplan", "predict", str(runs), "--cluster", "dgx-a100", "-o", str(out),
            "--wildcards", "table=llm_a100"]


def _runs(uri: str, status: str | None = None):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("paraplan-predict")
    runs = [] if exp is None else client.search_runs([exp.experiment_id])
    return [r for r in runs if status is None or r.info.status == status]


def _wait_for(condition, what: str, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _blocked_command(tmp_path: Path, uri: str) -> subprocess.Popen:
    """`paraplan predict` reading a FIFO nobody writes: it blocks mid-job, its record
    RUNNING."""
    fifo = tmp_path / "runs.csv"
    os.mkfifo(fifo)
    return subprocess.Popen(_predict(fifo, tmp_path / "never.csv"), cwd=tmp_path, env=_env(uri),
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "job.log").open("w"),
                            start_new_session=True)


def _records(tmp_path: Path, status: str) -> list[dict]:
    found = [read_record(p) for p in records(tmp_path / ".paraplan/runs")]
    return [r for r in found if r is not None and r["status"] == status]


def test_sigkilled_job_is_logged_killed_by_the_next_logging_process(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job = _blocked_command(tmp_path, uri)
    (running,) = _wait_for(lambda: _records(tmp_path, "RUNNING"), "the job's record")
    assert log_pending(tmp_path / ".paraplan/runs").left == 1  # its process runs: left alone
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    assert not _runs(uri)  # nothing logged yet: nobody was left to

    again = subprocess.run(_predict(RUNS, tmp_path / "out.csv"), cwd=tmp_path, env=_env(uri),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not log_pending(tmp_path / ".paraplan/runs", wait=True).errors  # the next command's logging, awaited
    by_status = {r.info.status: r for r in _runs(uri)}
    assert set(by_status) == {"KILLED", "FINISHED"}
    killed = by_status["KILLED"]
    assert killed.data.tags["error"] == "the job's process ended without finishing its run (killed?)"
    assert killed.info.start_time == running["start_ms"] and killed.data.tags["wildcards"] == "table=llm_a100"
    assert by_status["FINISHED"].data.tags["wildcards"] == "table=llm_a100"
    assert not records(tmp_path / ".paraplan/runs")  # every record logged and removed


class _AnswersHealthThenFreezes(http.server.BaseHTTPRequestHandler):
    """A tracking server that answers the health probe, then never answers again."""

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")
        else:
            time.sleep(3600)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


def test_server_frozen_after_the_probe_fails_the_logging_within_the_bound_results_kept(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AnswersHealthThenFreezes)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    env = _env(uri, **{track.ENV_TIMEOUT: "1"})
    done = subprocess.run(_predict(RUNS, tmp_path / "out.csv"), cwd=tmp_path, timeout=300, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]  # the command never waits for the store
    assert (tmp_path / "out.csv").stat().st_size > 0
    # its background logging fails: each request waits 1 s, one retry after 1 s, not minutes
    (failed,) = _wait_for(lambda: [r for r in _records(tmp_path, "FINISHED") if r.get("log_error")],
                          "the logging error in the record", timeout_s=60)
    assert failed["log_error"].startswith("ReadTimeout") or "timed out" in failed["log_error"]
    start = time.monotonic()
    by_hand = subprocess.run([sys.executable, "-m", "paraplan", "track"], cwd=tmp_path, timeout=300, env=env,
                             capture_output=True, text=True)
    elapsed = time.monotonic() - start
    # the next command names the failure; `paraplan track` tries again and fails as fast
    again = subprocess.run(_predict(RUNS, tmp_path / "again.csv"), cwd=tmp_path, timeout=300, env=env,
                           capture_output=True, text=True)
    server.shutdown()
    assert by_hand.returncode == 2 and elapsed < 30, (elapsed, by_hand.stderr[-2000:])
    (line,) = [x for x in by_hand.stderr.splitlines() if "error" in x.lower()]
    assert line.startswith(f"paraplan track: error: MLflow tracking store '{uri}'")
    assert "Traceback" not in by_hand.stderr
    assert "results written, not logged" in line
    assert again.returncode == 0
    assert "the MLflow run of an earlier `paraplan predict`" in again.stderr and "was not logged" in again.stderr


def test_command_process_never_imports_mlflow(tmp_path):
    """Untracked, nothing imports mlflow; tracked, only the logging process does."""
    script = (
        "import sys\n"
        "from paraplan.cli.main import main\n"
        f"assert main(['predict', {str(RUNS)!r}, '--cluster', 'dgx-a100', '-o', 'a.csv', '--no-track']) == 0\n"
        "print('untracked', 'mlflow' in sys.modules)\n"
        f"assert main(['predict', {str(RUNS)!r}, '--cluster', 'dgx-a100', '-o', 'b.csv']) == 0\n"
        "print('tracked', 'mlflow' in sys.modules)\n"
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_env(uri), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not log_pending(tmp_path / ".paraplan/runs", wait=True).errors
    assert done.stdout.split("\n")[:2] == ["untracked False", "tracked False"]
    assert len(_runs(uri, "FINISHED")) == 1


def test_silent_port_is_unreachable_within_the_timeout():
    """The probe alone: a port that accepts and never answers is an error in ~timeout."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    uri = f"http://127.0.0.1:{server.getsockname()[1]}"
    start = time.monotonic()
    with pytest.raises(track.TrackingError, match=r"unreachable .*waited at most 0\.5 s"):
        track.probe(uri, 0.5)
    server.close()
    assert time.monotonic() - start < 3
