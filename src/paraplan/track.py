"""MLflow tracking: the only module that imports mlflow.

A stage describes what to log as a `RunLog` (pure data). A command's runs go through
a `JobTracker`, opened when the command starts (so a run's Duration is the job's),
filled with the command's `RunLog`s as they are ready, and marked FAILED with the
error when the command fails. `log_run` logs one `RunLog` in one go.

Default store: `sqlite:///mlflow.db` in the working directory (the repository root
under Snakemake) with artifacts in `mlruns/`, so `mlflow ui` there shows everything.
`MLFLOW_TRACKING_URI` overrides it. A tracking server that does not answer within
`PARAPLAN_MLFLOW_TIMEOUT_S` seconds (config `mlflow.timeout_s`) is an error at once,
not after MLflow's minutes of retries; `PARAPLAN_TRACKING=off` (config
`mlflow.enabled: false`, or `--no-track`) runs untracked.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import math
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from paraplan.core import TrackingError

ENV_INVOCATION = "PARAPLAN_INVOCATION_ID"
ENV_INVOCATION_START = "PARAPLAN_INVOCATION_START_MS"
ENV_CONFIG_DIGEST = "PARAPLAN_CONFIG_DIGEST"
ENV_TRACKING = "PARAPLAN_TRACKING"  # "off": log nothing
ENV_TIMEOUT = "PARAPLAN_MLFLOW_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_DB = "mlflow.db"
DEFAULT_ARTIFACT_DIR = "mlruns"
_PARAM_MAX_CHARS = 6000


@dataclass(frozen=True)
class RunLog:
    """Everything one job logs: one MLflow run (with optional child runs)."""

    stage: str  # experiment `paraplan-<stage>`
    run_name: str
    params: Mapping[str, object] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    step_metrics: Mapping[str, Sequence[tuple[int, float]]] = field(default_factory=dict)
    artifacts: Sequence[Path] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    children: Sequence[RunLog] = ()


def tracking_uri() -> str:
    """`MLFLOW_TRACKING_URI` if set, else the SQLite store in the working directory."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    return uri or f"sqlite:///{Path.cwd() / DEFAULT_DB}"


def tracking_enabled() -> bool:
    """False when `PARAPLAN_TRACKING` is off (config `mlflow.enabled: false`)."""
    return os.environ.get(ENV_TRACKING, "on").strip().lower() not in ("off", "0", "false", "no")


def timeout_s() -> float:
    """Seconds a tracking server may take to answer (`PARAPLAN_MLFLOW_TIMEOUT_S`)."""
    text = os.environ.get(ENV_TIMEOUT, "").strip()
    try:
        value = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise TrackingError(tracking_uri(), f"{ENV_TIMEOUT}={text!r} is not a number of seconds") from None
    return value if value > 0 else DEFAULT_TIMEOUT_S


_UNTRACKED_HINT = ("start it, point MLFLOW_TRACKING_URI elsewhere, or run untracked "
                   "(paraplan: --no-track; snakemake: config mlflow.enabled: false, or "
                   "PARAPLAN_TRACKING=off snakemake)")


def probe(uri: str, seconds: float | None = None) -> None:
    """Fail within `seconds` when an HTTP tracking server does not answer, and bound
    MLflow's own retries (by default they last minutes). Any HTTP answer counts as
    reachable; local stores (SQLite, files) are checked by their first use."""
    if not uri.startswith(("http://", "https://")):
        return
    seconds = timeout_s() if seconds is None else seconds
    # a server that answered the probe gets a few quick retries, not MLflow's 7 with
    # exponential back-off (environment values set by the user win)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(30, math.ceil(seconds))))
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=seconds):
            pass
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingError(uri, f"unreachable ({reason}; waited at most {seconds:g} s); {_UNTRACKED_HINT}") from None


def flatten(mapping: Mapping[str, object], prefix: str = "") -> dict[str, str]:
    """Nested settings as MLflow params: `{"a": {"b": 1}}` -> `{"a.b": "1"}`."""
    flat: dict[str, str] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, list | tuple):
            flat[name] = ",".join(str(v) for v in value)
        else:
            flat[name] = "" if value is None else str(value)
    return flat


