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
import statistics
import sys
from pathlib import Path

from paraplan.cli.common import (
    add_output_argument,
    add_tracking_arguments,
    deprecated,
    name_list,
    require_torch,
)
from paraplan.core import ConfigError, InputFileError

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
    from dataclasses import replace

    from paraplan.clusters import load_cluster
    from paraplan.comm.model import FittedCommModel
    from paraplan.core import Group
    from paraplan.profile.consistency import profile_inconsistency
    from paraplan.profile.io import read_profile
    from paraplan.validate import STRATEGIES
    from paraplan.validate.load import LoadCheck, read_load_1m
    from paraplan.validate.pipeline import balanced_boundary
    from paraplan.validate.predict import PredictionSetup, predict_step_times
    from paraplan.validate.runner import RunConfig, run_strategies
    from paraplan.validate.tensor_parallel import tp_allreduce_counts, tp_split_layers
    from paraplan.validate.workload import WorkloadSpec

    _check_positive(args)
    strategies = tuple(name_list(args.strategies, "--strategies", STRATEGIES))
    if not args.comm_model.is_file():
        raise InputFileError(args.comm_model, "missing: run `paraplan fit` first")
    profile = read_profile(args.profile)
    model, settings = _model_settings(args)
    comm = FittedCommModel.from_json(args.comm_model)
    cluster = load_cluster(args.cluster)
    batch = args.batch or profile.batch_size
    threads = args.threads or max(1, (os.cpu_count() or 2) // 2)
    profile_threads = profile.meta.get("threads")
    if args.backend == "gloo" and profile_threads not in (None, threads):
        print(f"paraplan validate: warning: the profile was taken with {profile_threads} threads, "
              f"the ranks use {threads}", file=sys.stderr)

    spec = WorkloadSpec("paraplan.validate.workload:profile_model_workload",
                        {"model": model, "settings": settings})
    layers = spec.build().layers
    if len(layers) != profile.num_layers:
        raise InputFileError(args.profile, f"{profile.num_layers} layers, but the model '{model}' with the "
                             f"meta's settings has {len(layers)}")
    micro = batch / args.microbatches
    cut = balanced_boundary(list(profile.fwd_s_at(micro) + profile.bwd_s_at(micro)))
    cores = os.cpu_count() or 1
    saturated = args.backend == "gloo" and threads * 2 >= cores
    tp_counts = tp_allreduce_counts(layers)
    acts = profile.activation_bytes_at(batch)
    probe_bytes = tuple(sorted({round(float(a)) for a, c in zip(acts, tp_counts, strict=True) if c > 0})) \
        if "tp2" in strategies else ()
    cfg = RunConfig(spec, strategies, global_batch_size=batch, num_microbatches=args.microbatches, steps=args.steps,
                    warmup=args.warmup, threads_per_rank=threads, pipeline_boundary=cut,
                    backend=args.backend, timeout_s=args.timeout_s, allreduce_probe_bytes=probe_bytes)
    setup = PredictionSetup(batch, args.microbatches, cut, tuple(tp_counts),
                            comm_uses_compute_cores=saturated, tp_split=tuple(tp_split_layers(layers)),
                            tp_splits_fixed_time=args.backend == "gloo", pipeline_accumulation=True)
    plain = PredictionSetup(batch, args.microbatches, cut, setup.tp_allreduces)
    uncorrected = predict_step_times(profile, cluster, comm, strategies, plain)  # fails early on bad input
    print(f"paraplan validate: {profile.name} ({model}), batch {batch}, {len(strategies)} strategies, "
          f"{args.warmup} + {args.steps} steps, {threads} thread(s) per rank, pipeline cut before layer "
          f"{cut}, {args.backend}", file=sys.stderr)
    problem = profile_inconsistency(profile.meta)
    if problem:
        print(f"paraplan validate: warning: profile {profile.name}: {problem}", file=sys.stderr)
    from paraplan.progress import bar

    load_before = read_load_1m()
    with bar(args.warmup + args.steps, f"validate {profile.name}", "round") as progress:
        result = run_strategies(cfg, on_round=progress.update)
    load = LoadCheck(load_before, read_load_1m(), cores, 2 * threads)
    extra: dict = {}
    if result.allreduce_s:
        setup = replace(setup, tp_allreduce_s=tuple(
            (float(nb), statistics.fmean(times)) for nb, times in sorted(result.allreduce_s.items())))
        for nb, times in sorted(result.allreduce_s.items()):
            fit = float(comm.time_s("all_reduce", nb, Group(2, 1)))
            print(f"all_reduce of {nb} B (tp2's activations), {len(times)} calls: mean "
                  f"{statistics.fmean(times) * 1e3:.2f} ms, median {statistics.median(times) * 1e3:.2f} ms "
                  f"(the fit says {fit * 1e3:.2f} ms): tp2 charged the mean")
            extra[f"allreduce_mean_s__{nb}"] = statistics.fmean(times)
            extra[f"allreduce_median_s__{nb}"] = statistics.median(times)
    predicted = predict_step_times(profile, cluster, comm, strategies, setup, result.contention_factor)
    if saturated:
        print(f"gloo ranks fill all {cores} cores: dp_overlap predicted without overlap")
    half = batch / 2
    profiled_s = float(profile.fwd_s_at(half).sum() + profile.bwd_s_at(half).sum())
    drift = statistics.median(result.alone_s) / profiled_s
    print(f"contention: whole-model forward+backward at batch {half:g} alone {_ms(result.alone_s)} ms, "
          f"all ranks at once {_ms(result.together_s)} ms: compute x {result.contention_factor:.3f} "
          f"(the profile says {profiled_s * 1e3:.2f} ms alone: drift x {drift:.3f}, not corrected)")
    extra |= {"load_before_1m": load.load_before_1m, "load_after_1m": load.load_after_1m,
              "other_load_per_core": load.other_load_per_core, "machine_busy": float(load.busy)}
    sum_vs_whole = profile.meta.get("sum_vs_whole_rel_err")
    if isinstance(sum_vs_whole, int | float):
        extra["profile_sum_vs_whole_rel_err"] = float(sum_vs_whole)
    extra |= {"contention_factor": result.contention_factor, "profile_drift": drift,
             "calibration_alone_s": statistics.median(result.alone_s),
             "calibration_together_s": statistics.median(result.together_s)}
    # diagnostic only: the profile rescaled to the run's own compute speed, which
    # separates a stale profile (machine load when it was taken) from the model's error
    rescaled = predict_step_times(profile, cluster, comm, strategies, setup, result.contention_factor,
                                  profile_drift=drift)
    for strategy, value in rescaled.items():
        extra[f"predicted_rescaled_s__{strategy}"] = value
        extra[f"rel_err_rescaled__{strategy}"] = value / result.measured[strategy].median_s - 1
    print("profile rescaled by the drift (diagnostic): "
          + ", ".join(f"{k} {v * 1e3:.2f} ms ({extra[f'rel_err_rescaled__{k}']:+.1%})" for k, v in rescaled.items()))
    warnings = [w for w in (load.warning(), f"warning: profile {profile.name}: {problem}" if problem else None) if w]
    return _finish(args, profile.name, model, settings, setup, threads, result, predicted, uncorrected, extra,
                   load, warnings)


def _ms(values) -> str:
    return "/".join(f"{v * 1e3:.2f}" for v in values)


def _finish(args, name, model, settings, setup, threads, result, predicted, uncorrected, extra, load,
            warnings) -> int:
    from paraplan.cli.common import track
    from paraplan.files import write_csv
    from paraplan.track import RunLog, Table
    from paraplan.validate import strategy_metrics, validation_metrics, validation_table

    measured = result.measured
    table = validation_table(measured, predicted, load.other_load_per_core)
    write_csv(args.output, table)
    print(f"{'strategy':<12}{'measured ms':>12}{'p10':>9}{'p90':>9}{'predicted ms':>14}{'rel_err':>9}"
          f"{'uncorrected ms':>16}{'rel_err':>9}")
    for row in table.itertuples(index=False):
        raw = uncorrected[row.strategy]
        print(f"{row.strategy:<12}{row.measured_s * 1e3:12.2f}{row.measured_p10_s * 1e3:9.2f}"
              f"{row.measured_p90_s * 1e3:9.2f}{row.predicted_s * 1e3:14.2f}{row.rel_err:+9.1%}"
              f"{raw * 1e3:16.2f}{raw / row.measured_s - 1:+9.1%}")
    abs_err = table["rel_err"].abs()
    print(f"wrote {args.output}: |rel_err| median {abs_err.median():.1%}, max {abs_err.max():.1%}; "
          f"{load.describe()}")
    for line in warnings:  # last, where a reader of the table looks
        print(f"paraplan validate: {line}", file=sys.stderr)

    artifacts = [args.output]
    if args.plots is not None:
        from paraplan.plots.validate import plot_validation

        artifacts += plot_validation(table, args.plots / name, title=f"{name}: predicted vs measured",
                                     uncorrected_s=uncorrected)
    # one row per strategy with the same metric names (logged with step = the row's
    # index, so the UI compares them); each strategy's measured step times as a series
    # of its own; the run keeps what belongs to the whole validation
    per_strategy = strategy_metrics(table)
    for strategy, raw in uncorrected.items():
        per_strategy[strategy]["predicted_uncorrected_s"] = raw
        per_strategy[strategy]["rel_err_uncorrected"] = raw / measured[strategy].median_s - 1
    metrics = validation_metrics(table)
    for key, value in extra.items():
        base, _, strategy = key.rpartition("__")
        if strategy in per_strategy:
            per_strategy[strategy][base] = value
        else:
            metrics[key] = value
    rows = [{"strategy": strategy, **values} for strategy, values in per_strategy.items()]
    strategies = Table(rows=rows, metrics=list(dict.fromkeys(k for v in per_strategy.values() for k in v)),
                       name="strategies")
    step_times = {f"step_time_s__{strategy}": list(enumerate(measured[strategy].step_times_s))
                  for strategy in per_strategy}
    params = {
        "profile": str(args.profile), "comm_model": str(args.comm_model), "cluster": args.cluster,
        "model": model, "model_settings": settings, "strategies": list(measured),
        "global_batch_size": setup.global_batch_size, "num_microbatches": setup.num_microbatches,
        "pipeline_boundary": setup.pipeline_boundary, "steps": args.steps, "warmup": args.warmup,
        "threads_per_rank": threads, "backend": args.backend,
        "comm_uses_compute_cores": setup.comm_uses_compute_cores,
    }
    track(args, RunLog(stage="validate", run_name=name, params=params, metrics=metrics,
                       step_metrics=step_times, artifacts=artifacts, table=strategies))
    return 0
