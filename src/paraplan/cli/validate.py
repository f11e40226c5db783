"""Run real distributed training steps of a profiled model and compare them with the
simulator's prediction of the same strategies.

Spawns 2 ranks (torch.distributed: gloo on CPU, nccl with one GPU per rank), each
with --threads threads, and runs --warmup untimed and --steps timed rounds at
global batch --global-batch-size. A round times, after a barrier each: the whole model's
forward + backward on each rank alone and on both at once (the contention
calibration), then one training step of every strategy: `dp` (one all-reduce of
the gradient buffer after backward), `dp_overlap` (per-layer asynchronous
all-reduces during backward), `pp_1f1b` and `pp_gpipe` (2 stages cut where the
profile balances them, --num-microbatches micro-batches, send/recv between the ranks)
and `tp2` (Megatron split: MLP pairs, transformer blocks by heads). A step's time
is the slowest rank's, from the barrier to the end of its forward, backward and
communication (the SGD update follows untimed). The same strategies are simulated
from the profile and the fitted communication model with documented corrections
(among them: compute slowed by the measured contention while both ranks compute;
no overlap when gloo ranks fill every core; tp2's activation all-reduces at the
mean time the run measures for their size, see paraplan.validate.predict);
rel_err = predicted / measured - 1. The uncorrected prediction is printed and
logged beside it.

Example:
  paraplan validate --profile results/profiles/mlp.csv \\
      --comm-model results/fits/local-cpu/comm_model.json --global-batch-size 32 --steps 20 \\
      -o results/validation/mlp.csv --plots results/figures/validate
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from paraplan.cli.common import (
    add_output_argument,
    add_tracking_arguments,
    deprecated,
    name_list,
    require_torch,
    track,
)
from paraplan.core import ConfigError, InputFileError

if TYPE_CHECKING:
    from paraplan.core import ModelProfile
    from paraplan.track import RunLog
    from paraplan.validate.report import ValidationOptions, ValidationReport
    from paraplan.validate.workload import WorkloadSpec

NAME = "validate"
HELP = "measure real 2-rank training steps and compare them with the simulator's prediction"
ORDER = 60

_ALL = "dp,dp_overlap,pp_1f1b,pp_gpipe,tp2"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", required=True, type=Path,
                        help="profile CSV of the model (paraplan profile); its meta JSON names the model settings")
    parser.add_argument("--comm-model", required=True, type=Path, help="comm_model.json (paraplan fit)")
    parser.add_argument("--model", default=None,
                        help="model kind (mlp, gpt, resnet); default: the profile meta's 'model'")
    parser.add_argument("--cluster", default="local-cpu", metavar="NAME|FILE",
                        help="cluster name or YAML path (for the simulator)")
    parser.add_argument("--strategies", default=_ALL, help="comma list among " + _ALL)
    parser.add_argument("--global-batch-size", dest="batch", type=int, default=None,
                        help="global batch per step (default: the profile's batch size)")
    deprecated(parser, "--batch", "--global-batch-size", "batch", convert=int)
    parser.add_argument("--num-microbatches", dest="microbatches", type=int, default=4,
                        help="pipeline micro-batches per step")
    deprecated(parser, "--microbatches", "--num-microbatches", "microbatches", convert=int)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per strategy")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per strategy first")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per rank (default: cores // 2, at least 1)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="torch.distributed backend; nccl needs one CUDA device per rank")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="seconds before hung ranks are ended")
    deprecated(parser, "--timeout", "--timeout-s", "timeout_s", convert=float)
    add_output_argument(parser, "validation CSV")
    parser.add_argument("--plots", type=Path, default=None, metavar="DIR",
                        help="folder for the predicted-vs-measured figure (<profile name>.png/.pdf)")
    add_tracking_arguments(parser)


def _model_settings(args: argparse.Namespace) -> tuple[str, dict]:
    from paraplan.profile.io import meta_path, read_meta

    path = meta_path(args.profile)
    if not path.is_file():
        raise InputFileError(path, "missing: the profile's meta JSON names the model settings")
    meta = read_meta(args.profile)
    model = args.model or meta.get("model")
    settings = meta.get("model_settings")
    if not isinstance(model, str) or not isinstance(settings, dict):
        raise InputFileError(path, "expected keys 'model' (a model name) and 'model_settings' (a mapping)")
    if meta.get("method", "torch") != "torch":
        raise InputFileError(path, f"validation needs a measured profile, this one is '{meta.get('method')}'")
    return model, settings


def _check_positive(args: argparse.Namespace) -> None:
    for key, option in (("microbatches", "--num-microbatches"), ("steps", "--steps"), ("threads", "--threads"),
                        ("batch", "--global-batch-size")):
        value = getattr(args, key)
        if value is not None and value < 1:
            raise ConfigError(option, f"must be >= 1, got {value}")
    if args.warmup < 0:
        raise ConfigError("--warmup", f"must be >= 0, got {args.warmup}")


def run(args: argparse.Namespace) -> int:
    require_torch("validation (real distributed training)")
    from paraplan.clusters import load_cluster
    from paraplan.comm.model import FittedCommModel
    from paraplan.profile.io import read_profile
    from paraplan.progress import bar
    from paraplan.validate import STRATEGIES
    from paraplan.validate.load import LoadCheck, read_load_1m
    from paraplan.validate.report import plan_validation, validation_report
    from paraplan.validate.runner import run_strategies

    _check_positive(args)
    strategies = tuple(name_list(args.strategies, "--strategies", STRATEGIES))
    if not args.comm_model.is_file():
        raise InputFileError(args.comm_model, "missing: run `paraplan fit` first")
    profile = read_profile(args.profile)
    model, settings = _model_settings(args)
    comm = FittedCommModel.from_json(args.comm_model)
    cluster = load_cluster(args.cluster)
    options = _options(args, strategies, profile)
    spec, layers = _workload(args, profile, model, settings)
    plan = plan_validation(profile, spec, layers, options, cluster, comm, os.cpu_count() or 1)
    print(f"paraplan validate: {profile.name} ({model}), batch {options.global_batch_size}, "
          f"{len(options.strategies)} strategies, {args.warmup} + {args.steps} steps, {options.threads_per_rank} "
          f"thread(s) per rank, pipeline cut before layer {plan.run.pipeline_boundary}, {args.backend}",
          file=sys.stderr)
    problem = _profile_problem(profile)
    load_before = read_load_1m()
    with bar(args.warmup + args.steps, f"validate {profile.name}", "round") as progress:
        result = run_strategies(plan.run, on_round=progress.update)
    load = LoadCheck(load_before, read_load_1m(), plan.cores, 2 * options.threads_per_rank)
    report = validation_report(profile, cluster, comm, plan, result, load)
    print("\n".join(report.notes))
    artifacts = _write(args, report, profile.name)
    for line in (w for w in (load.warning(), f"warning: profile {profile.name}: {problem}" if problem else None) if w):
        print(f"paraplan validate: {line}", file=sys.stderr)  # last, where a reader of the table looks
    track(args, _runlog(args, profile.name, model, settings, report, options.threads_per_rank, artifacts))
    return 0


def _options(args: argparse.Namespace, strategies: tuple[str, ...], profile: ModelProfile) -> ValidationOptions:
    """The run's options, the defaults filled in (a warning when the profile was taken
    with other threads than the ranks use)."""
    from paraplan.validate.report import ValidationOptions

    threads = args.threads or max(1, (os.cpu_count() or 2) // 2)
    profile_threads = profile.meta.get("threads")
    if args.backend == "gloo" and profile_threads not in (None, threads):
        print(f"paraplan validate: warning: the profile was taken with {profile_threads} threads, "
              f"the ranks use {threads}", file=sys.stderr)
    return ValidationOptions(strategies, args.batch or profile.batch_size, args.microbatches, args.steps, args.warmup,
                             threads, args.backend, args.timeout_s)


def _workload(args: argparse.Namespace, profile: ModelProfile, model: str, settings: dict) -> tuple[WorkloadSpec, list]:
    """The model the ranks train, checked against the profile."""
    from paraplan.validate.workload import WorkloadSpec

    spec = WorkloadSpec("paraplan.validate.workload:profile_model_workload", {"model": model, "settings": settings})
    layers = spec.build().layers
    if len(layers) != profile.num_layers:
        raise InputFileError(args.profile, f"{profile.num_layers} layers, but the model '{model}' with the "
                             f"meta's settings has {len(layers)}")
    return spec, list(layers)


def _profile_problem(profile: ModelProfile) -> str | None:
    """Why the profile's own numbers disagree (warned now, and again after the table)."""
    from paraplan.profile.consistency import profile_inconsistency

    problem = profile_inconsistency(profile.meta)
    if problem:
        print(f"paraplan validate: warning: profile {profile.name}: {problem}", file=sys.stderr)
    return problem


