"""A command's MLflow run, logged by a process of its own.

`JobTracker` starts the logging process when the command starts: that process imports
mlflow, opens the store (creating a SQLite schema at most once per store), marks the
same rule's killed runs KILLED and opens the job's run (so its Duration is the job's),
all while the command computes. The command hands it the `RunLog`s once its result
files are written and waits for the answer; a store failure then fails the command
with one line naming the store, its files kept. If the command dies without closing
the run, the logging process marks it KILLED; if both die (a SIGKILL to the job's
process group), the next run of the same rule does (`track.mark_killed_runs`).

The two processes speak JSON lines: the command writes requests to the logging
process's stdin (`open`, then `log` per RunLog, then `close` or `fail`) and reads one
answer per request from its stdout (`{"ok": true, "run_id": ...}` or
`{"ok": false, "error": ...}`). Nothing here imports mlflow in the command's process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from paraplan.core import TrackingError
from paraplan.track import RunLog, Table, timeout_s, tracking_uri

_WORKER = "from paraplan.track_job import serve; raise SystemExit(serve())"


def _message(run: RunLog) -> dict[str, Any]:
    """A RunLog as JSON (paths absolute, numbers plain)."""
    from paraplan.track import _finite, _plain, flatten

    table = None
    if run.table is not None:
        table = {"name": run.table.name, "metrics": list(run.table.metrics),
                 "rows": [{str(k): _plain(v) for k, v in row.items()} for row in run.table.rows]}
    return {
        "stage": run.stage, "run_name": run.run_name, "params": flatten(run.params),
        "metrics": {k: f for k, v in run.metrics.items() if (f := _finite(v)) is not None},
        "step_metrics": {k: [[int(s), f] for s, v in series if (f := _finite(v)) is not None]
                         for k, series in run.step_metrics.items()},
        "artifacts": [str(Path(a).resolve()) for a in run.artifacts],
        "tags": {str(k): str(v) for k, v in run.tags.items()},
        "table": table,
    }


def _runlog(message: dict[str, Any]) -> RunLog:
    table = message.get("table")
    return RunLog(
        stage=message["stage"], run_name=message["run_name"], params=message["params"], metrics=message["metrics"],
        step_metrics={k: [(int(s), float(v)) for s, v in series] for k, series in message["step_metrics"].items()},
        artifacts=[Path(a) for a in message["artifacts"]], tags=message["tags"],
        table=None if table is None else Table(rows=table["rows"], metrics=table["metrics"], name=table["name"]),
    )


def _worker_env() -> dict[str, str]:
    """This process's environment, with the checkout paraplan was imported from first
    on the path, so the logging process runs the same code."""
    import paraplan

    env = dict(os.environ)
    root = str(Path(paraplan.__file__).resolve().parents[1])
    if Path(root).name != "site-packages":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


class JobTracker:
    """The MLflow run of one command, opened by its logging process."""

    def __init__(self, stage: str, run_name: str, rule: str, wildcards: str = "", command: str = "",
                 uri: str | None = None):
        self.uri = uri or tracking_uri()
        timeout_s()  # a malformed PARAPLAN_MLFLOW_TIMEOUT_S fails now, before any work
        self._error: str | None = None
        self._proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=_worker_env(), text=True)
        self._pending = 0
        self._request({"op": "open", "uri": self.uri, "stage": stage, "run_name": run_name, "rule": rule,
                       "wildcards": wildcards, "command": command, "pid": os.getpid(),
                       "start_ms": _now_ms()})
        self.run_ids: list[str] = []

    def _request(self, message: dict[str, Any]) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # the answer read below says why
        self._pending += 1

    def _answer(self) -> dict[str, Any]:
        """Read the answers up to the last request's; the first failure is kept."""
        assert self._proc.stdout is not None
        answer: dict[str, Any] = {"ok": False, "error": "no answer"}
        while self._pending:
            line = self._proc.stdout.readline()
            self._pending -= 1
            if not line:
                code = self._proc.wait()
                answer = {"ok": False, "error": f"the logging process ended (exit status {code})"}
                self._pending = 0
            else:
                answer = json.loads(line)
            if not answer["ok"] and self._error is None:
                self._error = answer["error"]
        return answer

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise TrackingError(self.uri, self._error)

    def wait_open(self) -> None:
        """Wait until the run is open; a store failure is raised now, before any work."""
        if self._pending:
            self._answer()
        self._raise_if_failed()

    def log(self, run: RunLog) -> str:
        """Log `run` (the job's run for the first RunLog of its stage); returns its id."""
        self._raise_if_failed()
        self._request({"op": "log", "run": _message(run)})
        answer = self._answer()
        self._raise_if_failed()
        self.run_ids.append(answer["run_id"])
        return answer["run_id"]

    def fail(self, error: str) -> str | None:
        """Mark the run FAILED with `error`; returns its id, or None when the store itself
        failed (the caller reports the original error)."""
        if self._error is None and self._proc.poll() is None:
            self._request({"op": "fail", "error": error})
            answer = self._answer()
        else:
            answer = {"ok": False}
        self._finish()
        return answer.get("run_id") if answer["ok"] else None

    def close(self) -> None:
        """End the job's run (FINISHED when it logged nothing) and the logging process."""
        if self._error is None and self._proc.poll() is None:
            self._request({"op": "close"})
            self._answer()
        self._finish()
        self._raise_if_failed()

    def _finish(self) -> None:
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()
        self._proc.wait()


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


