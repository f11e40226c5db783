"""Options and helpers shared by the stage commands."""

from __future__ import annotations

import argparse
import sys

from paraplan.core import ConfigError


def add_tracking_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tracking (MLflow)")
    group.add_argument(
        "--no-track", action="store_true",
        help="do not log to MLflow (default: log to $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)",
    )
    group.add_argument("--rule", default="", help="Snakemake rule name, recorded as the run's 'rule' tag")
    group.add_argument("--wildcards", default="", help="Snakemake wildcards, recorded as the run's 'wildcards' tag")


def track(args: argparse.Namespace, run) -> str | None:
    """Log a `paraplan.track.RunLog` unless `--no-track`; returns the run id."""
    if args.no_track:
        return None
    from paraplan import track as tracking

    tags = tracking.job_tags(args.rule or args.command, args.wildcards)
    run_id = tracking.log_run(run, base_tags=tags)
    print(f"paraplan {args.command}: logged MLflow run {run_id} ({tracking.tracking_uri()})", file=sys.stderr)
    return run_id


def int_list(text: str, key: str) -> list[int]:
    """`"2,4,8"` -> [2, 4, 8]; the error names the option."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(key, f"expected comma-separated integers, got '{text}'") from None
    if not values:
        raise ConfigError(key, "expected at least one value")
    return values


def name_list(text: str, key: str, allowed: tuple[str, ...]) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ConfigError(key, f"unknown value '{unknown[0]}'; expected one of {', '.join(allowed)}")
    if not names:
        raise ConfigError(key, "expected at least one value")
    return names
