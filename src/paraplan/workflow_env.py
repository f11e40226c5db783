"""What the Snakefile needs from Python, kept out of the rules files: the tracking
environment every job inherits, and the per-invocation summary run.

Nothing here enters a rule's `params:`, so none of it can force a rerun.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Mapping

from paraplan.track import (
    ENV_CONFIG_DIGEST,
    ENV_INVOCATION,
    ENV_INVOCATION_START,
    ENV_TIMEOUT,
    ENV_TRACKING,
    config_digest,
)


def upgrade_config(config: dict, schema_path: str = "workflow/schemas/config.schema.yaml") -> None:
    """Rename the config's paraplan 0.1 keys (`plan.mbs`, `simulate.experiments`, ...) to
    their names in the glossary, with a deprecation line each, before Snakemake
    validates the config against its schema."""
    from pathlib import Path

    import yaml

    from paraplan.typed.config_keys import upgrade_config_keys

    path = Path(schema_path)
    upgrade_config_keys(config, yaml.safe_load(path.read_text()), path.parent)


def prepare_environment(config: Mapping[str, object]) -> None:
    """Set the variables jobs read when they log: one invocation id and start time for
    the whole `snakemake` call (kept when already set, e.g. in a SLURM job that
    inherited them), the config digest, the tracking URI from config unless the
    environment has one, `mlflow.enabled: false` as PARAPLAN_TRACKING=off and
    `mlflow.timeout_s`."""
    os.environ.setdefault(ENV_INVOCATION, uuid.uuid4().hex)
    os.environ.setdefault(ENV_INVOCATION_START, str(int(time.time() * 1000)))
    os.environ[ENV_CONFIG_DIGEST] = config_digest(config)
    mlflow_config = config.get("mlflow") or {}
    if not isinstance(mlflow_config, Mapping):
        mlflow_config = {}
    uri = mlflow_config.get("tracking_uri", "")
    if uri and not os.environ.get("MLFLOW_TRACKING_URI"):
        os.environ["MLFLOW_TRACKING_URI"] = str(uri)
    if mlflow_config.get("enabled", True) is False:
        os.environ[ENV_TRACKING] = "off"
    if mlflow_config.get("timeout_s") is not None:
        os.environ.setdefault(ENV_TIMEOUT, str(mlflow_config["timeout_s"]))


def create_store() -> None:
    """Create the MLflow store before parallel jobs start; an unreachable server stops
    Snakemake here, in seconds, before any job runs."""
    from paraplan.track import ensure_store, tracking_enabled

    if not tracking_enabled():
        print("paraplan: MLflow tracking is off (mlflow.enabled: false)", file=sys.stderr)
        return
    ensure_store()


def summarise_invocation(failed: bool = False, log: str = "") -> None:
    """Log the run that links this invocation's runs (FAILED from `onerror`); a
    tracking failure is reported, not raised (every result is already on disk)."""
    from paraplan.core import TrackingError
    from paraplan.track import log_invocation_summary, tracking_enabled

    if not tracking_enabled():
        return
    start = os.environ.get(ENV_INVOCATION_START, "")
    error = f"snakemake stopped on a failed job; its log: {log}" if failed else ""
    try:
        run_id = log_invocation_summary(os.environ[ENV_INVOCATION], failed=failed, error=error,
                                        start_ms=int(start) if start.isdigit() else None)
    except TrackingError as exc:
        print(f"paraplan: could not log the invocation summary: {exc}", file=sys.stderr)
        return
    if run_id:
        print(f"paraplan: invocation summary logged as MLflow run {run_id}"
              + (" (FAILED)" if failed else ""), file=sys.stderr)