class _Worker:
    """The logging process's state: the store, the job's open run, the first error."""

    def __init__(self) -> None:
        self.client = None
        self.uri = ""
        self.stage = ""
        self.tags: dict[str, str] = {}
        self.open_id: str | None = None
        self.since_ms = 0
        self.error: str | None = None

    def open(self, m: dict[str, Any]) -> dict[str, Any]:
        from paraplan import track
        from paraplan.track_tags import job_tags

        self.uri, self.stage, self.since_ms = m["uri"], m["stage"], m["start_ms"]
        track.probe(self.uri)
        self.tags = job_tags(m["rule"], m["wildcards"], command=m["command"], pid=m["pid"])
        with track._tracking_errors(self.uri):
            self.client = track._client(self.uri)
            experiment_id = track._experiment_id(self.client, self.stage, self.uri)
            self.open_id = track.create_run(self.client, experiment_id, m["run_name"], self.tags, self.since_ms)
            killed = track.mark_killed_runs(self.client, experiment_id, self.tags, by=self.open_id)
        for run_id in killed:
            print(f"paraplan: MLflow run {run_id} of the same rule was left RUNNING by a killed job: marked KILLED",
                  file=sys.stderr)
        return {"ok": True, "run_id": self.open_id}

    def log(self, m: dict[str, Any]) -> dict[str, Any]:
        from paraplan import track

        run = _runlog(m["run"])
        with track._tracking_errors(self.uri):
            if self.open_id is not None and run.stage == self.stage:
                run_id, self.open_id = self.open_id, None
                self.client.update_run(run_id, name=run.run_name)  # type: ignore[attr-defined]
            else:
                experiment_id = track._experiment_id(self.client, run.stage, self.uri)
                run_id = track.create_run(self.client, experiment_id, run.run_name, self.tags, self.since_ms)
            track.fill_run(self.client, run_id, run)
        self.since_ms = _now_ms()
        return {"ok": True, "run_id": run_id}

    def end(self, status: str, error: str) -> dict[str, Any]:
        """FAILED/KILLED: the open run, else a new one; FINISHED: the open run if any."""
        from paraplan import track

        run_id = self.open_id
        with track._tracking_errors(self.uri):
            if status == "FINISHED":
                if run_id is not None:
                    self.client.set_terminated(run_id, "FINISHED")  # type: ignore[attr-defined]
            else:
                if run_id is None:
                    experiment_id = track._experiment_id(self.client, self.stage, self.uri)
                    run_id = track.create_run(self.client, experiment_id, f"{self.stage} ({status.lower()})",
                                              self.tags, self.since_ms)
                track.end_run(self.client, run_id, status, error)
        self.open_id = None
        return {"ok": True, "run_id": run_id}


def serve(requests: IO[str] | None = None, answers: IO[str] | None = None) -> int:
    """The logging process: answer the command's requests until `close`, `fail` or the
    end of its input (the command died: its open run is marked KILLED)."""
    if answers is not None:  # tests pass streams
        return _serve(requests or sys.stdin, answers)
    # Ctrl-C and SIGTERM reach the whole process group: the command reports them as a
    # failure, which this process must still be alive to log
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # answers go to the real stdout; anything printed (mlflow's notes) to stderr
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    code = _serve(requests or sys.stdin, answers)
    sys.stderr.flush()
    # every write is committed: skip the interpreter's teardown of mlflow's modules and
    # exit hooks (2-3 s on a loaded 2-core machine, which the command would wait for)
    os._exit(code)


def _serve(requests: IO[str], answers: IO[str]) -> int:
    from paraplan.core import ParaplanError

    worker = _Worker()
    actions = {"open": worker.open, "log": worker.log,
               "fail": lambda m: worker.end("FAILED", m["error"]), "close": lambda m: worker.end("FINISHED", "")}
    for line in requests:
        message = json.loads(line)
        op = message["op"]
        if worker.error is not None:
            answer: dict[str, Any] = {"ok": False, "error": worker.error}
        else:
            try:
                answer = actions[op](message)
            except ParaplanError as exc:
                worker.error = exc.detail if isinstance(exc, TrackingError) else str(exc)
                answer = {"ok": False, "error": worker.error}
            except ImportError as exc:
                worker.error = f"cannot import mlflow ({exc}); install it (pip install mlflow) or run --no-track"
                answer = {"ok": False, "error": worker.error}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
        if op in ("close", "fail"):
            return 0
    if worker.error is None and worker.open_id is not None:
        try:
            worker.end("KILLED", "the command's process ended without closing its run (killed?)")
        except ParaplanError:
            return 1
    return 0
