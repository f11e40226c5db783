"""Predict LLM training runs: iteration time, TFLOP/s per GPU, MFU, memory per device
and pipeline bubble, one row per run, from a run table whose columns are named as
Megatron-LM's arguments.

Required columns: num_layers, hidden_size, num_attention_heads, seq_length,
vocab_size, tensor_model_parallel_size, pipeline_model_parallel_size,
data_parallel_size, global_batch_size; or, instead of the model's dimensions, a
model column naming a preset (deepseek-v3, llama3-70b, ...) or a model file (a Hugging
Face config.json or the folder holding it, relative to the table's folder), with
seq_length optional and mtp_num_layers the multi-token-prediction layers the run trains
(empty: the model's own). Optional:
name, num_query_groups, ffn_hidden_size, swiglu, untie_embeddings_and_output_weights,
normalization, position_embedding_type, add_bias_linear, hidden_dropout,
attention_dropout, kv_channels, add_qkv_bias, qk_layernorm, sandwich_norm, softmax_type,
gated_linear_unit, window_size, window_attn_skip_freq, chunked_attention, num_experts, moe_router_topk,
moe_ffn_hidden_size, moe_shared_expert_intermediate_size, moe_layer_freq,
moe_router_num_groups, moe_router_group_topk,
multi_latent_attention, q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim,
v_head_dim, mtp_num_layers, make_vocab_size_divisible_by (docs/models.md),
micro_batch_size, virtual_pipeline_model_parallel_size, recompute_granularity
(none|selective|full; with full, recompute_method uniform|block and
recompute_num_layers), recompute_modules (with selective, Megatron-Core's modules separated by
spaces: core_attn, mla_up_proj, layernorm, mlp, moe_act, moe, shared_experts; default
core_attn), sequence_parallel,
use_distributed_optimizer, zero_stage,
overlap_grad_reduce, overlap_param_gather, tp_comm_overlap,
async_tensor_model_parallel_allreduce, gradient_accumulation_fusion, grad_reduce_in_bf16, DDP_impl
(local|torch), dtype (bf16|fp16|fp8|fp32), schedule (1f1b|interleaved_1f1b|gpipe|zb_h1|dualpipe;
docs/pipeline-schedules.md), decoder_first_pipeline_num_layers,
decoder_last_pipeline_num_layers, account_for_embedding_in_pipeline_split,
account_for_loss_in_pipeline_split, pipeline_model_parallel_layout (uneven splits),
overlap_p2p_comm, scatter_gather_tensors_in_pipeline, batch_p2p_sync (pipeline transfers),
use_flash_attn, attention_backend, flash_attention_version (docs/kernels.md),
elementwise_kernels (fused|eager), selective_ac_option, cross_entropy_impl (megatron|torch;
docs/execution-model.md), context_parallel_size, cp_comm_type (p2p|all_gather|a2a|torch_allgather|torch_alltoall;
the last two PyTorch's context parallelism as torchtitan runs it; docs/execution-model.md),
expert_model_parallel_size, expert_tensor_parallel_size, moe_load_imbalance,
moe_expert_capacity_factor, moe_pad_expert_input_to_capacity,
moe_shared_expert_overlap, overlap_moe_expert_parallel_comm, moe_token_dispatcher_type
(alltoall|flex), moe_flex_dispatcher_backend (deepep|hybridep: the flex dispatcher's kernels),
moe_flex_dispatcher_num_sms (mixture-of-experts models; docs/moe.md), the MoE router's
moe_router_load_balancing_type (aux_loss|seq_aux_loss|global_aux_loss|none), moe_aux_loss_coeff,
moe_z_loss_coeff, moe_router_force_load_balancing, moe_router_score_function (softmax|sigmoid),
moe_router_enable_expert_bias, moe_router_topk_scaling_factor, moe_router_pre_softmax (these four
empty: the model's own router, written into the output as priced), moe_router_dtype (fp32),
moe_router_fusion and NeMo AutoModel's fake_balanced_gate (docs/moe.md),
fp8_recipe (with dtype fp8:
delayed|tensorwise|blockwise|mxfp8, Megatron-LM's --fp8-recipe; empty: delayed, its
default; torchao_tensorwise: torchao's Float8Linear as torchtitan runs it; docs/fp8.md),
use_precision_aware_optimizer, main_grads_dtype (fp32|bf16), main_params_dtype (fp32|fp16),
exp_avg_dtype and exp_avg_sq_dtype (fp32|fp16|bf16|fp8), activation_func_fp8_input_store
(Megatron-LM's low-precision storage; docs/fp8.md),
enable_fsdp_float8_all_gather, precompute_float8_dynamic_scale_for_fsdp (torchtitan's
--float8 options, with torchao_tensorwise), data_parallel_shard_degree,
data_parallel_replicate_degree, num_distributed_optimizer_instances,
fsdp_reshard_after_forward (default|always|never), data_parallel_sharding_strategy
(no_shard|optim|optim_grads|optim_grads_params; docs/fsdp.md), sharded_grad_reduce
(default|every_microbatch|last_microbatch; docs/fsdp.md), use_torch_fsdp2 (FSDP2's own copies, with
zero_stage 3), optimizer_impl (fused|foreach: torch.optim's foreach AdamW, with use_torch_fsdp2;
docs/fsdp.md), fsdp_param_dtype (fp32|bf16: the dtype of FSDP2's shards, with use_torch_fsdp2),
num_gpus,
measured_iteration_s (docs/execution-model.md says what each setting changes).
An empty micro_batch_size or virtual_pipeline_model_parallel_size means the
fastest that fits.

The output is the input plus num_parameters and active_parameters (per token: all
but the routed experts a token is not sent to), predicted_iteration_s, predicted_tflops_per_gpu,
predicted_mfu, predicted_peak_memory_bytes (the largest over pipeline ranks), peak_memory_rank
(the pipeline rank it is on), what that rank holds then, adding up to it:
predicted_peak_model_state_bytes, predicted_peak_working_bytes,
predicted_peak_gradient_accumulator_bytes, predicted_peak_activation_bytes
(docs/stages/predict.md), bubble_fraction, fits_memory, chosen (the settings the
predictor chose), calibration (the calibration it used) and plausibility (empty, or
why the predicted MFU is above the device's GEMM ceiling or above 65%, more than any
published full training step; such runs are also named in a warning). With a
measured_iteration_s column the errors are printed and logged. With --explain,
explain_gemm_s, explain_attention_s, explain_straggler_s, explain_memory_s, explain_tp_comm_s,
explain_cp_comm_s, explain_ep_comm_s,
explain_dp_comm_s, explain_pp_comm_s, explain_bubble_s, explain_imbalance_s (the wait
for pipeline ranks with more work), explain_optimizer_s and explain_host_s split each
run's predicted_iteration_s (docs/execution-model.md).

examples:
  paraplan predict config/runs/llm_a100.csv --cluster dgx-a100 -o predicted.csv
  paraplan predict config/runs/llm_h100.csv --cluster dgx-h100 -o out/predicted.csv --explain
  paraplan predict my_runs.csv --cluster dgx-h100 --calibration my-h100.json -o out.csv
"""

