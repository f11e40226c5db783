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

examples (the shipped a100-vtrain's recipe: cross-validated, minutes on 2 cores; with
--no-cross-validation about 10 s):
  paraplan ingest --format vtrain data/published/vtrain_a100_single_node_measured.csv -o runs.csv
  paraplan ingest --format nccl-tests data/nccl-tests/05_a100_oci_bm_gpu4_1x8_all_reduce.txt -o a100_ar.csv
  paraplan fit a100_ar.csv -o comm_model.json
  paraplan calibrate runs.csv --cluster dgx-a100 --comm-model comm_model.json --kernel-ceilings device \\
      --no-layer-factors --name my-a100 -o my-a100.json --predictions cv.csv
  paraplan calibrate --profile results/profiles/gpt.csv --cluster local-cpu -o my-cpu.json  # after `paraplan profile`
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paraplan.cli._paths import output_path
from paraplan.cli.common import add_tracking_arguments, track

if TYPE_CHECKING:
    from paraplan.core import Cluster, Device
    from paraplan.core.comm import CommModel
    from paraplan.kernels.ceilings import KernelCeilings
    from paraplan.predict.calibration_report import (
        CalibrationData,
        CalibrationReport,
        CalibrationRequest,
        CalibrationSource,
    )

NAME = "calibrate"
HELP = "fit the device model to measured iteration times (run table) or a layer profile, cross-validated"
ORDER = 54
DEFAULT_GROUP_BY = "hidden_size,num_layers,num_attention_heads,seq_length"


