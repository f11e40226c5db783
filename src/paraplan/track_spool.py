"""A command's MLflow run as a file: the command writes it and returns; one logging
process logs it later (docs/tracking.md). No mlflow import here.

A tracked command writes a *record* (JSON) into the spool folder when it starts
(status RUNNING, its process id, host and tags), and rewrites it when it ends: its
`RunLog`s (params, metrics, series, table, artifact paths), its end time and its
status (FINISHED, or FAILED with the error). Who logs the record:
- under Snakemake (the workflow sets `PARAPLAN_TRACKING_SPOOL`), the workflow, once,
  in its `onsuccess`/`onerror` handler (`paraplan.track_job.log_workflow_runs`);
- a standalone command starts a detached logging process as it exits, which the
  command does not wait for; a failure of that process is kept in the record
  (`log_error`) and reported by the next command run in the same folder, whose
  logging process tries again (so does `paraplan track`).
A record still RUNNING whose process is gone is logged as a KILLED run.

Records are written atomically (a temporary file, then a rename), so a logging
process reads a whole record or none.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from paraplan.core import TrackingError
from paraplan.track import RunLog, Table, probe, timeout_s, tracking_uri
from paraplan.track_tags import ENV_GIT_COMMIT, job_tags

ENV_SPOOL = "PARAPLAN_TRACKING_SPOOL"  # set by the workflow: its end logs the folder
DEFAULT_SPOOL = Path(".paraplan") / "runs"
RECORD_VERSION = 1
LOGGER_LOG = "logger.log"
_LOGGER = "from paraplan.track_job import main; raise SystemExit(main())"


def spool_dir() -> Path:
    """Where records go: `PARAPLAN_TRACKING_SPOOL`, else `.paraplan/runs` here."""
    text = os.environ.get(ENV_SPOOL, "").strip()
    return Path(text).resolve() if text else (Path.cwd() / DEFAULT_SPOOL)


def logged_by_workflow() -> bool:
    """True under Snakemake: the workflow's end logs the records, not the command."""
    return bool(os.environ.get(ENV_SPOOL, "").strip())


