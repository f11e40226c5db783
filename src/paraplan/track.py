"""MLflow tracking: the only module that imports mlflow, and only inside functions.

A stage describes what to log as a `RunLog` (pure data). Each job logs ONE run: its
params, summary metrics, artifacts and, for a sweep (simulated configurations,
planned batch sizes, ranked plans, fitted sweeps, validated strategies), a `Table`
with one row per configuration, logged as a table artifact (`<name>.json`, shown as a
table in the UI) whose metric columns are also logged as metrics with `step` = the
row's index (the UI plots them against it). Everything of a run goes in a few
`log_batch` calls. There are no child runs.

A command does not log its run itself: it writes it as a record
(`paraplan.track_spool`), and one logging process logs the records later
(`paraplan.track_job`: the workflow's end, or a detached process after a standalone
command). The functions here are what that process calls; `log_run`, `ensure_store`
and `log_invocation_summary` also serve tests and the Snakefile directly.

Store: `MLFLOW_TRACKING_URI`, else `sqlite:///mlflow.db` in the working directory
(the repository root under Snakemake) with artifacts in `mlruns/`. A SQLite store's
schema is created once, under a lock beside the database, and marked ready in that
lock file: later loggers open it without the lock. Each HTTP request to a tracking server
waits at most `PARAPLAN_MLFLOW_TIMEOUT_S` seconds (config `mlflow.timeout_s`, default
5) with one retry, unless the user set MLflow's own `MLFLOW_HTTP_REQUEST_*` variables.
docs/tracking.md is the user's page for all of this.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from paraplan.core import TrackingError
from paraplan.track_tags import (
    ENV_CONFIG_DIGEST,
    ENV_INVOCATION,
    config_digest,
    flatten,
    git_commit,
    job_tags,
    standard_tags,
)

__all__ = ["ENV_CONFIG_DIGEST", "ENV_INVOCATION", "RunLog", "Table", "config_digest", "ensure_store", "flatten",
           "job_tags", "log_invocation_summary", "log_run", "standard_tags", "tracking_enabled", "tracking_uri"]

ENV_INVOCATION_START = "PARAPLAN_INVOCATION_START_MS"
ENV_TRACKING = "PARAPLAN_TRACKING"  # "off": log nothing
ENV_TIMEOUT = "PARAPLAN_MLFLOW_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 5.0
HTTP_RETRIES = 1  # MLflow's default is 7 with exponential back-off: minutes on a frozen server
DEFAULT_DB = "mlflow.db"
DEFAULT_ARTIFACT_DIR = "mlruns"
_PARAM_MAX_CHARS = 6000
_TAG_MAX_CHARS = 5000
_READY_TEXT = "schema ready\n"


@dataclass(frozen=True)
class Table:
    """A sweep's configurations, one row per configuration (the rows of the job's CSV,
    in its order). Logged as the artifact `<name>.json`; each column named in
    `metrics` is also logged as a metric of that name with `step` = the row's index."""

    rows: Sequence[Mapping[str, object]]
    metrics: Sequence[str] = ()
    name: str = "configurations"


@dataclass(frozen=True)
class RunLog:
    """Everything one job logs: one MLflow run."""

    stage: str  # experiment `paraplan-<stage>`
    run_name: str
    params: Mapping[str, object] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    step_metrics: Mapping[str, Sequence[tuple[int, float]]] = field(default_factory=dict)
    artifacts: Sequence[Path] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    table: Table | None = None

    def __post_init__(self) -> None:
        # one name, one series: a summary metric beside a per-configuration series of
        # the same name would show as the series' last value in the UI
        series = set(self.step_metrics) | set(self.table.metrics if self.table else ())
        clash = sorted(series & set(self.metrics))
        if clash or (self.table and set(self.table.metrics) & set(self.step_metrics)):
            raise ValueError(f"RunLog {self.run_name}: metric {clash or sorted(self.step_metrics)} logged twice")


