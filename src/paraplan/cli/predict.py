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
from array import array
from dataclasses import dataclass, field
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
                        help="folder for the predicted-vs-measured figure (with a measured_iteration_s column)")
    add_tracking_arguments(parser)


def _format(value: float) -> str:
    return f"{value:.6g}"


def output_columns(header: list[str], searched: set[str]) -> list[str]:
    """The input's columns, the searched sizes the input lacks (`searched`: the
    settings some row leaves to the predictor), then the predictions."""
    from paraplan.predict.runtable import PREDICTED

    columns = [c for c in header if c not in PREDICTED]
    for extra in ("micro_batch_size", "virtual_pipeline_model_parallel_size"):
        if extra not in columns and extra in searched:
            columns.append(extra)
    return columns + list(PREDICTED)


def searched_settings(row) -> set[str]:
    return ({"micro_batch_size"} if row.search_micro_batch_size else set()) | (
        {"virtual_pipeline_model_parallel_size"} if row.search_virtual_stages else set())


def output_cells(columns: list[str], row, pred, calibration_label: str) -> dict[str, str]:
    """One output row: the row as read, the sizes the predictor chose, the predictions."""
    from paraplan.predict.runtable import PREDICTED

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
    return cells


@dataclass
class _Measured:
    """What the error summary, the ranking and the figure need of the rows with a
    measured_iteration_s: 40 bytes per such row (compact arrays, the question label
    as its hash), not the rows."""

    measured_s: array = field(default_factory=lambda: array("d"))
    predicted_s: array = field(default_factory=lambda: array("d"))
    question: array = field(default_factory=lambda: array("q"))
    tensor: array = field(default_factory=lambda: array("q"))
    pipeline: array = field(default_factory=lambda: array("q"))

    def add(self, row, pred) -> None:
        from paraplan.predict.runtable import question_label

        self.measured_s.append(row.measured_iteration_s)
        self.predicted_s.append(pred.iteration_s)
        self.question.append(hash(question_label(row)))
        self.tensor.append(row.settings.tensor_model_parallel_size)
        self.pipeline.append(row.settings.pipeline_model_parallel_size)


def run(args: argparse.Namespace) -> int:
    import csv

    import numpy as np

    from paraplan.clusters import load_cluster
    from paraplan.core import StrategyError
    from paraplan.files import atomic_open
    from paraplan.predict.calibrate import ErrorSummary
    from paraplan.predict.calibration import DEFAULT_CALIBRATION, load_calibration
    from paraplan.predict.predictor import iter_predictions
    from paraplan.predict.runtable import iter_run_table

    cluster = load_cluster(args.cluster)
    calibration = load_calibration(args.calibration or DEFAULT_CALIBRATION)
    if calibration.device != cluster.device.name:
        print(f"paraplan predict: note: calibration '{calibration.name}' was fitted on {calibration.device}; "
              f"{cluster.device.name} gets its efficiencies as fractions of its own datasheet peaks",
              file=sys.stderr)
    # two passes over the table, one row in memory at a time: the first checks every
    # row (a bad row fails before any prediction) and finds the output's columns, the
    # second predicts in chunks and writes each row as it comes (into a temporary file
    # renamed onto -o at the end, so a failure leaves no half-written output)
    header, rows = iter_run_table(args.runs)
    searched: set[str] = set()
    total = 0
    for row in rows:
        searched |= searched_settings(row)
        total += 1
    columns = output_columns(header, searched)
    started = time.perf_counter()
    measured = _Measured()
    unfit = 0
    _, rows = iter_run_table(args.runs)
    with atomic_open(args.output, "w") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        try:
            for row, pred in iter_predictions(rows, cluster, calibration.comm_model(cluster),
                                              calibration.efficiency):
                writer.writerow(output_cells(columns, row, pred, calibration.label))
                unfit += not pred.fits_memory
                if row.measured_iteration_s is not None:
                    measured.add(row, pred)
        except StrategyError as exc:
            raise StrategyError(f"{args.runs}: {exc}") from None
    seconds = time.perf_counter() - started
    print(f"paraplan predict: {total} run(s) in {seconds:.2f} s with {calibration.label} -> {args.output}"
          + (f"; {unfit} do not fit in {cluster.device.memory_bytes / 1e9:.0f} GB" if unfit else ""),
          file=sys.stderr)
    metrics: dict[str, float] = {"runs": float(total), "predict_s": seconds, "not_fitting": float(unfit)}
    artifacts = [args.output]
    if measured.measured_s:
        from paraplan.predict.ranking import ranking_summary

        m, p = np.asarray(measured.measured_s), np.asarray(measured.predicted_s)
        errors = ErrorSummary.of(p, m)
        ranking = ranking_summary(np.asarray(measured.question), p, m)
        metrics.update({f"{k}": float(v) for k, v in errors.as_dict().items() if k != "n"})
        metrics["top3_fraction"] = ranking.hit_fraction
        print(f"paraplan predict: vs measured_iteration_s ({errors.n} runs): MAPE {errors.mape:.2%}, median "
              f"{errors.median_ape:.2%}, max {errors.max_ape:.2%}, Spearman {errors.spearman:.3f}; measured-fastest "
              f"in the predicted top 3 for {ranking.hits}/{ranking.groups} questions", file=sys.stderr)
        if args.plots is not None:
            from paraplan.plots.predict import plot_predicted_vs_measured

            artifacts += plot_predicted_vs_measured(
                m, p, np.asarray(measured.tensor), np.asarray(measured.pipeline),
                args.plots / f"{args.runs.stem}_predicted_vs_measured",
                f"{args.runs.name} on {cluster.device.name} with {calibration.label}\nMAPE {errors.mape:.1%}, "
                f"median {errors.median_ape:.1%}, max {errors.max_ape:.0%}, Spearman {errors.spearman:.3f}")
    from paraplan.track import RunLog

    track(args, RunLog(
        stage="predict", run_name=f"{args.runs.name}@{cluster.name}",
        params={"runs": str(args.runs), "cluster": cluster.name, "calibration": calibration.label},
        metrics=metrics, artifacts=artifacts,
    ))
    return 0