def _write(args: argparse.Namespace, report: ValidationReport, name: str) -> list[Path]:
    """The validation CSV (and the table printed) and with --plots the figure; the files written."""
    from paraplan.files import write_csv

    write_csv(args.output, report.table)
    print("\n".join(report.table_lines()))
    abs_err = report.table["rel_err"].abs()
    print(f"wrote {args.output}: |rel_err| median {abs_err.median():.1%}, max {abs_err.max():.1%}; "
          f"{report.load.describe()}")
    if args.plots is None:
        return [args.output]
    from paraplan.plots.validate import plot_validation

    return [args.output, *plot_validation(report.table, args.plots / name, title=f"{name}: predicted vs measured",
                                          uncorrected_s=report.uncorrected)]


def _runlog(args: argparse.Namespace, name: str, model: str, settings: dict, report: ValidationReport,
            threads: int, artifacts: list[Path]) -> RunLog:
    """One row per strategy with the same metric names (logged with step = the row's
    index, so the UI compares them); each strategy's measured step times as a series
    of its own; the run keeps what belongs to the whole validation."""
    from paraplan.track import RunLog, Table

    metrics, per_strategy = report.metrics()
    rows = [{"strategy": strategy, **values} for strategy, values in per_strategy.items()]
    table = Table(rows=rows, metrics=list(dict.fromkeys(k for v in per_strategy.values() for k in v)),
                  name="strategies")
    step_times = {f"step_time_s__{strategy}": list(enumerate(report.measured[strategy].step_times_s))
                  for strategy in per_strategy}
    setup = report.setup
    params = {
        "profile": str(args.profile), "comm_model": str(args.comm_model), "cluster": args.cluster,
        "model": model, "model_settings": settings, "strategies": list(report.measured),
        "global_batch_size": setup.global_batch_size, "num_microbatches": setup.num_microbatches,
        "pipeline_boundary": setup.pipeline_boundary, "steps": args.steps, "warmup": args.warmup,
        "threads_per_rank": threads, "backend": args.backend,
        "comm_uses_compute_cores": setup.comm_uses_compute_cores,
    }
    return RunLog(stage="validate", run_name=name, params=params, metrics=metrics,
                  step_metrics=step_times, artifacts=artifacts, table=table)
