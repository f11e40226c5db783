"""Fit the device model to measured iteration times and write a calibration file that
`paraplan predict` (and plan) use.

The input is a run table (see `paraplan predict --help`) with a
measured_iteration_s column, all runs on one kind of device (the --cluster's). The
fit's honest error is measured by leave-one-group-out cross-validation: by default
a group is a model shape (hidden size, layers, heads, sequence length): each
shape is predicted by a fit that never saw it. The calibration file records the
parameters, the data (path, SHA-256, rows), the in-sample and cross-validated
errors, and the intra-node communication fit when --comm-model is given (a
`paraplan fit` comm_model.json of this device's node, e.g. from nccl-tests).

examples:
  paraplan ingest --format vtrain vtrain_a100_single_node_measured.csv -o runs.csv
  paraplan fit a100_all_reduce.csv -o comm_model.json
  paraplan calibrate runs.csv --cluster dgx-a100 --comm-model comm_model.json \\
      --name a100-vtrain -o a100-vtrain.json --predictions cv.csv
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from paraplan.cli.common import add_tracking_arguments, track

NAME = "calibrate"
HELP = "fit the device model to measured iteration times (run table) and cross-validate it"
ORDER = 54
DEFAULT_GROUP_BY = "hidden_size,num_layers,num_attention_heads,seq_length"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("runs", type=Path, help="run table (CSV) with a measured_iteration_s column")
    parser.add_argument("--cluster", required=True, help="the device's cluster file (name or YAML path)")
    parser.add_argument("--comm-model", type=Path, default=None,
                        help="comm_model.json of collectives inside one node of this device (paraplan fit)")
    parser.add_argument("--name", default=None, help="calibration name (default: the output file's stem)")
    parser.add_argument("--group-by", default=DEFAULT_GROUP_BY,
                        help=f"run-table columns whose values form a cross-validation group (default: {DEFAULT_GROUP_BY})")
    parser.add_argument("--fit", default="",
                        help="comma-separated parameters to fit (default: all fittable ones)")
    parser.add_argument("--no-cross-validation", action="store_true",
                        help="skip the leave-one-group-out fits (the file then has in-sample errors only)")
    parser.add_argument("--predictions", type=Path, default=None,
                        help="also write each run's cross-validated and in-sample prediction (CSV)")
    parser.add_argument("--plots", type=Path, default=None,
                        help="folder for the predicted-vs-measured figure (PNG + PDF)")
    parser.add_argument("-o", "--output", required=True, type=Path, help="calibration file (JSON)")
    add_tracking_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import hashlib
    import platform

    import numpy as np
    import pandas as pd

    import paraplan
    from paraplan.clusters import load_cluster
    from paraplan.comm.model import FittedCommModel
    from paraplan.core import ConfigError, InputFileError
    from paraplan.files import write_csv, write_json
    from paraplan.predict import calibrate as cal
    from paraplan.predict.build import run_structure
    from paraplan.predict.calibration import Calibration
    from paraplan.predict.runtable import KNOWN, read_run_table

    cluster = load_cluster(args.cluster)
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
    fitted = tuple(c.strip() for c in args.fit.split(",") if c.strip()) or cal.DEFAULT_FIT
    bad = [n for n in fitted if n not in cal.FIT_BOUNDS]
    if bad:
        raise ConfigError("--fit", f"unknown parameter '{bad[0]}'; expected some of {', '.join(cal.FIT_BOUNDS)}")

    comm_doc = None
    if args.comm_model is not None:
        import json

        comm_doc = json.loads(args.comm_model.read_text(encoding="utf-8"))
        FittedCommModel.from_dict(comm_doc, str(args.comm_model))  # validates
    name = args.name or args.output.stem
    draft = Calibration(name, cluster.device.name, cal.START, intra_node_comm=comm_doc)
    comm = draft.comm_model(cluster)
    structures = [run_structure(r.model, r.settings, cluster, comm) for r in rows]
    measured = np.array([r.measured_iteration_s for r in rows], dtype=float)

    started = time.perf_counter()
    print(f"paraplan calibrate: fitting {len(fitted)} parameter(s) to {len(rows)} run(s) ...", file=sys.stderr)
    fit = cal.fit_efficiency(structures, measured, fitted)
    insample = cal.predict_iteration_s(structures, fit.efficiency)
    in_errors = cal.ErrorSummary.of(insample, measured)
    fit_s = time.perf_counter() - started
    print(f"paraplan calibrate: in-sample MAPE {in_errors.mape:.2%} ({fit.evaluations} evaluations, {fit_s:.0f} s)"
          + (f"; at a bound: {', '.join(fit.at_bound)}" if fit.at_bound else ""), file=sys.stderr)
    labels = ["/".join(f"{c}={r.cells.get(c, '').strip()}" for c in group_by) for r in rows]
    errors: dict[str, object] = {"in_sample": in_errors.as_dict()}
    cv_pred = None
    if not args.no_cross_validation:
        cv = cal.cross_validate(structures, measured, labels, fitted, fit.efficiency,
                                progress=lambda m: print(f"paraplan calibrate: {m}", file=sys.stderr))
        cv_pred = cv.predicted_s
        cv_errors = cal.ErrorSummary.of(cv_pred, measured)
        errors["cross_validated"] = {
            **cv_errors.as_dict(), "scheme": f"leave one group out, groups by {', '.join(group_by)}",
            "groups": len(cv.groups),
            "per_group_mape": {g: float(np.abs(cv_pred[cv.group_of_run == i] / measured[cv.group_of_run == i]
                                               - 1).mean()) for i, g in enumerate(cv.groups)},
        }
        print(f"paraplan calibrate: cross-validated MAPE {cv_errors.mape:.2%} (median {cv_errors.median_ape:.2%}, "
              f"max {cv_errors.max_ape:.2%}) over {len(cv.groups)} groups", file=sys.stderr)
    from paraplan.predict.ranking import ranking_summary
    from paraplan.predict.runtable import question_label

    questions = [question_label(r) for r in rows]
    honest = cv_pred if cv_pred is not None else insample
    ranking = ranking_summary(questions, honest, measured)
    errors["ranking"] = {"questions": ranking.groups, "top_k": ranking.top_k,
                         "measured_fastest_in_top_k": ranking.hit_fraction,
                         "predicted_fastest_within_5pct": ranking.pick_fraction,
                         "predictions": "cross_validated" if cv_pred is not None else "in_sample"}
    print(f"paraplan calibrate: the measured-fastest configuration is in the predicted top {ranking.top_k} for "
          f"{ranking.hits}/{ranking.groups} questions ({ranking.hit_fraction:.0%}); the predicted-fastest is "
          f"within 5% of it for {ranking.pick_fraction:.0%}", file=sys.stderr)
    digest = hashlib.sha256(args.runs.read_bytes()).hexdigest()
    calibration = Calibration(
        name=name, device=cluster.device.name, efficiency=fit.efficiency, fitted=fit.fitted, at_bound=fit.at_bound,
        intra_node_comm=comm_doc,
        data={"runs": str(args.runs), "sha256": digest, "rows": len(rows), "cluster": cluster.name,
              "comm_model": str(args.comm_model) if args.comm_model else None,
              "paraplan_version": paraplan.__version__, "python": platform.python_version()},
        errors=errors,
        assumptions={"bounds": {k: [lo, hi] for k, (lo, hi, _) in cal.FIT_BOUNDS.items() if k in fitted},
                     "not_fitted": {k: v for k, v in fit.efficiency.as_dict().items() if k not in fitted}},
    )
    write_json(args.output, calibration.to_dict())
    artifacts = [args.output]
    if args.predictions is not None:
        frame = pd.DataFrame([{c: r.cells.get(c, "") for c in header} for r in rows])
        frame["cv_group"] = labels
        frame["insample_iteration_s"] = insample
        if cv_pred is not None:
            frame["predicted_iteration_s"] = cv_pred
        write_csv(args.predictions, frame)
        artifacts.append(args.predictions)
    if args.plots is not None:
        from paraplan.plots.predict import plot_predicted_vs_measured

        kind = "cross-validated (leave one model shape out)" if cv_pred is not None else "in-sample"
        e = cal.ErrorSummary.of(honest, measured)
        artifacts += plot_predicted_vs_measured(
            measured, honest, np.array([r.settings.tensor_model_parallel_size for r in rows]),
            np.array([r.settings.pipeline_model_parallel_size for r in rows]), args.plots / f"{name}_predicted_vs_measured",
            f"{name} on {cluster.device.name}: {kind}\nMAPE {e.mape:.1%}, median {e.median_ape:.1%}, "
            f"max {e.max_ape:.0%}, Spearman {e.spearman:.3f}, {e.n} runs")
    print(f"paraplan calibrate: {calibration.label} -> {args.output}", file=sys.stderr)
    metrics = {f"insample_{k}": float(v) for k, v in in_errors.as_dict().items() if k != "n"}
    if cv_pred is not None:
        metrics.update({f"cv_{k}": float(v) for k, v in cal.ErrorSummary.of(cv_pred, measured).as_dict().items()
                        if k != "n"})
    metrics.update({f"param_{k}": v for k, v in fit.efficiency.as_dict().items()})
    metrics["top3_fraction"] = ranking.hit_fraction
    metrics["pick_within_5pct_fraction"] = ranking.pick_fraction
    metrics["calibrate_s"] = time.perf_counter() - started
    from paraplan.track import RunLog

    track(args, RunLog(stage="calibrate", run_name=name,
                       params={"runs": str(args.runs), "cluster": cluster.name, "fitted": list(fitted),
                               "group_by": group_by, "calibration": calibration.label},
                       metrics=metrics, artifacts=artifacts))
    return 0