def config_digest(config: Mapping[str, object]) -> str:
    """A short, stable digest of a config mapping."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _git_commit_in(directory: Path | None) -> str:
    where = ["-C", str(directory)] if directory is not None else []
    try:
        out = subprocess.run(["git", *where, "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=False)
        if out.returncode != 0 or not out.stdout.strip():
            return "unknown"
        dirty = subprocess.run(
            ["git", *where, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() + ("-dirty" if dirty else "")


def _git_commit() -> str:
    """The commit of the working directory's repository (the workflow's, under
    Snakemake), else of the checkout paraplan runs from; `-dirty` with local changes."""
    commit = _git_commit_in(None)
    if commit == "unknown":
        commit = _git_commit_in(Path(__file__).resolve().parents[2])
    return commit


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return os.environ.get("USER", "unknown")


def standard_tags(source_name: str, commit: str) -> dict[str, str]:
    """MLflow's own source, git and user tags (the UI shows them in its columns)."""
    tags = {"mlflow.source.name": source_name, "mlflow.source.type": "LOCAL", "mlflow.user": _user()}
    if commit != "unknown":
        tags["mlflow.source.git.commit"] = commit.removesuffix("-dirty")
    return tags


def job_tags(rule: str, wildcards: str = "", command: str = "") -> dict[str, str]:
    """The tags of docs/design.md plus MLflow's standard ones, computed when the job runs
    (never Snakemake params)."""
    commit = _git_commit()
    return {
        "rule": rule,
        "wildcards": wildcards,
        "git_commit": commit,
        "config_digest": os.environ.get(ENV_CONFIG_DIGEST, "none"),
        "invocation_id": os.environ.get(ENV_INVOCATION) or f"standalone-{uuid.uuid4().hex[:12]}",
        **standard_tags(f"paraplan {command or rule}", commit),
    }


_READY_STORES: set[str] = set()


def _client(uri: str):
    """A client of a usable store: the first use in this process creates (or upgrades)
    the schema of a SQLite store while holding a lock beside the database, so commands
    started together never race MLflow's schema creation (which leaves the store
    broken for all of them)."""
    import mlflow  # noqa: F401  (kept local: importing mlflow costs seconds)
    from mlflow.tracking import MlflowClient

    if uri not in _READY_STORES:
        with _store_lock(uri):
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        _READY_STORES.add(uri)
    return MlflowClient(tracking_uri=uri)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI (None for other stores and in-memory ones)."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    rest = uri[len(prefix):].split("?", 1)[0]
    return Path(rest) if rest and rest != ":memory:" else None


class _store_lock:
    """An exclusive `flock` on `<database>.lock` beside a SQLite store (no-op for other
    stores, or where the folder cannot hold the lock file: MLflow then reports the
    store's own error)."""

    def __init__(self, uri: str):
        self.path = sqlite_path(uri)
        self.handle = None

    def __enter__(self):
        if self.path is None:
            return self
        import fcntl

        try:
            self.handle = open(self.path.with_name(self.path.name + ".lock"), "a")
        except OSError:
            return self
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            import fcntl

            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()


def _artifact_root() -> str:
    return (Path.cwd() / DEFAULT_ARTIFACT_DIR).resolve().as_uri()


def ensure_store(uri: str | None = None, attempts: int = 5) -> None:
    """Create the store (SQLite schema) once, before parallel jobs start: concurrent
    first use of a fresh SQLite store fails in MLflow 3.x."""
    uri = uri or tracking_uri()
    probe(uri)
    last: Exception | None = None
    for attempt in range(attempts):
        try:
            _client(uri).search_experiments(max_results=1)
            return
        except Exception as exc:  # mlflow raises many types; all mean "store unusable"
            last = exc
            time.sleep(0.5 * (attempt + 1))
    raise TrackingError(uri, f"cannot open or create the store: {last}")


