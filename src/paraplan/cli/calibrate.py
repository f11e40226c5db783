"""Fit the device model to measured times and write a calibration file that
`paraplan predict` (and plan) use.

The measurements are either a run table (see `paraplan predict --help`) with a
measured_iteration_s column, all runs on one kind of device (the --cluster's), or a
layer profile of `paraplan profile --model gpt` taken on that device (--profile; its
transformer blocks, at each batch size it measured). The fit's honest error comes from
leave-one-group-out cross-validation: for a run table a group is a model shape by
default (hidden size, layers, heads, sequence length), so each shape is predicted by
a fit that never saw it; for a profile, a batch size. The calibration file records
the parameters, the data (path, SHA-256, count), the in-sample and cross-validated
errors and, with --comm-model, the intra-node communication fit (a `paraplan fit`
comm_model.json of this device's node, e.g. from nccl-tests).

For a run table, a second step fits one measured layer-time factor per layer shape
(device, dtype, widths, heads, sequence, micro-batch, tensor degree, ...) with at
least 3 runs: what the library's kernel choice makes a layer of that shape faster or
slower than the analytic model (see paraplan.predict.layer_factors). Shapes never
measured are predicted by the analytic model alone; --no-layer-factors leaves the
table out. Each cross-validation fold fits its own factors on its training runs.

examples:
  paraplan ingest --format vtrain vtrain_a100_single_node_measured.csv -o runs.csv
  paraplan fit a100_all_reduce.csv -o comm_model.json
  paraplan calibrate runs.csv --cluster dgx-a100 --comm-model comm_model.json \\
      --name a100-vtrain -o a100-vtrain.json --predictions cv.csv
  paraplan calibrate --profile results/profiles/gpt.csv --cluster my-gpu -o my-gpu.json
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paraplan.cli.common import add_tracking_arguments, track

if TYPE_CHECKING:
    import numpy as np

    from paraplan.predict.calibrate import Measured

NAME = "calibrate"
HELP = "fit the device model to measured iteration times (run table) or a layer profile, cross-validated"
ORDER = 54
DEFAULT_GROUP_BY = "hidden_size,num_layers,num_attention_heads,seq_length"
NO_RANKING = ("no question has >= 2 runs (a question: one model, GPU count and global batch size; its runs "
              "differ in parallel settings only)")
PROFILE_FIT = ("gemm_efficiency", "gemm_k_half", "memory_efficiency", "kernel_latency_s", "host_kernel_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("runs", type=Path, nargs="?", default=None,
                        help="run table (CSV) with a measured_iteration_s column")
    parser.add_argument("--profile", type=Path, default=None,
                        help="instead of a run table: a `paraplan profile --model gpt` profile CSV (+ .meta.json)")
    parser.add_argument("--cluster", required=True, help="the device's cluster file (name or YAML path)")
    parser.add_argument("--comm-model", type=Path, default=None,
                        help="comm_model.json of collectives inside one node of this device (paraplan fit)")
    parser.add_argument("--name", default=None, help="calibration name (default: the output file's stem)")
    parser.add_argument("--group-by", default=DEFAULT_GROUP_BY,
                        help="run-table columns whose values form a cross-validation group "
                             f"(default: {DEFAULT_GROUP_BY})")
    parser.add_argument("--fit", default="",
                        help="comma-separated parameters to fit (default: all that the data determines)")
    parser.add_argument("--kernel-ceilings", default=None, metavar="DEVICE|PATH",
                        help="hold the GEMM and attention parameters at a kernel fit (`paraplan fit --kind kernels`): "
                             "'device' for config/kernels/<the cluster's device>.json, or a name or path; they are "
                             "then not fitted (docs/kernels.md)")
    parser.add_argument("--transfer", default=None, metavar="CALIBRATION",
                        help="instead of measurements: a calibration for the --cluster's device made from another "
                             "device's CALIBRATION (host, memory-bound and contention parameters) and this device's "
                             "kernel fit (--kernel-ceilings, default 'device'): for devices without training runs")
    parser.add_argument("--no-layer-factors", action="store_true",
                        help="run tables: do not fit measured layer-time factors per layer shape (analytic model only)")
    parser.add_argument("--no-cross-validation", action="store_true",
                        help="skip the leave-one-group-out fits (the file then has in-sample errors only)")
    parser.add_argument("--predictions", type=Path, default=None,
                        help="also write each measurement's cross-validated and in-sample prediction (CSV)")
    parser.add_argument("--plots", type=Path, default=None,
                        help="folder for the predicted-vs-measured figure (PNG + PDF)")
    parser.add_argument("-o", "--output", required=True, type=Path, help="calibration file (JSON)")
    add_tracking_arguments(parser)


@dataclass
class _Data:
    """Measurements from either source, in the shape the fit and the reports need."""

    measured: Measured
    seconds: np.ndarray
    groups: list[str]  # cross-validation group of each measurement
    questions: list[str] | None  # ranking questions (run tables only)
    tp: np.ndarray
    pp: np.ndarray
    path: Path
    kind: str  # "runs" / "profile"
    group_scheme: str
    default_fit: tuple[str, ...]
    frame: Any  # a pandas DataFrame: rows for --predictions


def _runs(args, cluster, comm) -> _Data:
    import numpy as np
    import pandas as pd

    from paraplan.core import ConfigError, InputFileError
    from paraplan.predict import calibrate as cal
    from paraplan.predict.build import run_structure
    from paraplan.predict.runtable import KNOWN, question_label, read_run_table

    header, rows = read_run_table(args.runs)
    missing = [r.line for r in rows if r.measured_iteration_s is None]
    if missing:
        raise InputFileError(args.runs, "column 'measured_iteration_s': a calibration needs a measured time "
                             "in every row", line=missing[0])
    searched = [r.line for r in rows if r.search_micro_batch_size or r.search_virtual_stages]
    if searched:
        raise InputFileError(args.runs, "a measured run needs its micro_batch_size (and virtual pipeline size, "
                             "when that column exists) filled in", line=searched[0])
    group_by = [c.strip() for c in args.group_by.split(",") if c.strip()]
    unknown = [c for c in group_by if c not in KNOWN]
    if unknown:
        raise ConfigError("--group-by", f"unknown run-table column '{unknown[0]}'")
    structures = tuple(run_structure(r.model, r.settings, cluster, comm) for r in rows)
    frame = pd.DataFrame([{c: r.cells.get(c, "") for c in header} for r in rows])
    return _Data(
        measured=cal.IterationTimes(structures),
        seconds=np.array([r.measured_iteration_s for r in rows], dtype=float),
        groups=["/".join(f"{c}={r.cells.get(c, '').strip()}" for c in group_by) for r in rows],
        questions=[question_label(r) for r in rows],
        tp=np.array([r.settings.tensor_model_parallel_size for r in rows]),
        pp=np.array([r.settings.pipeline_model_parallel_size for r in rows]),
        path=args.runs, kind="runs", group_scheme=f"leave one group out, groups by {', '.join(group_by)}",
        default_fit=cal.DEFAULT_FIT, frame=frame,
    )


def _profile(args, cluster, comm) -> _Data:
    import numpy as np
    import pandas as pd

    from paraplan.predict.profile_fit import layer_times
    from paraplan.profile.io import read_profile

    profile = read_profile(args.profile)
    data = layer_times(profile, cluster, comm, str(args.profile))
    n = len(data)
    kinds = ["forward" if j == 0 else "backward" for j in data.pass_index]
    return _Data(
        measured=data, seconds=data.measured_s, groups=list(data.labels), questions=None,
        tp=np.ones(n, dtype=int), pp=np.ones(n, dtype=int), path=args.profile, kind="profile",
        group_scheme="leave one batch size out", default_fit=PROFILE_FIT,
        frame=pd.DataFrame({"batch": [g[1:] for g in data.labels], "pass": kinds,
                            "measured_s": data.measured_s}),
    )


def _transfer(args: argparse.Namespace) -> int:
    """`--transfer`: write `transferred_calibration` of the named source for the cluster's device."""
    from paraplan.clusters import load_cluster
    from paraplan.core import ConfigError
    from paraplan.files import write_json
    from paraplan.kernels.ceilings import load_kernel_ceilings
    from paraplan.predict.calibration import load_calibration, transferred_calibration

    if args.runs is not None or args.profile is not None:
        raise ConfigError("--transfer", "makes a calibration without measurements: give no run table or --profile")
    cluster = load_cluster(args.cluster)
    source = load_calibration(args.transfer)
    which = args.kernel_ceilings or "device"
    ceilings = load_kernel_ceilings(cluster.device.name if which == "device" else which)
    if ceilings.device != cluster.device.name:
        raise ConfigError("--kernel-ceilings", f"the kernel fit is for {ceilings.device}, the cluster's device is "
                          f"{cluster.device.name}")
    calibration = transferred_calibration(source, cluster.device.name, dict(ceilings.efficiency), which,
                                          args.name or args.output.stem)
    write_json(args.output, calibration.to_dict())
    print(f"paraplan calibrate: {calibration.name} for {cluster.device.name}: {', '.join(sorted(ceilings.efficiency))} "
          f"from its kernel fit, the rest from {source.label} (fitted on {source.device}) -> {args.output}",
          file=sys.stderr)
    from paraplan.track import RunLog

    track(args, RunLog(stage="calibrate", run_name=calibration.name,
                       params={"transfer": source.label, "cluster": cluster.name, "kernel_ceilings": which,
                               "calibration": calibration.label},
                       artifacts=[args.output]))
    return 0