from __future__ import annotations

import argparse
import sys
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from paraplan.cli._paths import output_path
from paraplan.cli.common import add_tracking_arguments, notes_tags, track
from paraplan.core import ParaplanError

NAME = "predict"
HELP = "predict iteration time, throughput, MFU and memory of LLM training runs (a run table)"
ORDER = 55


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, help="run table (CSV), one training run per row")
    parser.add_argument("--cluster", required=True,
                        help="cluster name in config/clusters (e.g. dgx-a100, dgx-h100) or a YAML file")
    parser.add_argument("--calibration", default=None,
                        help="calibration name or file from `paraplan calibrate` (default: the shipped one made "
                             "for the cluster's device, else a100-vtrain with a warning)")
    parser.add_argument("-o", "--output", required=True, type=output_path, help="output CSV")
    parser.add_argument("--plots", type=Path, default=None,
                        help="folder for the figures: each run's predicted iteration time and MFU, predicted vs "
                        "measured (with a measured_iteration_s column) and, with --explain, the time breakdown "
                        "(default for that one: the output's folder)")
    parser.add_argument("--explain", action="store_true",
                        help="add explain_*_s columns (where each run's iteration time goes: GEMM, attention, "
                        "memory-bound kernels, exposed TP / DP / PP communication, bubble, load imbalance between "
                        "pipeline ranks, optimizer, host; they sum to predicted_iteration_s) and a stacked-bar "
                        "figure <runs>_explain.png/.pdf")
    add_tracking_arguments(parser)


def _format(value: float) -> str:
    return f"{value:.6g}"