def tracking_uri() -> str:
    """`MLFLOW_TRACKING_URI` if set, else the SQLite store in the working directory."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    return uri or f"sqlite:///{Path.cwd() / DEFAULT_DB}"


_TRACKING_ON = ("on", "1", "true", "yes", "")
_TRACKING_OFF = ("off", "0", "false", "no")


def tracking_enabled() -> bool:
    """False when `PARAPLAN_TRACKING` is off (config `mlflow.enabled: false`); any
    value but on or off (a typo such as `of`) is an error, not tracking by default."""
    text = os.environ.get(ENV_TRACKING, "on").strip().lower()
    if text not in _TRACKING_ON + _TRACKING_OFF:
        raise TrackingError(tracking_uri(), f"{ENV_TRACKING}={text!r}: expected on or off (also 1/0, true/false, "
                            "yes/no)")
    return text in _TRACKING_ON


def timeout_s() -> float:
    """Seconds a tracking server may take to answer one request (`PARAPLAN_MLFLOW_TIMEOUT_S`)."""
    text = os.environ.get(ENV_TIMEOUT, "").strip()
    try:
        value = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise TrackingError(tracking_uri(), f"{ENV_TIMEOUT}={text!r} is not a number of seconds") from None
    return value if value > 0 else DEFAULT_TIMEOUT_S


def http_defaults(seconds: float | None = None) -> None:
    """MLflow's HTTP request timeout and retries for this process, unless the user set
    them: each request waits `seconds`, one retry after 1 s (MLflow's own defaults
    wait 120 s and retry 7 times with back-off, minutes on a frozen server)."""
    seconds = timeout_s() if seconds is None else seconds
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, math.ceil(seconds))))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(HTTP_RETRIES))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "0")


_UNTRACKED_HINT = ("start it, point MLFLOW_TRACKING_URI elsewhere, or run untracked "
                   "(paraplan: --no-track; snakemake: config mlflow.enabled: false, or "
                   "PARAPLAN_TRACKING=off snakemake)")


def probe(uri: str, seconds: float | None = None) -> None:
    """Fail within `seconds` when an HTTP tracking server does not answer (any HTTP
    answer counts); local stores (SQLite, files) are checked by their first use."""
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error  # here, not at the top: http.client and email cost every command ~30 ms
    import urllib.request

    seconds = timeout_s() if seconds is None else seconds
    http_defaults(seconds)
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=seconds):
            pass
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingError(uri, f"unreachable ({reason}; waited at most {seconds:g} s); {_UNTRACKED_HINT}") from None


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI (None for other stores and in-memory ones)."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    rest = uri[len(prefix):].split("?", 1)[0]
    return Path(rest) if rest and rest != ":memory:" else None


def _lock_path(db: Path) -> Path:
    return db.with_name(db.name + ".lock")


def _store_is_ready(uri: str) -> bool:
    """A SQLite store whose schema a paraplan job created (or checked) under the lock:
    the lock file says so and the database is there. Other stores are never 'ready'
    here (MLflow checks them itself; a server owns its schema)."""
    db = sqlite_path(uri)
    if db is None:
        return not uri.startswith("sqlite:")
    try:
        return db.stat().st_size > 0 and _lock_path(db).read_text() == _READY_TEXT
    except OSError:
        return False


class _store_lock:
    """An exclusive `flock` on `<database>.lock` beside a SQLite store (no-op for other
    stores, or where the folder cannot hold the lock file: MLflow then reports the
    store's own error). `ready()` records in the lock file that the schema exists."""

    def __init__(self, uri: str):
        self.path = sqlite_path(uri)
        self.handle = None

    def __enter__(self):
        if self.path is None:
            return self
        import fcntl

        try:
            self.handle = open(_lock_path(self.path), "a+")
        except OSError:
            return self
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def ready(self) -> None:
        if self.handle is not None:
            self.handle.seek(0)
            self.handle.truncate()
            self.handle.write(_READY_TEXT)
            self.handle.flush()

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            import fcntl

            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()


_READY_STORES: set[str] = set()


def _client(uri: str):
    """A client of a usable store. The first job on a SQLite store creates its schema
    while holding the lock beside the database (MLflow's concurrent schema creation
    leaves a store broken), then marks it ready; later jobs skip the lock."""
    http_defaults()
    from mlflow.store.tracking import sqlalchemy_store  # noqa: F401  (imported outside the lock)
    from mlflow.tracking import MlflowClient

    if uri not in _READY_STORES and not _store_is_ready(uri):
        with _store_lock(uri) as lock:
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
            lock.ready()
    _READY_STORES.add(uri)
    return MlflowClient(tracking_uri=uri)


def ensure_store(uri: str | None = None, attempts: int = 5) -> None:
    """Create the store (SQLite schema) once, before parallel jobs start."""
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


def _artifact_root() -> str:
    return (Path.cwd() / DEFAULT_ARTIFACT_DIR).resolve().as_uri()


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


def _now_ms() -> int:
    return int(time.time() * 1000)


def _finite(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _plain(value: object) -> object:
    """A table cell as JSON: numbers (NaN -> empty), text, booleans."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return value if math.isfinite(value) else None
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        return _plain(item())
    return str(value)


def _log_batches(client, run_id: str, params: list, metrics: list, tags: list) -> None:
    """As few `log_batch` calls as MLflow's limits allow (1000 entries, of which at
    most 100 params and 100 tags)."""
    while params or metrics or tags:
        p, params = params[:100], params[100:]
        t, tags = tags[:100], tags[100:]
        room = 1000 - len(p) - len(t)
        m, metrics = metrics[:room], metrics[room:]
        client.log_batch(run_id, metrics=m, params=p, tags=t)


def fill_run(client, run_id: str, run: RunLog, extra_tags: Mapping[str, str] = (),  # type: ignore[assignment]
             end_ms: int | None = None, finish: bool = True) -> None:
    """Log a RunLog into an open run (params, metrics, series, table, artifacts, tags)
    and, with `finish`, mark it FINISHED at `end_ms` (default: now)."""
    from mlflow.entities import Metric, Param, RunTag

    now_ms = _now_ms()
    params = [Param(k, v[:_PARAM_MAX_CHARS]) for k, v in flatten(run.params).items()]
    metrics = [Metric(k, f, now_ms, 0) for k, v in run.metrics.items() if (f := _finite(v)) is not None]
    for name, series in run.step_metrics.items():
        metrics += [Metric(name, v, now_ms, int(step)) for step, value in series if (v := _finite(value)) is not None]
    if run.table is not None:
        for name in run.table.metrics:
            metrics += [Metric(name, v, now_ms, i) for i, row in enumerate(run.table.rows)
                        if (v := _finite(row.get(name))) is not None]
    tags = [RunTag(k, str(v)[:_TAG_MAX_CHARS]) for k, v in {**dict(extra_tags), **run.tags}.items()]
    _log_batches(client, run_id, params, metrics, tags)
    if run.table is not None and run.table.rows:
        columns = list(dict.fromkeys(key for row in run.table.rows for key in row))
        data = {c: [_plain(row.get(c)) for row in run.table.rows] for c in columns}
        client.log_table(run_id, data=data, artifact_file=f"{run.table.name}.json")
    for artifact in run.artifacts:
        path = Path(artifact)
        if path.is_dir():
            client.log_artifacts(run_id, str(path), artifact_path=path.name)
        elif path.is_file():
            client.log_artifact(run_id, str(path))
    if finish:
        client.set_terminated(run_id, "FINISHED", end_time=end_ms)


def create_run(client, experiment_id: str, run_name: str, tags: Mapping[str, str], start_ms: int | None = None) -> str:
    created = client.create_run(experiment_id, run_name=run_name, tags=dict(tags),
                                start_time=start_ms if start_ms is not None else _now_ms())
    return created.info.run_id


def end_run(client, run_id: str, status: str, error: str, end_ms: int | None = None) -> None:
    """Mark a run FAILED or KILLED (at `end_ms`, default now) with `error` as its
    `error` tag and its note."""
    from mlflow.entities import RunTag

    label = "failed" if status == "FAILED" else "killed"
    client.log_batch(run_id, tags=[RunTag("error", error[:_TAG_MAX_CHARS]),
                                   RunTag("mlflow.note.content", f"**{label}**: {error}"[:_TAG_MAX_CHARS])])
    client.set_terminated(run_id, status, end_time=end_ms)


def process_gone(pid_text: str, started_ms: int) -> bool:
    """True when process `pid` of this host has ended (or its pid now belongs to a
    process started after the run)."""
    try:
        pid = int(pid_text)
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (ValueError, PermissionError, OSError):
        return False
    try:  # Linux: a reused pid belongs to a process younger than the run
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot_s = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                      if line.startswith("btime "))
        return (boot_s + ticks / os.sysconf("SC_CLK_TCK")) * 1000 > started_ms + 2000
    except (OSError, ValueError, IndexError, StopIteration):
        return False


class _tracking_errors:
    """Turn any store failure into a TrackingError naming the store."""

    def __init__(self, uri: str):
        self.uri = uri

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, TrackingError) or not isinstance(exc, Exception):
            return False
        text = " ".join(str(exc).split())
        raise TrackingError(self.uri, f"{type(exc).__name__}: {text[:1000]}") from None


def log_run(run: RunLog, base_tags: Mapping[str, str] | None = None, uri: str | None = None) -> str:
    """Log `run` to the store in this process; returns the run id. Any failure becomes a
    `TrackingError` naming the store; result files are untouched."""
    uri = uri or tracking_uri()
    probe(uri)
    with _tracking_errors(uri):
        client = _client(uri)
        experiment_id = _experiment_id(client, run.stage, uri)
        run_id = create_run(client, experiment_id, run.run_name, dict(base_tags or {}))
        fill_run(client, run_id, run)
        return run_id


def _run_link(experiment_id: str, run_id: str) -> str:
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
            for run in client.search_runs([exp.experiment_id], max_results=5000,
                                          filter_string=f"tags.invocation_id = '{invocation_id}'"):
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
            link = _run_link(run.info.experiment_id, run.info.run_id)
            lines.append(
                f"| {stage} | {name} | {run.data.tags.get('rule', '')} | "
                f"{run.data.tags.get('wildcards', '')} | {run.info.status} | [{run.info.run_id}]({link}) |"
            )
            # a tag key takes letters, digits and _-. :/ only (run names may hold '@')
            tags[re.sub(r"[^\w\-. :/]", "_", f"run.{stage}.{name}")[:250]] = run.info.run_id
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
                  **({"error": error[:_TAG_MAX_CHARS]} if error else {})},
        )
        experiment_id = _experiment_id(client, "invocation", uri)
        commit = git_commit()
        run_id = create_run(client, experiment_id, summary.run_name,
                            {"git_commit": commit, **standard_tags("snakemake", commit)}, start_ms)
        client.log_text(run_id, "\n".join(lines) + "\n", "runs.md")
        fill_run(client, run_id, summary)
        if failed:
            client.set_terminated(run_id, "FAILED")
        return run_id
