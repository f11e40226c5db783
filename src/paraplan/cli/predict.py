"""Predict LLM training runs: iteration time, TFLOP/s per GPU, MFU, memory per device
and pipeline bubble, one row per run, from a run table whose columns are named as
Megatron-LM's arguments.

Required columns: num_layers, hidden_size, num_attention_heads, seq_length,
vocab_size, tensor_model_parallel_size, pipeline_model_parallel_size,
data_parallel_size, global_batch_size. Optional: name, num_query_groups,
ffn_hidden_size, swiglu, untie_embeddings_and_output_weights, normalization,
position_embedding_type, add_bias_linear, hidden_dropout, attention_dropout,
micro_batch_size, virtual_pipeline_model_parallel_size, recompute_granularity
(none|selective|full), sequence_parallel, use_distributed_optimizer, zero_stage,
overlap_grad_reduce, overlap_param_gather, tp_comm_overlap, dtype
(bf16|fp16|fp8|fp32), schedule, use_flash_attn, num_gpus, measured_iteration_s.
An empty micro_batch_size or virtual_pipeline_model_parallel_size means the
fastest that fits.

The output is the input plus predicted_iteration_s, predicted_tflops_per_gpu,
predicted_mfu, predicted_peak_memory_bytes, predicted_weight_state_bytes,
predicted_activation_bytes, bubble_fraction, fits_memory, chosen (the settings the
predictor chose) and calibration (the calibration it used). With a
measured_iteration_s column the errors are printed and logged.

examples:
  paraplan predict runs.csv --cluster dgx-a100 -o predicted.csv
  paraplan predict runs.csv --cluster dgx-h100 --calibration my-h100.json -o out.csv
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from paraplan.cli.common import add_tracking_arguments, track

NAME = "predict"
HELP = "predict iteration time, throughput, MFU and memory of LLM training runs (a run table)"
ORDER = 55


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("runs", type=Path, help="run table (CSV), one training run per row")
    parser.add_argument("--cluster", required=True,
                        help="cluster name in config/clusters (e.g. dgx-a100, dgx-h100) or a YAML file")
    parser.add_argument("--calibration", default=None,
                        help="calibration file from `paraplan calibrate` (default: the shipped a100-vtrain)")
    parser.add_argument("-o", "--output", required=True, type=Path, help="output CSV")
    parser.add_argument("--plots", type=Path, default=None,
                        help="folder for the figures: each run's predicted iteration time and MFU, and predicted "
                             "vs measured (with a measured_iteration_s column)")
    add_tracking_arguments(parser)


def _format(value: float) -> str:
    return f"{value:.6g}"


def output_rows(header: list[str], rows, predictions, calibration_label: str) -> tuple[list[str], list[dict]]:
    from paraplan.predict.runtable import PREDICTED

    columns = [c for c in header if c not in PREDICTED]
    for extra in ("micro_batch_size", "virtual_pipeline_model_parallel_size"):
        if extra not in columns and any(extra in p.chosen for p in predictions):
            columns.append(extra)
    columns += list(PREDICTED)
    out = []
    for row, pred in zip(rows, predictions, strict=True):
        cells = {c: row.cells.get(c, "") for c in columns if c not in PREDICTED}
        if "micro_batch_size" in pred.chosen:
            cells["micro_batch_size"] = str(pred.settings.micro_batch_size)
        if "virtual_pipeline_model_parallel_size" in pred.chosen:
            cells["virtual_pipeline_model_parallel_size"] = str(pred.settings.virtual_pipeline_model_parallel_size)
        cells.update({
            "predicted_iteration_s": _format(pred.iteration_s),
            "predicted_tflops_per_gpu": _format(pred.tflops_per_gpu),
            "predicted_mfu": _format(pred.mfu),
            "predicted_peak_memory_bytes": f"{pred.peak_memory_bytes:.0f}",
            "predicted_weight_state_bytes": f"{pred.weight_state_bytes:.0f}",
            "predicted_activation_bytes": f"{pred.activation_bytes:.0f}",
            "bubble_fraction": _format(pred.bubble_fraction),
            "fits_memory": "true" if pred.fits_memory else "false",
            "chosen": ";".join(f"{c}={getattr(pred.settings, c)}" for c in pred.chosen),
            "calibration": calibration_label,
        })
        out.append(cells)
    return columns, out


def run(args: argparse.Namespace) -> int:
    import csv

    import numpy as np

    from paraplan.clusters import load_cluster
    from paraplan.core import StrategyError
    from paraplan.files import atomic_open
    from paraplan.predict.calibrate import ErrorSummary
    from paraplan.predict.calibration import DEFAULT_CALIBRATION, load_calibration
    from paraplan.predict.predictor import predict_rows
    from paraplan.predict.runtable import read_run_table

    cluster = load_cluster(args.cluster)
    calibration = load_calibration(args.calibration or DEFAULT_CALIBRATION)
    if calibration.device != cluster.device.name:
        print(f"paraplan predict: note: calibration '{calibration.name}' was fitted on {calibration.device}; "
              f"{cluster.device.name} gets its efficiencies as fractions of its own datasheet peaks",
              file=sys.stderr)
    header, rows = read_run_table(args.runs)
    started = time.perf_counter()
    try:
        predictions = predict_rows(rows, cluster, calibration.comm_model(cluster), calibration.efficiency)
    except StrategyError as exc:
        raise StrategyError(f"{args.runs}: {exc}") from None
    seconds = time.perf_counter() - started
    columns, out = output_rows(header, rows, predictions, calibration.label)
    with atomic_open(args.output, "w") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(out)
    unfit = sum(not p.fits_memory for p in predictions)
    print(f"paraplan predict: {len(rows)} run(s) in {seconds:.2f} s with {calibration.label} -> {args.output}"
          + (f"; {unfit} do not fit in {cluster.device.memory_bytes / 1e9:.0f} GB" if unfit else ""),
          file=sys.stderr)
    metrics: dict[str, float] = {"runs": float(len(rows)), "predict_s": seconds, "not_fitting": float(unfit)}
    measured = [(r.measured_iteration_s, p.iteration_s) for r, p in zip(rows, predictions, strict=True)
                if r.measured_iteration_s is not None]
    artifacts = [args.output]
    if measured:
        from paraplan.predict.ranking import ranking_summary
        from paraplan.predict.runtable import question_label

        with_measured = [(r, p) for r, p in zip(rows, predictions, strict=True) if r.measured_iteration_s is not None]
        m, p = np.array(measured).T
        errors = ErrorSummary.of(p, m)
        ranking = ranking_summary([question_label(r) for r, _ in with_measured], p, m)
        metrics.update({f"{k}": float(v) for k, v in errors.as_dict().items() if k != "n" and v is not None})
        if ranking.groups:
            metrics["top3_fraction"] = ranking.hit_fraction
        print(f"paraplan predict: vs measured_iteration_s ({errors.n} runs): MAPE {errors.mape:.2%}, median "
              f"{errors.median_ape:.2%}, max {errors.max_ape:.2%}, Spearman {errors.spearman:.3f}; measured-fastest "
              f"in the predicted top 3 for {ranking.hits}/{ranking.groups} questions", file=sys.stderr)
        if args.plots is not None:
            from paraplan.plots.predict import plot_predicted_vs_measured

            artifacts += plot_predicted_vs_measured(
                m, p, np.array([r.settings.tensor_model_parallel_size for r, _ in with_measured]),
                np.array([r.settings.pipeline_model_parallel_size for r, _ in with_measured]),
                args.plots / f"{args.runs.stem}_predicted_vs_measured",
                f"{args.runs.name} on {cluster.device.name} with {calibration.label}\nMAPE {errors.mape:.1%}, "
                f"median {errors.median_ape:.1%}, max {errors.max_ape:.0%}, Spearman {errors.spearman:.3f}")
    if args.plots is not None:
        from paraplan.plots.predict import plot_predicted_runs

        artifacts += plot_predicted_runs(
            [r.name for r in rows], np.array([p.iteration_s for p in predictions]),
            np.array([p.mfu for p in predictions]), [p.fits_memory for p in predictions],
            args.plots / f"{args.runs.stem}_predicted", f"{args.runs.name} on {cluster.device.name} with "
            f"{calibration.label}")
    from paraplan.track import RunLog

    track(args, RunLog(
        stage="predict", run_name=f"{args.runs.name}@{cluster.name}",
        params={"runs": str(args.runs), "cluster": cluster.name, "calibration": calibration.label},
        metrics=metrics, artifacts=artifacts,
    ))
    return 0
