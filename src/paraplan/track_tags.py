"""What a tracked job says about itself, computed when it runs (never Snakemake
params): the tags of the tracking contract (docs/tracking.md), MLflow's standard
source/git/user tags, the config digest, and settings flattened into MLflow params.
No mlflow import: the logging process calls these, and so do tests."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path

ENV_INVOCATION = "PARAPLAN_INVOCATION_ID"
ENV_CONFIG_DIGEST = "PARAPLAN_CONFIG_DIGEST"
ENV_GIT_COMMIT = "PARAPLAN_GIT_COMMIT"  # the workflow's commit, read once when snakemake starts

# where a run's process lives: the killed-run rule (docs/tracking.md) reads them
TAG_HOST = "paraplan.host"
TAG_PID = "paraplan.pid"
TAG_WORKDIR = "paraplan.workdir"


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


def git_commit(directory: Path | None = None) -> str:
    """The commit of the repository of `directory` (default: the working directory, the
    workflow's under Snakemake), else of the checkout paraplan runs from; `-dirty` with
    local changes."""
    commit = _git_commit_in(directory)
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


def commit_tags(commit: str, command: str) -> dict[str, str]:
    """The tags that name the code a job ran: `git_commit` and MLflow's standard ones."""
    return {"git_commit": commit, **standard_tags(f"paraplan {command}", commit)}


def job_tags(rule: str, wildcards: str = "", command: str = "", pid: int | None = None,
             commit: str | None = None) -> dict[str, str]:
    """The contract's tags (rule, wildcards, git_commit, config_digest, invocation_id),
    MLflow's standard ones, and where the job's process runs (host, pid, working
    directory: `pid` is the job's, by default this process). `commit`: None reads it
    from git now; "" leaves the commit tags out (the logging process adds them)."""
    commit = git_commit() if commit is None else commit
    tags = {
        "rule": rule,
        "wildcards": wildcards,
        "config_digest": os.environ.get(ENV_CONFIG_DIGEST, "none"),
        "invocation_id": os.environ.get(ENV_INVOCATION) or f"standalone-{uuid.uuid4().hex[:12]}",
        TAG_HOST: socket.gethostname(),
        TAG_PID: str(os.getpid() if pid is None else pid),
        TAG_WORKDIR: str(Path.cwd()),
        "mlflow.source.name": f"paraplan {command or rule}",
        "mlflow.source.type": "LOCAL",
        "mlflow.user": _user(),
    }
    return {**tags, **(commit_tags(commit, command or rule) if commit else {})}
