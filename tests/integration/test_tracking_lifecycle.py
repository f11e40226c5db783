"""A tracked command's run when things go wrong (docs/tracking.md): a job killed with
SIGKILL leaves its run RUNNING only until the same rule runs again (KILLED then), a
command killed alone has its run marked KILLED by its logging process at once, a
server that freezes after answering fails the job within the documented bound with
its results kept, and the command's own process never imports mlflow."""

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


def _blocked_command(tmp_path: Path, uri: str, new_group: bool) -> subprocess.Popen:
    """`paraplan predict` reading a FIFO nobody writes: it blocks mid-job, run open.
    The store is created first (the test reads it while the job runs)."""
    track.ensure_store(uri)
    fifo = tmp_path / "runs.csv"
    os.mkfifo(fifo)
    return subprocess.Popen(_predict(fifo, tmp_path / "never.csv"), cwd=tmp_path, env=_env(uri),
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "job.log").open("w"),
                            start_new_session=new_group)


def test_sigkilled_job_is_marked_killed_when_the_same_rule_runs_again(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job = _blocked_command(tmp_path, uri, new_group=True)
    (running,) = _wait_for(lambda: _runs(uri, "RUNNING"), "the job's run")
    os.killpg(job.pid, signal.SIGKILL)  # the command and its logging process
    job.wait()
    time.sleep(0.5)
    assert _runs(uri, "RUNNING")[0].info.run_id == running.info.run_id  # nobody was left to close it

    again = subprocess.run(_predict(RUNS, tmp_path / "out.csv"), cwd=tmp_path, env=_env(uri),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"MLflow run {running.info.run_id} of the same rule was left RUNNING" in again.stderr
    by_id = {r.info.run_id: r for r in _runs(uri)}
    killed = by_id.pop(running.info.run_id)
    assert killed.info.status == "KILLED"
    assert killed.data.tags["error"].startswith("the job's process ended without closing this run")
    (finished,) = by_id.values()
    assert finished.info.status == "FINISHED" and finished.data.tags["wildcards"] == "table=llm_a100"
    assert finished.info.run_id in killed.data.tags["error"]


def test_command_killed_alone_has_its_run_marked_killed_by_its_logging_process(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job = _blocked_command(tmp_path, uri, new_group=False)
    _wait_for(lambda: _runs(uri, "RUNNING"), "the job's run")
    job.kill()  # SIGKILL to the command only: its logging process sees its input end
    job.wait()
    (run,) = _wait_for(lambda: _runs(uri, "KILLED"), "the run marked KILLED", timeout_s=60)
    assert run.data.tags["error"] == "the command's process ended without closing its run (killed?)"


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


def test_server_frozen_after_the_probe_fails_the_job_within_the_bound_results_kept(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AnswersHealthThenFreezes)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    start = time.monotonic()
    done = subprocess.run(_predict(RUNS, tmp_path / "out.csv"), cwd=tmp_path, timeout=300,
                          env=_env(uri, **{track.ENV_TIMEOUT: "1"}), capture_output=True, text=True)
    elapsed = time.monotonic() - start
    server.shutdown()
    assert done.returncode == 2
    # each request waits 1 s, one retry after 1 s: ~3 s after the probe, not minutes
    assert elapsed < 30, elapsed
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(f"paraplan predict: error: MLflow tracking store '{uri}'")
    assert "results written, not logged" in errors[0] and "Traceback" not in done.stderr
    assert (tmp_path / "out.csv").stat().st_size > 0


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
