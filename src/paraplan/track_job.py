"""The logging process: logs the spool's records (`paraplan.track_spool`) to MLflow.

One process logs many records: the workflow's `onsuccess`/`onerror` handler logs
every record of the folder once its jobs have ended (`log_workflow_runs`); after a
standalone command, the detached process that command started (`main`); on demand,
`paraplan track`. mlflow is imported and the store opened once per process.

Which records are logged: FINISHED and FAILED ones; a RUNNING one whose process is
gone (same host: its pid has ended or belongs to a younger process) as KILLED; and,
at the end of a workflow, a RUNNING one from another host when a workflow job wrote
it (every job of this invocation has ended, and Snakemake's lock on the working
directory means no job of an earlier one runs). A RUNNING record of another host's
standalone command cannot be checked and is left as it is.

Each record is claimed with an exclusive `flock` (two logging processes never log one
record twice) and removed once its runs are FINISHED/FAILED/KILLED in the store. A
store failure stops the logging into that store: the record keeps the error
(`log_error`), the next command reports it and its logging process tries again.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paraplan.core import ParaplanError, TrackingError
from paraplan.track_spool import message_runlog, read_record, records, spool_dir, write_record
from paraplan.track_tags import TAG_HOST, TAG_PID, commit_tags, git_commit

KILLED_ERROR = "the job's process ended without finishing its run (killed?)"


@dataclass
class LogOutcome:
    """What one pass over the spool did."""

    run_ids: list[str] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)  # run ids logged as KILLED
    errors: dict[str, str] = field(default_factory=dict)  # store -> its first error
    left: int = 0  # records left in the spool (still running, or not logged)
    logged: int = 0  # records this pass logged (each holds one or more runs)
    by_other: int = 0  # records another logging process logged while this one waited for them


_GONE = "gone"  # what `_claimed` yields for a record another process logged and removed


@contextmanager
def _claimed(path: Path, wait: bool) -> Iterator[dict[str, Any] | str | None]:
    """The record at `path` under an exclusive lock; `_GONE` when another logging
    process logged and removed it (before this one opened it, or while this one waited
    for its lock); None when another process holds it (without `wait`) or it is not a
    record of this version."""
    try:
        handle = open(path)  # noqa: SIM115 (held open for the lock, closed by the with below)
    except OSError:
        yield _GONE
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError:
            yield None
            return
        try:
            same = os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
        except OSError:
            same = False  # logged and removed by the process that held the lock
        yield read_record(path) if same else _GONE


def _status(record: dict[str, Any], workflow_end: str | None) -> str | None:
    """The status to log a record with, or None to leave it (its job still runs)."""
    from paraplan.track import process_gone

    if record["status"] != "RUNNING":
        return record["status"]
    tags = record["tags"]
    if tags.get(TAG_HOST) == socket.gethostname():
        return "KILLED" if process_gone(tags.get(TAG_PID, ""), record["start_ms"]) else None
    workflow_job = not str(tags.get("invocation_id", "standalone")).startswith("standalone")
    return "KILLED" if workflow_end is not None and workflow_job else None


def log_record(client, record: dict[str, Any], status: str, commits: dict[str, str], created: list[str]) -> None:
    """Log one record's runs, appending their ids to `created` as each is created. The
    first run starts when the job started, each later one when the previous was
    added; the last carries the job's status (FAILED/KILLED with its error), the
    others are FINISHED."""
    from paraplan import track

    uri = record["uri"]
    workdir = record["tags"].get("paraplan.workdir", "")
    tags = dict(record["tags"])
    if "git_commit" not in tags:
        if workdir not in commits:
            commits[workdir] = git_commit(Path(workdir) if workdir and Path(workdir).is_dir() else None)
        tags.update(commit_tags(commits[workdir], record.get("command") or tags.get("rule", "")))
    runs = record["runs"] or [None]
    end_ms = record.get("end_ms") or record["start_ms"]
    error = record.get("error") or (KILLED_ERROR if status == "KILLED" else "")
    start_ms = record["start_ms"]
    for i, message in enumerate(runs):
        last = i == len(runs) - 1
        stage = message["stage"] if message else record["stage"]
        name = message["run_name"] if message else record["run_name"]
        experiment_id = track._experiment_id(client, stage, uri)
        run_id = track.create_run(client, experiment_id, name, tags, start_ms)
        created.append(run_id)
        at_ms = (message or {}).get("at_ms") or end_ms
        if message is not None:
            track.fill_run(client, run_id, message_runlog(message), finish=not (last and status != "FINISHED"),
                           end_ms=end_ms if last else at_ms)
        elif status == "FINISHED":
            client.set_terminated(run_id, "FINISHED", end_time=end_ms)
        if last and status != "FINISHED":
            track.end_run(client, run_id, status, error, end_ms=end_ms)
        start_ms = at_ms


def log_pending(spool: Path | None = None, wait: bool = False, workflow_end: str | None = None) -> LogOutcome:
    """Log every record of `spool` that is ready (see the module doc). `wait`: wait for
    records another logging process holds (`paraplan track`, the workflow's end).
    `workflow_end`: the invocation id of a workflow whose jobs have all ended."""
    from paraplan import track

    spool = spool or spool_dir()
    outcome = LogOutcome()
    clients: dict[str, Any] = {}
    commits: dict[str, str] = {}
    for path in records(spool):
        with _claimed(path, wait) as record:
            if record is None or isinstance(record, str):
                outcome.by_other += record == _GONE
                continue
            status = _status(record, workflow_end)
            uri = record["uri"]
            if status is None or uri in outcome.errors:
                outcome.left += 1
                continue
            ids: list[str] = []
            try:
                if uri not in clients:
                    track.probe(uri)
                    with track._tracking_errors(uri):
                        clients[uri] = track._client(uri)
                with track._tracking_errors(uri):
                    for run_id in record.get("partial_run_ids", []):  # an interrupted try's
                        clients[uri].delete_run(run_id)
                    log_record(clients[uri], record, status, commits, ids)
            except TrackingError as exc:
                outcome.errors[uri] = exc.detail
            except ImportError as exc:
                outcome.errors[uri] = f"cannot import mlflow ({exc}); install it (pip install mlflow) or run --no-track"
            if uri in outcome.errors:
                record["log_error"] = outcome.errors[uri]
                record["partial_run_ids"] = ids or record.get("partial_run_ids", [])
                write_record(path, record)
                outcome.left += 1
                continue
            path.unlink()
            outcome.run_ids += ids
            outcome.logged += 1
            if status == "KILLED":
                outcome.killed.append(ids[-1])
    return outcome


def log_workflow_runs(invocation_id: str, spool: Path | None = None) -> LogOutcome:
    """The workflow's end: log every record of its spool (its jobs', and any an earlier
    run left), waiting for records another logging process holds."""
    return log_pending(spool, wait=True, workflow_end=invocation_id)


def describe(outcome: LogOutcome, spool: Path) -> list[str]:
    """What a pass did, as lines for the user (errors first)."""
    lines = [f"error: MLflow tracking store '{uri}': {error} (results written, not logged; kept in {spool}: "
             "the next command or `paraplan track` logs them)" for uri, error in outcome.errors.items()]
    lines += [f"MLflow run {run_id}: its job ended without finishing it (killed?): logged KILLED"
              for run_id in outcome.killed]
    lines.append(_summary(outcome, spool))
    return lines


def _summary(outcome: LogOutcome, spool: Path) -> str:
    """What was logged, and by whom: a record gone from the spool was logged (records
    are removed only once their runs are in the store), so an empty spool means every
    run recorded there is logged, by the background logger of the command that wrote
    it (or an earlier pass) rather than by this one."""
    other = (f"{outcome.by_other} already logged by the background logger (this pass waited for it)"
             if outcome.by_other else "")
    if not outcome.logged and not outcome.left and not outcome.errors:
        return (f"0 pending, {other}" if other else
                f"0 pending in {spool}: every run recorded there is already logged (each command's background "
                "logger logs its run when the command ends)")
    return (f"logged {len(outcome.run_ids)} MLflow run(s) from {outcome.logged} pending record(s)"
            + (f", {other}" if other else "")
            + (f"; {outcome.left} record(s) left in {spool}" if outcome.left else ""))


def main(argv: list[str] | None = None) -> int:
    """The detached logging process of a standalone command: `python -c ... SPOOL`."""
    from paraplan.track import http_defaults

    args = sys.argv[1:] if argv is None else argv
    spool = Path(args[0]) if args else spool_dir()
    http_defaults()
    try:
        outcome = log_pending(spool)
    except ParaplanError as exc:
        print(f"paraplan track: error: {exc}", file=sys.stderr)
        return 2
    for line in describe(outcome, spool)[:-1]:  # errors and killed runs (its log file stays small)
        print(f"paraplan track: {line}", file=sys.stderr)
    sys.stderr.flush()
    # every write is committed: skip the interpreter's teardown of mlflow's modules
    os._exit(1 if outcome.errors else 0)