def explain_cells(seconds: dict[str, float], iteration_s: float) -> dict[str, str]:
    """The explain_*_s cells; a part that is a difference of sums (the bubble) and
    within rounding of zero (1e-9 of the iteration) is written 0, not -1.24345e-14."""
    return {f"explain_{k}_s": _format(0.0 if abs(v) <= 1e-9 * iteration_s else v) for k, v in seconds.items()}


def searched_settings(row) -> set[str]:
    """The columns a row's prediction may fill in: the sizes it leaves to the predictor
    and, with a searched virtual pipeline size and no split of its own, Megatron's
    uneven first/last stages (`predictor.UNEVEN_SPLIT_COLUMNS`), and the router
    settings a MoE row takes from its model (`model_router_cells`)."""
    from paraplan.predict.predictor import UNEVEN_SPLIT_COLUMNS

    out = {"micro_batch_size"} if row.search_micro_batch_size else set()
    out.update(model_router_cells(row))
    if row.search_virtual_stages:
        out.add("virtual_pipeline_model_parallel_size")
        if not row.settings.explicit_pipeline_split:
            out.update(UNEVEN_SPLIT_COLUMNS)
    return out


def model_router_cells(row) -> dict[str, str]:
    """The router cells a MoE row left empty (docs/moe.md "The model's own router"),
    filled with the values priced, as run-table text (`sigmoid`, `true`, `2.5`): the
    model's own, or Megatron-Core's default where a stated cell drops the model's (a
    stated softmax: no expert bias). Empty for a dense row or with NeMo AutoModel's
    fake_balanced_gate, which replaces the router."""
    from paraplan.core.moe_router_model import MODEL_ROUTER_FIELDS

    if not row.model.is_moe or row.settings.fake_balanced_gate:
        return {}
    return {k: _router_text(getattr(row.settings, k)) for k in MODEL_ROUTER_FIELDS if not row.cells.get(k, "").strip()}


def _router_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def output_columns(header: list[str], searched: set[str], explain: bool = False) -> list[str]:
    """The input's columns, the searched settings the input lacks (`searched`: what
    some row's prediction may fill in, `searched_settings`), the predictions, then
    with `explain` the time breakdown."""
    from paraplan.core.moe_router_model import MODEL_ROUTER_FIELDS
    from paraplan.predict.explain import EXPLAIN_COLUMNS
    from paraplan.predict.peak_memory import RETIRED_COLUMNS
    from paraplan.predict.predictor import UNEVEN_SPLIT_COLUMNS
    from paraplan.predict.runtable import PLAN_ONLY_COLUMNS, PREDICTED

    columns = [c for c in header if c not in PREDICTED and c not in RETIRED_COLUMNS and c not in PLAN_ONLY_COLUMNS]
    for extra in ("micro_batch_size", "virtual_pipeline_model_parallel_size", *UNEVEN_SPLIT_COLUMNS,
                  *MODEL_ROUTER_FIELDS):
        if extra not in columns and extra in searched:
            columns.append(extra)
    columns += list(PREDICTED)
    if explain:
        columns += list(EXPLAIN_COLUMNS)
    return columns


def output_cells(columns: list[str], row, pred, calibration_label: str, flag: str = "",
                 breakdown=None) -> dict[str, str]:
    """One output row: the row as read, the settings the predictor chose, the
    predictions, the plausibility `flag` and, with a `breakdown`, its explain columns."""
    from paraplan.predict.runtable import PREDICTED

    cells = {c: row.cells.get(c, "") for c in columns if c not in PREDICTED}
    for name in pred.chosen:
        cells[name] = str(getattr(pred.settings, name))
    cells.update((k, v) for k, v in model_router_cells(row).items() if k in cells)
    cells.update({
        "num_parameters": str(row.model.num_parameters),
        "active_parameters": str(row.model.active_parameters),
        "predicted_iteration_s": _format(pred.iteration_s),
        "predicted_tflops_per_gpu": _format(pred.tflops_per_gpu),
        "predicted_mfu": _format(pred.mfu),
        "predicted_peak_memory_bytes": f"{pred.peak_memory_bytes:.0f}",
        **pred.peak_memory.cells(),
        "bubble_fraction": _format(pred.bubble_fraction),
        "fits_memory": "true" if pred.fits_memory else "false",
        "chosen": ";".join(f"{c}={getattr(pred.settings, c)}" for c in pred.chosen),
        "calibration": calibration_label,
        "plausibility": flag,
    })
    if breakdown is not None:
        cells.update(explain_cells(breakdown.seconds, pred.iteration_s))
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