def _experiment_id(client, stage: str, uri: str) -> str:
    name = f"paraplan-{stage}"
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    kwargs = {}
    if uri.startswith("sqlite:") or uri.startswith("file:") or "://" not in uri:
        kwargs["artifact_location"] = f"{_artifact_root()}/{name}"  # mlruns/paraplan-<stage>/<run id>/
    try:
        return client.create_experiment(name, **kwargs)
    except Exception:
        # another job created it meanwhile
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _fill(client, experiment_id: str, run_id: str, run: RunLog, base_tags: dict) -> None:
    """Log a RunLog's params, metrics, artifacts and children into an open run and
    mark it FINISHED."""
    from mlflow.entities import Metric, Param

    now_ms = _now_ms()
    params = [Param(k, v[:_PARAM_MAX_CHARS]) for k, v in flatten(run.params).items()]
    metrics = [
        Metric(k, float(v), now_ms, 0) for k, v in run.metrics.items() if v is not None and math.isfinite(float(v))
    ]
    for name, series in run.step_metrics.items():
        metrics.extend(
            Metric(name, float(v), now_ms, int(step)) for step, v in series if math.isfinite(float(v))
        )
    for chunk in _chunks(params, 100):
        client.log_batch(run_id, params=chunk)
    for chunk in _chunks(metrics, 1000):
        client.log_batch(run_id, metrics=chunk)
    for artifact in run.artifacts:
        path = Path(artifact)
        if path.is_dir():
            client.log_artifacts(run_id, str(path), artifact_path=path.name)
        elif path.is_file():
            client.log_artifact(run_id, str(path))
    for child in run.children:
        _log_one(client, experiment_id, child, run_id, dict(base_tags))
    client.set_terminated(run_id, "FINISHED")


def _create(client, experiment_id: str, run: RunLog, parent_id: str | None, base_tags: dict,
            start_ms: int | None = None) -> str:
    tags = {**base_tags, **run.tags}
    if parent_id is not None:
        tags["mlflow.parentRunId"] = parent_id
    created = client.create_run(experiment_id, run_name=run.run_name, tags=tags,
                                start_time=start_ms if start_ms is not None else _now_ms())
    return created.info.run_id


def _log_one(client, experiment_id: str, run: RunLog, parent_id: str | None, base_tags: dict,
             start_ms: int | None = None) -> str:
    run_id = _create(client, experiment_id, run, parent_id, base_tags, start_ms)
    _fill(client, experiment_id, run_id, run, base_tags)
    return run_id


class JobTracker:
    """The MLflow runs of one command, opened when the command starts.

    The first `RunLog` of the command's stage fills the run opened at the start; any
    further one (a standalone bench call over several collectives, a plan study over
    several layouts) gets a run of its own that starts where the previous one ended.
    `fail` marks the open run (or a new one) FAILED with the error as its note, so a
    failed job is visible in the UI with its real duration.
    """

    def __init__(self, stage: str, run_name: str, base_tags: Mapping[str, str], uri: str | None = None):
        self.uri = uri or tracking_uri()
        self.stage = stage
        self.base_tags = dict(base_tags)
        probe(self.uri)
        started = _now_ms()
        with self._errors():
            self._client = _client(self.uri)
            self._open: str | None = _create(self._client, self._experiment(stage),
                                             RunLog(stage, run_name), None, self.base_tags, started)
        self._since_ms = started
        self.run_ids: list[str] = []

    def _errors(self):
        return _tracking_errors(self.uri)

    def _experiment(self, stage: str) -> str:
        return _experiment_id(self._client, stage, self.uri)

    def log(self, run: RunLog) -> str:
        """Log `run` (and its children); returns its run id."""
        with self._errors():
            experiment_id = self._experiment(run.stage)
            if self._open is not None and run.stage == self.stage:
                run_id, self._open = self._open, None
                self._client.update_run(run_id, name=run.run_name)
                for key, value in run.tags.items():
                    self._client.set_tag(run_id, key, value)
            else:
                run_id = _create(self._client, experiment_id, run, None, self.base_tags, self._since_ms)
            _fill(self._client, experiment_id, run_id, run, self.base_tags)
        self._since_ms = _now_ms()
        self.run_ids.append(run_id)
        return run_id

    def fail(self, error: str) -> str | None:
        """Mark the open run (or a new one) FAILED with `error`; returns its id, or None
        when the store itself failed (the caller reports the original error)."""
        try:
            with self._errors():
                if self._open is not None:
                    run_id, self._open = self._open, None
                else:
                    run_id = _create(self._client, self._experiment(self.stage),
                                     RunLog(self.stage, f"{self.stage} (failed)"), None, self.base_tags,
                                     self._since_ms)
                self._client.set_tag(run_id, "error", error[:5000])
                self._client.set_tag(run_id, "mlflow.note.content", f"**failed**: {error}"[:5000])
                self._client.set_terminated(run_id, "FAILED")
                return run_id
        except TrackingError:
            return None

    def close(self) -> None:
        """End a run the command opened but never filled (it logged nothing)."""
        if self._open is not None:
            with self._errors():
                self._client.set_terminated(self._open, "FINISHED")
            self._open = None


