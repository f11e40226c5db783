"""What the Snakefile needs from Python, kept out of the rules files: the tracking
environment every job inherits, and the per-invocation summary run.

Nothing here enters a rule's `params:`, so none of it can force a rerun.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Mapping

from paraplan.track import ENV_CONFIG_DIGEST, ENV_INVOCATION, config_digest


def prepare_environment(config: Mapping[str, object]) -> None:
    """Set the variables jobs read when they log: one invocation id for the whole
    `snakemake` call (kept when already set, e.g. in a SLURM job that inherited it),
    the config digest, and the tracking URI from config unless the environment has one."""
    os.environ.setdefault(ENV_INVOCATION, uuid.uuid4().hex)
    os.environ[ENV_CONFIG_DIGEST] = config_digest(config)
    mlflow_config = config.get("mlflow") or {}
    uri = mlflow_config.get("tracking_uri", "") if isinstance(mlflow_config, Mapping) else ""
    if uri and not os.environ.get("MLFLOW_TRACKING_URI"):
        os.environ["MLFLOW_TRACKING_URI"] = str(uri)


def create_store() -> None:
    """Create the MLflow store before parallel jobs start."""
    from paraplan.track import ensure_store

    ensure_store()


def summarise_invocation() -> None:
    """Log the run that links this invocation's runs; a tracking failure is reported,
    not raised (every result is already on disk)."""
    from paraplan.core import TrackingError
    from paraplan.track import log_invocation_summary

    try:
        run_id = log_invocation_summary(os.environ[ENV_INVOCATION])
    except TrackingError as exc:
        print(f"paraplan: could not log the invocation summary: {exc}", file=sys.stderr)
        return
    if run_id:
        print(f"paraplan: invocation summary logged as MLflow run {run_id}", file=sys.stderr)