@dataclass
class _Figures:
    """What the per-run figures (--plots, --explain) need of every row: its name and
    a few numbers, kept only when a figure is asked for (one bar per run)."""

    names: list[str] = field(default_factory=list)
    iteration_s: array = field(default_factory=lambda: array("d"))
    mfu: array = field(default_factory=lambda: array("d"))
    fits_memory: list[bool] = field(default_factory=list)
    parts_s: array = field(default_factory=lambda: array("d"))  # len(PARTS) per run, with --explain

    def add(self, row, pred, breakdown) -> None:
        self.names.append(row.name)
        self.iteration_s.append(pred.iteration_s)
        self.mfu.append(pred.mfu)
        self.fits_memory.append(pred.fits_memory)
        if breakdown is not None:
            from paraplan.predict.explain import PARTS

            self.parts_s.extend(breakdown.seconds[k] for k in PARTS)


_UNFIT_NAMED = 5  # runs that do not fit named in the summary line


def largest_memory_part(peak) -> str:
    """The largest of a `PeakMemory`'s four parts, for the summary line of a run that
    does not fit: "activations 75.2 GB" (1e9 bytes; the first of equal parts)."""
    parts = {"model state": peak.model_state_bytes, "working buffers": peak.working_bytes,
             "gradient accumulators": peak.gradient_accumulator_bytes, "activations": peak.activation_bytes}
    name = max(parts, key=lambda k: parts[k])
    return f"{name} {parts[name] / 1e9:.1f} GB"


@dataclass
class _Written:
    """What writing the rows counted: rows, rows not fitting, implausible rows, and
    the optional columns some prediction filled in."""

    rows: int = 0
    unfit: int = 0
    implausible: int = 0
    unfit_named: list[str] = field(default_factory=list)  # the first few: line, name, peak
    used: set[str] = field(default_factory=set)


def other_calibration_warning(table: str, recorded: list[str], used: str) -> str | None:
    """One warning when `table`'s `calibration` column (a `paraplan plan` CSV's: the
    label, name@digest, its plans were priced with) names calibrations other than the
    one this prediction `used`: the re-priced figures differ from the plan's for that
    reason alone. It says how to re-price with the plan's: by name when a calibration
    of that name and digest is found (`paraplan.config_files`), else by its file."""
    others = list(dict.fromkeys(label.strip() for label in recorded if label.strip() and label.strip() != used))
    if not others:
        return None
    first = others[0]
    name = first.rpartition("@")[0] or first
    option = f"--calibration <file> (the file of calibration '{name}' that `paraplan calibrate` wrote)"
    try:
        from paraplan.predict.calibration import load_calibration

        if load_calibration(name).label == first:
            option = f"--calibration {name}"
    except ParaplanError:  # not found by name, or not readable: the user knows the file
        pass
    more = f" (and {len(others) - 1} other(s): {', '.join(others[1:3])}{' ...' if len(others) > 3 else ''})" \
        if len(others) > 1 else ""
    return (f"{table}: its calibration column says its rows were priced with {first}{more}; this prediction uses "
            f"{used}, so its figures may differ from the table's; to re-price with the table's, "
            f"give {option}")


def _copy_columns(body, handle, columns: list[str], keep: list[str]) -> None:
    """Rows written without a header in `columns` order, rewritten to `handle` with a
    header of `keep` (a subsequence), one row in memory at a time."""
    import csv

    writer = csv.DictWriter(handle, fieldnames=keep, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for cells in csv.DictReader(body, fieldnames=columns, strict=True):
        writer.writerow(cells)


@dataclass
class _Survey:
    """What the first pass over a run table finds: the settings a prediction may choose (their
    output columns), and the notes and warnings to print before the predictions (`before`) and
    with their results (`after`), each without the `paraplan predict: ` prefix."""

    searched: set[str] = field(default_factory=set)
    before: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)


def _lines_text(lines: list[str]) -> str:
    return ", ".join(lines[:10]) + (" ..." if len(lines) > 10 else "")