def add_arguments(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument("--jobs", type=int, default=1,
                        help="worker processes for the fit's evaluations (run tables; the results are "
                             "byte-identical for any number, default 1)")
    parser.add_argument("--plots", type=Path, default=None,
                        help="folder for the predicted-vs-measured figure (PNG + PDF)")
    parser.add_argument("-o", "--output", required=True, type=output_path, help="calibration file (JSON)")
    add_tracking_arguments(parser)


def _runs(args: argparse.Namespace, cluster: Cluster, comm: CommModel) -> tuple[CalibrationData, Any]:
    """A run table's measurements, and its rows for --predictions (a pandas DataFrame)."""
    import numpy as np
    import pandas as pd

    from paraplan.core import ConfigError, InputFileError
    from paraplan.predict import calibrate as cal
    from paraplan.predict.build import run_structure
    from paraplan.predict.calibration_report import CalibrationData
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
    return CalibrationData(
        measured=cal.IterationTimes(structures),
        seconds=np.array([r.measured_iteration_s for r in rows], dtype=float),
        groups=tuple("/".join(f"{c}={r.cells.get(c, '').strip()}" for c in group_by) for r in rows),
        questions=tuple(question_label(r) for r in rows),
        tp=np.array([r.settings.tensor_model_parallel_size for r in rows]),
        pp=np.array([r.settings.pipeline_model_parallel_size for r in rows]),
        kind="runs", group_scheme=f"leave one group out, groups by {', '.join(group_by)}",
        default_fit=cal.DEFAULT_FIT,
    ), frame


def _profile(args: argparse.Namespace, cluster: Cluster, comm: CommModel) -> tuple[CalibrationData, Any]:
    """A layer profile's block times, and their rows for --predictions (a pandas DataFrame)."""
    import numpy as np
    import pandas as pd

    from paraplan.predict.calibrate import PROFILE_FIT
    from paraplan.predict.calibration_report import CalibrationData
    from paraplan.predict.profile_fit import layer_times
    from paraplan.profile.io import read_profile

    profile = read_profile(args.profile)
    data = layer_times(profile, cluster, comm, str(args.profile))
    n = len(data)
    kinds = ["forward" if j == 0 else "backward" for j in data.pass_index]
    return CalibrationData(
        measured=data, seconds=data.measured_s, groups=tuple(data.labels), questions=None,
        tp=np.ones(n, dtype=int), pp=np.ones(n, dtype=int), kind="profile",
        group_scheme="leave one batch size out", default_fit=PROFILE_FIT,
    ), pd.DataFrame({"batch": [g[1:] for g in data.labels], "pass": kinds, "measured_s": data.measured_s})


def _transfer(args: argparse.Namespace) -> int:
    """`--transfer`: write `transferred_calibration` of the named source for the cluster's device."""
    from paraplan.clusters import load_cluster
    from paraplan.core import ConfigError
    from paraplan.files import write_json
    from paraplan.predict.calibration import load_calibration, transferred_calibration

    if args.runs is not None or args.profile is not None:
        raise ConfigError("--transfer", "makes a calibration without measurements: give no run table or --profile")
    cluster = load_cluster(args.cluster)
    source = load_calibration(args.transfer)
    which = args.kernel_ceilings or "device"
    ceilings = _device_ceilings(cluster, which)
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
    from paraplan.clusters import load_cluster
    from paraplan.core import ConfigError
    from paraplan.predict.calibrate import START
    from paraplan.predict.calibration import Calibration
    from paraplan.predict.calibration_report import CalibrationRequest
    from paraplan.track import RunLog

    if args.transfer is not None:
        return _transfer(args)
    if (args.runs is None) == (args.profile is None):
        raise ConfigError("--profile", "give a run table or --profile (one of them)")
    asked = _asked(args.fit)
    cluster = load_cluster(args.cluster)
    comm_doc = _comm_document(args.comm_model)
    name = args.name or args.output.stem
    comm = Calibration(name, cluster.device.name, START, intra_node_comm=comm_doc).comm_model(cluster)
    data, frame = _runs(args, cluster, comm) if args.runs is not None else _profile(args, cluster, comm)
    held, held_from = _held(args.kernel_ceilings, cluster, asked)
    path: Path = args.runs if args.runs is not None else args.profile
    request = CalibrationRequest(
        name, cluster.device.name, tuple(n for n in asked or data.default_fit if n not in held), held, comm_doc,
        _source(path, cluster.name, args.comm_model, held_from),
        layer_factors=not args.no_layer_factors, cross_validation=not args.no_cross_validation)
    if args.jobs < 1:
        raise ConfigError("--jobs", f"must be >= 1, got {args.jobs}")
    started = time.perf_counter()
    report = _calibrate_pooled(request, data, args.jobs)
    artifacts = _write(args, report, data, frame, cluster)
    print(f"paraplan calibrate: {report.calibration.label} -> {args.output}", file=sys.stderr)
    track(args, RunLog(stage="calibrate", run_name=name,
                       params={data.kind: str(path), "cluster": cluster.name, "fitted": list(request.fitted),
                               "cross_validation": data.group_scheme, "calibration": report.calibration.label},
                       metrics={**report.metrics, "calibrate_s": time.perf_counter() - started},
                       artifacts=artifacts))
    return 0


def _calibrate_pooled(request: CalibrationRequest, data: CalibrationData, jobs: int) -> CalibrationReport:
    """`calibrate`, a run table's evaluations on `jobs` worker processes
    (`paraplan.predict.calibrate_pool`: the same results as one process)."""
    from dataclasses import replace

    from paraplan.predict.calibrate import IterationTimes
    from paraplan.predict.calibrate_pool import pooled
    from paraplan.predict.calibration_report import calibrate

    def say(message: str) -> None:
        print(f"paraplan calibrate: {message}", file=sys.stderr)

    if not isinstance(data.measured, IterationTimes):
        return calibrate(request, data, progress=say)
    with pooled(data.measured, jobs) as measured:
        return calibrate(request, replace(data, measured=measured), progress=say)


def _asked(fit: str) -> tuple[str, ...]:
    """The parameters --fit names (empty: the data's default)."""
    from paraplan.core import ConfigError
    from paraplan.predict.calibrate import FIT_BOUNDS

    asked = tuple(c.strip() for c in fit.split(",") if c.strip())
    bad = [n for n in asked if n not in FIT_BOUNDS]
    if bad:
        raise ConfigError("--fit", f"unknown parameter '{bad[0]}'; expected some of {', '.join(FIT_BOUNDS)}")
    return asked


def _comm_document(path: Path | None) -> dict | None:
    """--comm-model's document, checked (None without one)."""
    if path is None:
        return None
    from paraplan.comm.model import FittedCommModel
    from paraplan.inputs import read_json_object

    document = read_json_object(path, "a comm_model.json (paraplan fit)")
    FittedCommModel.from_dict(document, str(path))  # validates
    return document


def _held(which: str | None, cluster: Cluster, asked: tuple[str, ...]) -> tuple[dict[str, float], str | None]:
    """The parameters --kernel-ceilings holds at the device's kernel fit, and where from."""
    if which is None:
        return {}, None
    from paraplan.core import ConfigError

    ceilings = _device_ceilings(cluster, which)
    clash = [n for n in asked if n in ceilings.efficiency]
    if clash:
        raise ConfigError("--fit", f"'{clash[0]}' is held at the kernel fit (--kernel-ceilings); leave it out")
    return dict(ceilings.efficiency), which


def _source(path: Path, cluster: str, comm_model: Path | None, held_from: str | None) -> CalibrationSource:
    import hashlib

    from paraplan.predict.calibration_report import CalibrationSource

    return CalibrationSource(str(path), hashlib.sha256(path.read_bytes()).hexdigest(), cluster,
                             str(comm_model) if comm_model else None, held_from)


def _write(args: argparse.Namespace, report: CalibrationReport, data: CalibrationData, frame: Any,
           cluster: Cluster) -> list[Path]:
    """The calibration file, and with --predictions and --plots the predictions and
    the predicted-vs-measured figure; returns the files written."""
    from paraplan.files import write_csv, write_json
    from paraplan.predict.calibrate import ErrorSummary

    write_json(args.output, report.calibration.to_dict())
    artifacts = [args.output]
    if args.predictions is not None:
        frame["cv_group"] = list(data.groups)
        frame["insample_s"] = report.insample_s
        if report.cv_predicted_s is not None:
            frame["predicted_s"] = report.cv_predicted_s
        write_csv(args.predictions, frame)
        artifacts.append(args.predictions)
    if args.plots is not None:
        from paraplan.plots.predict import plot_predicted_vs_measured

        name = report.calibration.name
        e = ErrorSummary.of(report.honest_s, report.measured_s)
        artifacts += plot_predicted_vs_measured(
            report.measured_s, report.honest_s, data.tp, data.pp, args.plots / f"{name}_predicted_vs_measured",
            f"{name} on {cluster.device.name}: {report.honest_kind}\nMAPE {e.mape:.1%}, median {e.median_ape:.1%}, "
            f"max {e.max_ape:.0%}, Spearman {e.spearman:.3f}, {e.n} measurements")
    return artifacts


def _device_ceilings(cluster: Cluster, which: str) -> KernelCeilings:
    """The kernel fit --kernel-ceilings names (`device`: the file of what the cluster's
    device computes as), refused when it is another device's."""
    from paraplan.core import ConfigError
    from paraplan.kernels.ceilings import load_kernel_ceilings

    ceilings = load_kernel_ceilings(cluster.device.compute_name if which == "device" else which)
    if ceilings.device != cluster.device.compute_name:
        raise ConfigError("--kernel-ceilings", f"the kernel fit is for {ceilings.device}, the cluster's device "
                          f"{_computes_as(cluster.device)}")
    return ceilings


def _computes_as(device: Device) -> str:
    """`device`'s name, and what it computes as where that is another device's."""
    if device.compute_name == device.name:
        return f"is {device.name}"
    return f"{device.name} computes as {device.compute_name} (same_compute_as)"
