"""MLflow tracking: the only module that imports mlflow.

A stage describes what to log as a `RunLog` (pure data) and hands it to `log_run`.
Default store: `sqlite:///mlflow.db` in the working directory (the repository root
under Snakemake) with artifacts in `mlruns/`, so `mlflow ui` there shows everything.
`MLFLOW_TRACKING_URI` overrides it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from paraplan.core import TrackingError

ENV_INVOCATION = "PARAPLAN_INVOCATION_ID"
ENV_CONFIG_DIGEST = "PARAPLAN_CONFIG_DIGEST"
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


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = out.stdout.strip()
    if out.returncode != 0 or not commit:
        return "unknown"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, timeout=10, check=False,
    ).stdout.strip()
    return commit + ("-dirty" if dirty else "")


def job_tags(rule: str, wildcards: str = "") -> dict[str, str]:
    """The tags of DESIGN.md, computed when the job runs (never Snakemake params)."""
    return {
        "rule": rule,
        "wildcards": wildcards,
        "git_commit": _git_commit(),
        "config_digest": os.environ.get(ENV_CONFIG_DIGEST, "none"),
        "invocation_id": os.environ.get(ENV_INVOCATION) or f"standalone-{uuid.uuid4().hex[:12]}",
    }


def _client(uri: str):
    import mlflow  # noqa: F401  (kept local: importing mlflow costs seconds)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _artifact_root() -> str:
    return (Path.cwd() / DEFAULT_ARTIFACT_DIR).resolve().as_uri()


def ensure_store(uri: str | None = None, attempts: int = 5) -> None:
    """Create the store (SQLite schema) once, before parallel jobs start: concurrent
    first use of a fresh SQLite store fails in MLflow 3.x."""
    uri = uri or tracking_uri()
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


def _log_one(client, experiment_id: str, run: RunLog, parent_id: str | None, base_tags: dict) -> str:
    from mlflow.entities import Metric, Param

    tags = {**base_tags, **run.tags}
    if parent_id is not None:
        tags["mlflow.parentRunId"] = parent_id
    created = client.create_run(experiment_id, run_name=run.run_name, tags=tags)
    run_id = created.info.run_id
    now_ms = int(time.time() * 1000)
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
        _log_one(client, experiment_id, child, run_id, {k: v for k, v in base_tags.items()})
    client.set_terminated(run_id)
    return run_id


def log_run(run: RunLog, base_tags: Mapping[str, str] | None = None, uri: str | None = None) -> str:
    """Log `run` (and its children) to the store; returns the run id.

    Any failure becomes a `TrackingError` naming the store; result files are untouched.
    """
    uri = uri or tracking_uri()
    try:
        client = _client(uri)
        experiment_id = _experiment_id(client, run.stage, uri)
        return _log_one(client, experiment_id, run, None, dict(base_tags or {}))
    except TrackingError:
        raise
    except Exception as exc:
        raise TrackingError(uri, f"{type(exc).__name__}: {exc}") from None


def _run_link(uri: str, experiment_id: str, run_id: str) -> str:
    """A UI-relative link to a run (`mlflow ui` serves it at http://127.0.0.1:5000/)."""
    return f"#/experiments/{experiment_id}/runs/{run_id}"


def log_invocation_summary(invocation_id: str, uri: str | None = None) -> str | None:
    """One run in experiment `paraplan-invocation` that lists every run of one
    `snakemake` call (tag `invocation_id`), with links by run id. Returns its run id,
    or None when the invocation logged nothing."""
    uri = uri or tracking_uri()
    try:
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
        if not rows:
            return None
        rows.sort(key=lambda r: (r[1].info.start_time or 0))
        lines = [
            f"# paraplan invocation {invocation_id}",
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
        summary = RunLog(
            stage="invocation",
            run_name=f"invocation-{invocation_id[:12]}",
            params={"invocation_id": invocation_id, "runs": len(rows)},
            metrics={f"runs_{stage}": sum(1 for s, _ in rows if s == stage) for stage, _ in rows},
            tags={**tags, "invocation_id": invocation_id,
                  "mlflow.note.content": "\n".join(lines)},
        )
        experiment_id = _experiment_id(client, "invocation", uri)
        run_id = _log_one(client, experiment_id, summary, None, {"git_commit": _git_commit()})
        client.log_text(run_id, "\n".join(lines) + "\n", "runs.md")
        return run_id
    except Exception as exc:
        raise TrackingError(uri, f"{type(exc).__name__}: {exc}") from None