def _survey(table: str, rows, cluster, calibration_label: str) -> _Survey:
    """The first pass: every row read and checked (a bad row fails before any prediction)."""
    from paraplan.core.run_settings import DEFAULT_FP8_RECIPE
    from paraplan.core.transformer_blocks import attention_head_widths
    from paraplan.kernels.attention_backends import unmeasured_head_width
    from paraplan.predict.device_notes import device_notes
    from paraplan.predict.moe_deepep import HYBRIDEP_MAX_MEASURED_SMS, hybridep_sms_above_measured

    survey = _Survey()
    default_fp8: list[str] = []
    hybridep_over: list[str] = []  # HybridEP at more SMs than published: priced at the largest published
    recorded: list[str] = []  # the table's own calibration column (a plan's, as it was priced)
    widths: dict[str, str] = {}  # model name: the note on its attention head width, once each
    most_gpus = 0  # the largest job: the note on an unmeasured GPU-to-GPU spread speaks of it
    for row in rows:
        most_gpus = max(most_gpus, row.settings.num_gpus)
        if row.model.name not in widths:
            widths[row.model.name] = unmeasured_head_width(cluster.device.compute_name,
                                                           attention_head_widths(row.model)[0])
        survey.searched |= searched_settings(row)
        recorded.append(row.cells.get("calibration", ""))
        if row.settings.dtype == "fp8" and not row.settings.fp8_recipe:
            default_fp8.append(str(row.line))
        if hybridep_sms_above_measured(row.settings):
            hybridep_over.append(str(row.line))
    survey.before += [f"note: {table}: model {name}: {width}" for name, width in widths.items() if width]
    other = other_calibration_warning(table, recorded, calibration_label)
    if other:
        survey.before.append(f"warning: {other}")
    if default_fp8:
        survey.before.append(f"note: {table}: line(s) {_lines_text(default_fp8)}: dtype fp8 with an empty fp8_recipe "
                             f"runs Megatron-LM's default recipe, {DEFAULT_FP8_RECIPE} (docs/fp8.md)")
    if hybridep_over:
        survey.before.append(f"note: {table}: line(s) {_lines_text(hybridep_over)}: HybridEP with "
                             f"moe_flex_dispatcher_num_sms above {HYBRIDEP_MAX_MEASURED_SMS} is priced at "
                             f"{HYBRIDEP_MAX_MEASURED_SMS} SMs' published bandwidths, the most it was measured with "
                             "(docs/moe.md)")
    survey.after += [f"note: {note}" for note in device_notes(cluster, most_gpus)]
    return survey