def now_ms() -> int:
    return int(time.time() * 1000)


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write `record` to `path` atomically (readers see the old or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def read_record(path: Path) -> dict[str, Any] | None:
    """A record, or None when it is gone or not a record of this version."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("version") == RECORD_VERSION else None


def records(spool: Path) -> list[Path]:
    """The spool's records, oldest first (names start with the start time)."""
    try:
        return sorted(p for p in spool.iterdir() if p.suffix == ".json" and not p.name.startswith("."))
    except OSError:
        return []


def runlog_message(run: RunLog) -> dict[str, Any]:
    """A RunLog as JSON (paths absolute, numbers plain, NaN dropped)."""
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


def message_runlog(message: dict[str, Any]) -> RunLog:
    table = message.get("table")
    return RunLog(
        stage=message["stage"], run_name=message["run_name"], params=message["params"], metrics=message["metrics"],
        step_metrics={k: [(int(s), float(v)) for s, v in series] for k, series in message["step_metrics"].items()},
        artifacts=[Path(a) for a in message["artifacts"]], tags=message["tags"],
        table=None if table is None else Table(rows=table["rows"], metrics=table["metrics"], name=table["name"]),
    )


def _logger_env() -> dict[str, str]:
    """This environment, with the checkout paraplan was imported from first on the
    path, so the logging process runs the same code."""
    import paraplan

    env = dict(os.environ)
    root = str(Path(paraplan.__file__).resolve().parents[1])
    if Path(root).name != "site-packages":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def start_logger(spool: Path) -> None:
    """Start the detached logging process of `spool` (its own session: Ctrl-C at the
    terminal and the end of this process leave it running); nobody waits for it."""
    spool.mkdir(parents=True, exist_ok=True)
    with open(spool / LOGGER_LOG, "a") as log:
        subprocess.Popen([sys.executable, "-c", _LOGGER, str(spool)], cwd=Path.cwd(), env=_logger_env(),
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                         start_new_session=True, close_fds=True)


def unlogged(spool: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Records whose logging failed earlier (they carry `log_error`)."""
    found = []
    for path in records(spool):
        record = read_record(path)
        if record is not None and record.get("log_error"):
            found.append((path, record))
    return found


def report_unlogged(spool: Path, prog: str) -> None:
    """One line per earlier run that could not be logged (at most 3, then a count)."""
    failed = unlogged(spool)
    for path, record in failed[:3]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.get("start_ms", 0) / 1000))
        print(f"{prog}: warning: the MLflow run of an earlier `paraplan {record.get('command', '')}` ({when}) was not "
              f"logged: {record['log_error']}; kept in {path}, logged again when this command ends "
              "(or by `paraplan track`)", file=sys.stderr)
    if len(failed) > 3:
        print(f"{prog}: warning: {len(failed) - 3} more earlier runs were not logged (in {spool})", file=sys.stderr)


class PendingRun:
    """The MLflow run of one command, as a record in the spool (see the module doc)."""

    def __init__(self, stage: str, run_name: str, rule: str, wildcards: str = "", command: str = "",
                 uri: str | None = None):
        self.uri = uri or tracking_uri()
        seconds = timeout_s()  # a malformed PARAPLAN_MLFLOW_TIMEOUT_S fails now, before any work
        self.prog = f"paraplan {command or stage}"
        self.by_workflow = logged_by_workflow()
        if not self.by_workflow and importlib.util.find_spec("mlflow") is None:
            raise TrackingError(self.uri, "cannot import mlflow; install it (pip install mlflow) or run --no-track")
        self.spool = spool_dir()
        start = now_ms()
        self.path = self.spool / f"{start}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        self.record: dict[str, Any] = {
            "version": RECORD_VERSION, "status": "RUNNING", "uri": self.uri, "stage": stage,
            "run_name": run_name, "command": command, "start_ms": start, "end_ms": None, "error": "",
            "tags": job_tags(rule, wildcards, command=command, commit=os.environ.get(ENV_GIT_COMMIT)),
            "runs": [],
        }
        try:
            write_record(self.path, self.record)
        except OSError as exc:
            raise TrackingError(self.uri, f"cannot write the run's record in {self.spool} ({exc.strerror}); "
                                "set PARAPLAN_TRACKING_SPOOL to a writable folder or run --no-track") from None
        if not self.by_workflow:
            report_unlogged(self.spool, self.prog)
        # a server that does not answer is found while the command works (an HTTP
        # request, no mlflow import) and reported when it ends, its results written
        self._unreachable: str | None = None
        self._probe: threading.Thread | None = None
        if not self.by_workflow and self.uri.startswith(("http://", "https://")):
            self._probe = threading.Thread(target=self._check_server, args=(seconds,), daemon=True)
            self._probe.start()

    def _check_server(self, seconds: float) -> None:
        try:
            probe(self.uri, seconds)
        except TrackingError as exc:
            self._unreachable = exc.detail

    def log(self, run: RunLog) -> str:
        """Add `run` (the job's run for the first RunLog); returns where it waits."""
        self.record["runs"].append({**runlog_message(run), "at_ms": now_ms()})
        return str(self.path)

    def _end(self, status: str, error: str) -> None:
        self.record.update(status=status, error=error, end_ms=now_ms())
        write_record(self.path, self.record)

    def close(self) -> None:
        """Mark the record FINISHED and have it logged; an unreachable server is a
        `TrackingError` now (the results and the record are kept)."""
        self._end("FINISHED", "")
        if self._probe is not None:
            self._probe.join()
            if self._unreachable is not None:
                self.record["log_error"] = self._unreachable
                write_record(self.path, self.record)
                raise TrackingError(self.uri, f"{self._unreachable} (results written, not logged; kept in "
                                    f"{self.path}: a later command or `paraplan track` logs it)")
        if not self.by_workflow:
            start_logger(self.spool)

    def fail(self, error: str) -> str | None:
        """Mark the record FAILED with `error` and have it logged; returns the record's path."""
        try:
            self._end("FAILED", error)
        except OSError:
            return None
        if not self.by_workflow and not self.record.get("log_error"):  # (an unreachable server: not again now)
            try:
                start_logger(self.spool)
            except OSError:
                return None
        return str(self.path)