def run(args: argparse.Namespace) -> int:
    import hashlib
    import platform

    import numpy as np

    import paraplan
    from paraplan.clusters import load_cluster
    from paraplan.comm.model import FittedCommModel
    from paraplan.core import ConfigError
    from paraplan.files import write_csv, write_json
    from paraplan.inputs import read_json_object
    from paraplan.predict import calibrate as cal
    from paraplan.predict.calibration import Calibration
    from paraplan.predict.ranking import ranking_summary

    if args.transfer is not None:
        return _transfer(args)
    if (args.runs is None) == (args.profile is None):
        raise ConfigError("runs", "give a run table or --profile (one of them)")
    asked = tuple(c.strip() for c in args.fit.split(",") if c.strip())
    bad = [n for n in asked if n not in cal.FIT_BOUNDS]
    if bad:
        raise ConfigError("--fit", f"unknown parameter '{bad[0]}'; expected some of {', '.join(cal.FIT_BOUNDS)}")
    cluster = load_cluster(args.cluster)
    comm_doc = None
    if args.comm_model is not None:
        comm_doc = read_json_object(args.comm_model, "a comm_model.json (paraplan fit)")
        FittedCommModel.from_dict(comm_doc, str(args.comm_model))  # validates
    name = args.name or args.output.stem
    comm = Calibration(name, cluster.device.name, cal.START, intra_node_comm=comm_doc).comm_model(cluster)
    data = _runs(args, cluster, comm) if args.runs is not None else _profile(args, cluster, comm)
    fitted = asked or data.default_fit
    start, held, held_from = cal.START, dict[str, Any](), None
    if args.kernel_ceilings is not None:
        from dataclasses import replace

        from paraplan.kernels.ceilings import load_kernel_ceilings

        ceilings = load_kernel_ceilings(cluster.device.name if args.kernel_ceilings == "device"
                                        else args.kernel_ceilings)
        if ceilings.device != cluster.device.name:
            raise ConfigError("--kernel-ceilings", f"the kernel fit is for {ceilings.device}, the cluster's device is "
                              f"{cluster.device.name}")
        held, held_from = dict(ceilings.efficiency), args.kernel_ceilings
        clash = [n for n in asked if n in held]
        if clash:
            raise ConfigError("--fit", f"'{clash[0]}' is held at the kernel fit (--kernel-ceilings); leave it out")
        fitted = tuple(n for n in fitted if n not in held)
        start = replace(cal.START, **held)
    measured = data.seconds
    everything = np.arange(len(data.measured))

    started = time.perf_counter()
    print(f"paraplan calibrate: fitting {len(fitted)} parameter(s) to {len(measured)} measured time(s) ...",
          file=sys.stderr)
    factors = data.kind == "runs" and not args.no_layer_factors
    fit = cal.fit_with_factors(data.measured, measured, fitted, start=start, layer_factors=factors)
    insample = data.measured.predict(fit.efficiency, everything)
    in_errors = cal.ErrorSummary.of(insample, measured)
    print(f"paraplan calibrate: in-sample MAPE {in_errors.mape:.2%} ({fit.evaluations} evaluations, "
          f"{time.perf_counter() - started:.0f} s)" + (f"; at a bound: {', '.join(fit.at_bound)}" if fit.at_bound
                                                       else "")
          + (f"; {len(fit.efficiency.layer_time_factors)} layer shape(s) with a measured factor" if factors else ""),
          file=sys.stderr)
    errors: dict[str, object] = {"in_sample": in_errors.as_dict()}
    cv_pred = None
    if not args.no_cross_validation and len(set(data.groups)) >= 2:
        cv = cal.cross_validate(data.measured, measured, data.groups, fitted, fit.efficiency,
                                progress=lambda m: print(f"paraplan calibrate: {m}", file=sys.stderr),
                                layer_factors=factors)
        cv_pred = cv.predicted_s
        cv_errors = cal.ErrorSummary.of(cv_pred, measured)
        errors["cross_validated"] = {
            **cv_errors.as_dict(), "scheme": data.group_scheme, "groups": len(cv.groups),
            "per_group_mape": {g: float(np.abs(cv_pred[cv.group_of_run == i] / measured[cv.group_of_run == i]
                                               - 1).mean()) for i, g in enumerate(cv.groups)},
        }
        print(f"paraplan calibrate: cross-validated MAPE {cv_errors.mape:.2%} (median {cv_errors.median_ape:.2%}, "
              f"max {cv_errors.max_ape:.2%}) over {len(cv.groups)} groups", file=sys.stderr)
    elif not args.no_cross_validation:
        print("paraplan calibrate: one group only: no cross-validation", file=sys.stderr)
    honest = cv_pred if cv_pred is not None else insample
    metrics = {f"insample_{k}": float(v) for k, v in in_errors.as_dict().items() if k != "n" and v is not None}
    if cv_pred is not None:
        metrics.update({f"cv_{k}": float(v) for k, v in cal.ErrorSummary.of(cv_pred, measured).as_dict().items()
                        if k != "n" and v is not None})
    if data.questions is not None and ranking_summary(data.questions, honest, measured).groups == 0:
        # a ranking needs a question (same model, GPUs and global batch) asked of two runs
        errors["ranking"] = {"questions": 0, "measured_fastest_in_top_k": None, "predicted_fastest_within_5pct": None,
                             "why": NO_RANKING}
        print(f"paraplan calibrate: warning: no ranking metrics: {NO_RANKING}", file=sys.stderr)
    elif data.questions is not None:
        ranking = ranking_summary(data.questions, honest, measured)
        errors["ranking"] = {"questions": ranking.groups, "top_k": ranking.top_k,
                             "measured_fastest_in_top_k": ranking.hit_fraction,
                             "predicted_fastest_within_5pct": ranking.pick_fraction,
                             "predictions": "cross_validated" if cv_pred is not None else "in_sample"}
        metrics["top3_fraction"] = ranking.hit_fraction
        metrics["pick_within_5pct_fraction"] = ranking.pick_fraction
        print(f"paraplan calibrate: the measured-fastest configuration is in the predicted top {ranking.top_k} for "
              f"{ranking.hits}/{ranking.groups} questions ({ranking.hit_fraction:.0%}); the predicted-fastest is "
              f"within 5% of it for {ranking.pick_fraction:.0%}", file=sys.stderr)
    calibration = Calibration(
        name=name, device=cluster.device.name, efficiency=fit.efficiency, fitted=fit.fitted, at_bound=fit.at_bound,
        intra_node_comm=comm_doc,
        data={data.kind: str(data.path), "sha256": hashlib.sha256(data.path.read_bytes()).hexdigest(),
              "measurements": len(measured), "cluster": cluster.name,
              "comm_model": str(args.comm_model) if args.comm_model else None,
              **({"kernel_ceilings": held_from} if held_from else {}),
              "paraplan_version": paraplan.__version__, "python": platform.python_version()},
        errors=errors,
        assumptions={"bounds": {k: [lo, hi] for k, (lo, hi, _) in cal.FIT_BOUNDS.items() if k in fitted},
                     "not_fitted": {k: v for k, v in fit.efficiency.as_dict().items() if k not in fitted},
                     **({"held_at_kernel_fit": held} if held else {})},
    )
    write_json(args.output, calibration.to_dict())
    artifacts = [args.output]
    if args.predictions is not None:
        frame = data.frame
        frame["cv_group"] = data.groups
        frame["insample_s"] = insample
        if cv_pred is not None:
            frame["predicted_s"] = cv_pred
        write_csv(args.predictions, frame)
        artifacts.append(args.predictions)
    if args.plots is not None:
        from paraplan.plots.predict import plot_predicted_vs_measured

        kind = f"cross-validated ({data.group_scheme})" if cv_pred is not None else "in-sample"
        e = cal.ErrorSummary.of(honest, measured)
        artifacts += plot_predicted_vs_measured(
            measured, honest, data.tp, data.pp, args.plots / f"{name}_predicted_vs_measured",
            f"{name} on {cluster.device.name}: {kind}\nMAPE {e.mape:.1%}, median {e.median_ape:.1%}, "
            f"max {e.max_ape:.0%}, Spearman {e.spearman:.3f}, {e.n} measurements")
    print(f"paraplan calibrate: {calibration.label} -> {args.output}", file=sys.stderr)
    metrics.update({f"param_{k}": v for k, v in fit.efficiency.as_dict().items()})
    metrics["calibrate_s"] = time.perf_counter() - started
    from paraplan.track import RunLog

    track(args, RunLog(stage="calibrate", run_name=name,
                       params={data.kind: str(data.path), "cluster": cluster.name, "fitted": list(fitted),
                               "cross_validation": data.group_scheme, "calibration": calibration.label},
                       metrics=metrics, artifacts=artifacts))
    return 0