class _tracking_errors:
    """Turn any store failure into a TrackingError naming the store."""

    def __init__(self, uri: str):
        self.uri = uri

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, TrackingError) or not isinstance(exc, Exception):
            return False
        raise TrackingError(self.uri, f"{type(exc).__name__}: {exc}") from None


def log_run(run: RunLog, base_tags: Mapping[str, str] | None = None, uri: str | None = None) -> str:
    """Log `run` (and its children) to the store; returns the run id.

    Any failure becomes a `TrackingError` naming the store; result files are untouched.
    """
    uri = uri or tracking_uri()
    probe(uri)
    with _tracking_errors(uri):
        client = _client(uri)
        experiment_id = _experiment_id(client, run.stage, uri)
        return _log_one(client, experiment_id, run, None, dict(base_tags or {}))


def _run_link(uri: str, experiment_id: str, run_id: str) -> str:
    """A UI-relative link to a run (`mlflow ui` serves it at http://127.0.0.1:5000/)."""
    return f"#/experiments/{experiment_id}/runs/{run_id}"


def log_invocation_summary(invocation_id: str, uri: str | None = None, failed: bool = False,
                           error: str = "", start_ms: int | None = None) -> str | None:
    """One run in experiment `paraplan-invocation` that lists every run of one
    `snakemake` call (tag `invocation_id`), with their status and links by run id. It
    starts when the invocation started (`start_ms`) and is FAILED when the invocation
    failed (Snakemake's `onerror`), then with `error` as its note. Returns its run id,
    or None when a successful invocation logged nothing."""
    uri = uri or tracking_uri()
    probe(uri)
    with _tracking_errors(uri):
        client = _client(uri)
        experiments = [e for e in client.search_experiments() if e.name.startswith("paraplan-")
                       and e.name != "paraplan-invocation"]
        rows = []
        for exp in experiments:
            for run in client.search_runs(
                [exp.experiment_id],
                filter_string=f"tags.invocation_id = '{invocation_id}'",
                max_results=5000,
            ):
                if "mlflow.parentRunId" in run.data.tags:
                    continue  # children are reachable from their parent
                rows.append((exp.name.removeprefix("paraplan-"), run))
        if not rows and not failed:
            return None
        rows.sort(key=lambda r: (r[1].info.start_time or 0))
        lines = [
            f"# paraplan invocation {invocation_id}" + (" (failed)" if failed else ""),
            *(["", error] if error else []),
            "",
            "| stage | run | rule | wildcards | status | link |",
            "|---|---|---|---|---|---|",
        ]
        tags = {}
        for stage, run in rows:
            name = run.data.tags.get("mlflow.runName", "")
            link = _run_link(uri, run.info.experiment_id, run.info.run_id)
            lines.append(
                f"| {stage} | {name} | {run.data.tags.get('rule', '')} | "
                f"{run.data.tags.get('wildcards', '')} | {run.info.status} | [{run.info.run_id}]({link}) |"
            )
            tags[f"run.{stage}.{name}"[:250]] = run.info.run_id
        statuses = [run.info.status for _, run in rows]
        metrics = {f"runs_{stage}": float(sum(1 for s, _ in rows if s == stage)) for stage, _ in rows}
        metrics["runs_failed"] = float(statuses.count("FAILED"))
        summary = RunLog(
            stage="invocation",
            run_name=f"invocation-{invocation_id[:12]}",
            params={"invocation_id": invocation_id, "runs": len(rows)},
            metrics=metrics,
            tags={**tags, "invocation_id": invocation_id,
                  "mlflow.note.content": "\n".join(lines),
                  **({"error": error[:5000]} if error else {})},
        )
        experiment_id = _experiment_id(client, "invocation", uri)
        commit = _git_commit()
        base = {"git_commit": commit, **standard_tags("snakemake", commit)}
        run_id = _create(client, experiment_id, summary, None, base, start_ms)
        client.log_text(run_id, "\n".join(lines) + "\n", "runs.md")
        _fill(client, experiment_id, run_id, summary, base)
        if failed:
            client.set_terminated(run_id, "FAILED")
        return run_id
