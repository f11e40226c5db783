"""Predict LLM training runs: iteration time, TFLOP/s per GPU, MFU, memory per device
and pipeline bubble, one row per run, from a run table whose columns are named as
Megatron-LM's arguments.

Required columns: num_layers, hidden_size, num_attention_heads, seq_length,
vocab_size, tensor_model_parallel_size, pipeline_model_parallel_size,
data_parallel_size, global_batch_size; or, instead of the model's dimensions, a
model column naming a preset (deepseek-v3, llama3-70b, ...) or a model file (a Hugging
Face config.json, relative to the table's folder), with seq_length optional. Optional:
name, num_query_groups, ffn_hidden_size, swiglu, untie_embeddings_and_output_weights,
normalization, position_embedding_type, add_bias_linear, hidden_dropout,
attention_dropout, kv_channels, add_qkv_bias, qk_layernorm, softmax_type,
gated_linear_unit, window_size, window_attn_skip_freq, num_experts, moe_router_topk,
moe_ffn_hidden_size, moe_shared_expert_intermediate_size, moe_layer_freq,
multi_latent_attention, q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim,
v_head_dim, mtp_num_layers, make_vocab_size_divisible_by (docs/models.md),
micro_batch_size, virtual_pipeline_model_parallel_size, recompute_granularity
(none|selective|full), recompute_modules (with selective, Megatron-Core's modules separated
by spaces: core_attn, mla_up_proj, layernorm, mlp; default core_attn), sequence_parallel,
use_distributed_optimizer, zero_stage,
overlap_grad_reduce, overlap_param_gather, tp_comm_overlap,
async_tensor_model_parallel_allreduce, gradient_accumulation_fusion, DDP_impl
(local|torch), dtype (bf16|fp16|fp8|fp32), schedule,
use_flash_attn, context_parallel_size, cp_comm_type (p2p|all_gather|a2a), num_gpus,
measured_iteration_s (docs/execution-model.md says what each setting changes).
An empty micro_batch_size or virtual_pipeline_model_parallel_size means the
fastest that fits.

The output is the input plus num_parameters and active_parameters (per token: all
but the routed experts a token is not sent to), predicted_iteration_s, predicted_tflops_per_gpu,
predicted_mfu, predicted_peak_memory_bytes, predicted_weight_state_bytes,
predicted_activation_bytes, bubble_fraction, fits_memory, chosen (the settings the
predictor chose), calibration (the calibration it used) and plausibility (empty, or
why the predicted MFU is above the device's GEMM ceiling or above 65%, more than any
published full training step; such runs are also named in a warning). With a
measured_iteration_s column the errors are printed and logged. With --explain,
explain_gemm_s, explain_attention_s, explain_memory_s, explain_tp_comm_s,
explain_dp_comm_s, explain_pp_comm_s, explain_bubble_s, explain_optimizer_s and
explain_host_s split each run's predicted_iteration_s (docs/execution-model.md).

examples:
  paraplan predict runs.csv --cluster dgx-a100 -o predicted.csv
  paraplan predict runs.csv --cluster dgx-h100 --calibration my-h100.json -o out.csv
  paraplan predict runs.csv --cluster dgx-a100 -o predicted.csv --explain
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
                        help="calibration name or file from `paraplan calibrate` (default: the shipped one made "
                             "for the cluster's device, else a100-vtrain with a warning)")
    parser.add_argument("-o", "--output", required=True, type=Path, help="output CSV")
    parser.add_argument("--plots", type=Path, default=None,
                        help="folder for the figures: each run's predicted iteration time and MFU, predicted vs "
                        "measured (with a measured_iteration_s column) and, with --explain, the time breakdown "
                        "(default for that one: the output's folder)")
    parser.add_argument("--explain", action="store_true",
                        help="add explain_*_s columns (where each run's iteration time goes: GEMM, attention, "
                        "memory-bound kernels, exposed TP / DP / PP communication, bubble, optimizer, host; they "
                        "sum to predicted_iteration_s) and a stacked-bar figure <runs>_explain.png/.pdf")
    add_tracking_arguments(parser)


def _format(value: float) -> str:
    return f"{value:.6g}"


def output_rows(header: list[str], rows, predictions, calibration_label: str,
                breakdowns=None, flags=None) -> tuple[list[str], list[dict]]:
    from paraplan.predict.explain import EXPLAIN_COLUMNS
    from paraplan.predict.predictor import UNEVEN_SPLIT_COLUMNS
    from paraplan.predict.runtable import PREDICTED

    columns = [c for c in header if c not in PREDICTED]
    for extra in ("micro_batch_size", "virtual_pipeline_model_parallel_size", *UNEVEN_SPLIT_COLUMNS):
        if extra not in columns and any(extra in p.chosen for p in predictions):
            columns.append(extra)
    columns += list(PREDICTED)
    if breakdowns is not None:
        columns += list(EXPLAIN_COLUMNS)
    out = []
    for i, (row, pred) in enumerate(zip(rows, predictions, strict=True)):
        cells = {c: row.cells.get(c, "") for c in columns if c not in PREDICTED}
        for name in pred.chosen:
            cells[name] = str(getattr(pred.settings, name))
        cells.update({
            "num_parameters": str(row.model.num_parameters),
            "active_parameters": str(row.model.active_parameters),
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
            "plausibility": flags[i] if flags is not None else "",
        })
        if breakdowns is not None:
            cells.update({f"explain_{k}_s": _format(v) for k, v in breakdowns[i].seconds.items()})
        out.append(cells)
    return columns, out


def run(args: argparse.Namespace) -> int:
    import csv

    import numpy as np

    from paraplan.clusters import load_cluster
    from paraplan.core import StrategyError
    from paraplan.files import atomic_open
    from paraplan.predict.calibrate import ErrorSummary
    from paraplan.predict.calibration import calibration_for
    from paraplan.predict.predictor import plausibility, predict_rows
    from paraplan.predict.runtable import read_run_table

    cluster = load_cluster(args.cluster)
    calibration = calibration_for(cluster, args.calibration,
                                  warn=lambda m: print(f"paraplan predict: warning: {m}", file=sys.stderr))
    if calibration.device != cluster.device.name:
        print(f"paraplan predict: note: calibration '{calibration.name}' was fitted on {calibration.device}; "
              f"{cluster.device.name} gets its efficiencies as fractions of its own datasheet peaks",
              file=sys.stderr)
    header, rows = read_run_table(args.runs)
    started = time.perf_counter()
    comm = calibration.comm_model(cluster)
    breakdowns = None
    try:
        predictions = predict_rows(rows, cluster, comm, calibration.efficiency)
        if args.explain:
            from paraplan.predict.explain import explain_run

            breakdowns = [explain_run(r.model, p.settings, cluster, comm, calibration.efficiency)
                          for r, p in zip(rows, predictions, strict=True)]
    except StrategyError as exc:
        raise StrategyError(f"{args.runs}: {exc}") from None
    seconds = time.perf_counter() - started
    flags = [plausibility(p.mfu, calibration.efficiency) for p in predictions]
    columns, out = output_rows(header, rows, predictions, calibration.label, breakdowns, flags)
    with atomic_open(args.output, "w") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(out)
    for row, flag in zip(rows, flags, strict=True):
        if flag:
            print(f"paraplan predict: warning: {args.runs}:{row.line} ({row.name}): {flag}; outside anything "
                  "published, check the calibration and the settings", file=sys.stderr)
    unfit = sum(not p.fits_memory for p in predictions)
    print(f"paraplan predict: {len(rows)} run(s) in {seconds:.2f} s with {calibration.label} -> {args.output}"
          + (f"; {unfit} do not fit in {cluster.device.memory_bytes / 1e9:.0f} GB" if unfit else ""),
          file=sys.stderr)
    metrics: dict[str, float] = {"runs": float(len(rows)), "predict_s": seconds, "not_fitting": float(unfit),
                                 "implausible": float(sum(bool(f) for f in flags))}
    measured = [(r.measured_iteration_s, p.iteration_s) for r, p in zip(rows, predictions, strict=True)
                if r.measured_iteration_s is not None]
    artifacts = [args.output]
    if breakdowns is not None:
        from paraplan.plots.predict import plot_time_breakdown
        from paraplan.predict.explain import PARTS

        artifacts += plot_time_breakdown(
            [r.name for r in rows], np.array([[b.seconds[k] for k in PARTS] for b in breakdowns]), PARTS,
            (args.plots or args.output.parent) / f"{args.runs.stem}_explain",
            f"where the iteration time goes\n{args.runs.name} on {cluster.device.name} with {calibration.label}")
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