def run(args: argparse.Namespace) -> int:
    import csv
    import tempfile

    import numpy as np

    from paraplan.clusters import load_cluster
    from paraplan.core import StrategyError
    from paraplan.core.errors import InputFileError
    from paraplan.files import atomic_open
    from paraplan.predict.calibrate import ErrorSummary
    from paraplan.predict.calibration import calibration_for
    from paraplan.predict.predictor import UNEVEN_SPLIT_COLUMNS, RunRowError, iter_predictions, plausibility
    from paraplan.predict.runtable import iter_run_table, model_cache

    cluster = load_cluster(args.cluster)
    calibration = calibration_for(cluster, args.calibration,
                                  warn=lambda m: print(f"paraplan predict: warning: {m}", file=sys.stderr))
    if args.calibration is not None and calibration.device != cluster.device.compute_name:  # else calibration_for did
        print(f"paraplan predict: note: calibration '{calibration.name}' was fitted on {calibration.device}; "
              f"{cluster.device.name} gets its efficiencies as fractions of its own datasheet peaks",
              file=sys.stderr)
    # two passes over the table, one row in memory at a time: the first checks every
    # row (a bad row fails before any prediction) and finds the columns the output may
    # need, the second predicts in chunks and writes each row as it comes (into a
    # temporary file renamed onto -o at the end, so a failure leaves no half-written
    # output)
    models = model_cache()  # a model file's warnings once, not once per pass
    header, rows = iter_run_table(args.runs, models)
    survey = _survey(str(args.runs), rows, cluster, calibration.label)
    for line in survey.before:
        print(f"paraplan predict: {line}", file=sys.stderr)
    columns = output_columns(header, survey.searched, args.explain)
    # the uneven-split columns appear only when some prediction chose such a split,
    # which only the prediction tells: with any row that may, the rows go to a scratch
    # file first and are copied into the output without the columns none filled in
    optional = [c for c in UNEVEN_SPLIT_COLUMNS if c in columns and c not in header]
    comm = calibration.comm_model(cluster)
    measured = _Measured()
    figures = _Figures() if args.plots is not None or args.explain else None
    written = _Written()

    def write_rows(handle) -> None:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
        if not optional:
            writer.writeheader()
        _, rows = iter_run_table(args.runs, models)
        try:
            for row, pred in iter_predictions(rows, cluster, comm, calibration.efficiency):
                breakdown = None
                if args.explain:
                    from paraplan.predict.explain import explain_run

                    breakdown = explain_run(row.model, pred.settings, cluster, comm, calibration.efficiency)
                flag = plausibility(pred.mfu, calibration.efficiency)
                writer.writerow(output_cells(columns, row, pred, calibration.label, flag, breakdown))
                if flag:
                    print(f"paraplan predict: warning: {args.runs}:{row.line} ({row.name}): {flag}; outside "
                          "anything published, check the calibration and the settings", file=sys.stderr)
                written.rows += 1
                written.unfit += not pred.fits_memory
                if not pred.fits_memory and len(written.unfit_named) < _UNFIT_NAMED:
                    written.unfit_named.append(f"line {row.line} '{row.name}' {pred.peak_memory_bytes / 1e9:.1f} GB, "
                                               f"largest part {largest_memory_part(pred.peak_memory)}")
                written.implausible += bool(flag)
                written.used.update(pred.chosen)
                if row.measured_iteration_s is not None:
                    measured.add(row, pred)
                if figures is not None:
                    figures.add(row, pred, breakdown)
        except RunRowError as exc:
            what = f"impossible run ({exc.name})" if exc.name else "impossible run"
            raise InputFileError(args.runs, f"{what}: {exc.reason}", line=exc.line) from None
        except StrategyError as exc:
            raise StrategyError(f"{args.runs}: {exc}") from None

    started = time.perf_counter()
    with atomic_open(args.output, "w") as handle:
        if optional:
            with tempfile.TemporaryFile("w+", newline="", encoding="utf-8") as body:
                write_rows(body)
                body.seek(0)
                _copy_columns(body, handle, columns, [c for c in columns if c not in optional or c in written.used])
        else:
            write_rows(handle)
    seconds = time.perf_counter() - started
    unfit = written.unfit
    print(f"paraplan predict: {written.rows} run(s) in {seconds:.2f} s with {calibration.label} -> {args.output}"
          + (f"; {unfit} {'does' if unfit == 1 else 'do'} not fit in {cluster.device.capacity_text()} ("
             + "; ".join(written.unfit_named) + ("; ..." if unfit > _UNFIT_NAMED else "") + ")" if unfit else ""),
          file=sys.stderr)
    for line in survey.after:
        print(f"paraplan predict: {line}", file=sys.stderr)
    metrics: dict[str, float] = {"runs": float(written.rows), "predict_s": seconds, "not_fitting": float(unfit),
                                 "implausible": float(written.implausible)}
    artifacts = [args.output]
    if args.explain and figures is not None:
        from paraplan.plots.predict import plot_time_breakdown
        from paraplan.predict.explain import PARTS

        artifacts += plot_time_breakdown(
            figures.names, np.asarray(figures.parts_s).reshape(-1, len(PARTS)), PARTS,
            (args.plots or args.output.parent) / f"{args.runs.stem}_explain",
            f"where the iteration time goes\n{args.runs.name} on {cluster.device.name} with {calibration.label}")
    if measured.measured_s:
        from paraplan.predict.ranking import ranking_summary

        m, p = np.asarray(measured.measured_s), np.asarray(measured.predicted_s)
        errors = ErrorSummary.of(p, m)
        ranking = ranking_summary(np.asarray(measured.question), p, m)
        metrics.update({f"{k}": float(v) for k, v in errors.as_dict().items() if k != "n" and v is not None})
        if ranking.groups:
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
    if args.plots is not None and figures is not None:
        from paraplan.plots.predict import plot_predicted_runs

        artifacts += plot_predicted_runs(
            figures.names, np.asarray(figures.iteration_s), np.asarray(figures.mfu), figures.fits_memory,
            args.plots / f"{args.runs.stem}_predicted", f"{args.runs.name} on {cluster.device.name} with "
            f"{calibration.label}")
    from paraplan.track import RunLog

    track(args, RunLog(
        stage="predict", run_name=f"{args.runs.name}@{cluster.name}",
        params={"runs": str(args.runs), "cluster": cluster.name, "calibration": calibration.label},
        metrics=metrics, artifacts=artifacts, tags=notes_tags([*survey.before, *survey.after]),
    ))
    return 0
