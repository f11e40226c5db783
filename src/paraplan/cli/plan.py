"""Plan how to train a model on a cluster.

A transformer (--model: a preset such as gpt3-175b or llama3-70b, a Hugging Face
config.json or a model YAML) on --gpus GPUs of a cluster at one --global-batch-size:
one search over tensor, pipeline and data parallelism, micro-batch size,
interleaving, schedule (1f1b, interleaved_1f1b, zb_h1, gpipe), recomputation,
sequence parallelism and ZeRO stage / distributed optimizer (and for
mixture-of-experts models such as mixtral-8x7b expert and expert-tensor
parallelism), every plan fitting device memory and re-timed by the simulator; then
DualPipe and the overlaps tp_comm_overlap (Hopper and newer), overlap_moe_expert_parallel_comm
and moe_shared_expert_overlap tried on the best plans where they can run, and on those that
recompute every layer, recompute_method block (the first N layers of each chunk); the data-parallel
baselines are candidates of the same search. Writes one row per plan kept, best first, in
`paraplan predict`'s column names (+ the baselines' iteration times and search_s).

A layer profile (--profile, e.g. PipeDream's CNNs) for one or many global batch
sizes: DAPPLE-style hybrid pipeline x data parallelism with per-stage replication,
beside the data-parallel baselines (no overlap, normal overlap, P3; gradient
accumulation where memory requires), re-timed with the simulator.

Writes a CSV (gbs, dp_no_overlap, dp_p3, dp_overlap, best_hybrid, stages,
planning_time_s, and the planner's estimates *_est); speedups are over one device.
A planning study (--study, config/studies/plan/<name>.yaml) holds the same settings
as the options below (options given beside it override its values); with a study,
or several --shapes, -o is a folder of <name>__<shape>.csv.

Examples:
  paraplan plan --model gpt3-175b --cluster dgx-a100 --gpus 1024 --global-batch-size 1536 -o plans.csv
  paraplan plan --model llama3-70b --cluster dgx-h100 --gpus 1024 --global-batch-size 1024 --top-k 10 -o p.csv
  paraplan plan --model qwen3-30b-a3b --seq-length 32768 --cluster dgx-h100 --gpus 64 --global-batch-size 256 -o q.csv
  paraplan plan --profile data/pipedream-profiles/vgg-19-pbs-32.txt \\
      --cluster dgx1-v100 --shapes 2x8 --global-batch-sizes 32,64,128 -o vgg.csv
  paraplan plan --profile results/profiles/mlp.csv --cluster local-cpu \\
      --comm-model results/fits/local-cpu/comm_model.json --global-batch-sizes 8,16,32 -o mlp.csv  # after the workflow
  paraplan plan --study dapple_resnet50 -o results/plans/dapple_resnet50
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from paraplan.cli.common import (
    add_output_argument,
    add_tracking_arguments,
    deprecated,
    warn_deprecated,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from paraplan.core.transformer import TransformerModel
    from paraplan.predict.predictor import RunPrediction

NAME = "plan"
HELP = "the best parallel strategy: transformers over TP/PP/DP/micro-batch/v/schedule/recompute/ZeRO, or DAPPLE-style"
ORDER = 50
REQUEST = "request_"  # argparse destination prefix of PlanRequest's fields
_GROUPS = {
    "what to plan": ("profile", "profile_batch_size"),
    "cluster and communication": ("shapes",),
    "batch sizes": ("global_batch_sizes", "min_micro_batch_size"),
    "memory per device": ("memory_GB", "model_state_factor", "peak_activation_bytes_per_sample"),
    "search": ("max_pipeline_devices", "candidates"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from paraplan.plan.hybrid.request import PlanRequest
    from paraplan.typed import add_options, field_docs

    groups = {title: parser.add_argument_group(title) for title in _GROUPS}
    metavars = {"profile": "FILE", "shapes": "NxG[,NxG]", "global_batch_sizes": "LIST|A:B:S"}
    for title, names in _GROUPS.items():
        add_options(groups[title], PlanRequest, REQUEST, only=names, metavars=metavars)
    groups["what to plan"].add_argument(
        "--study", default=None, metavar="NAME|FILE",
        help="a planning study (dapple_resnet50, or a YAML file) holding these settings; -o is then a folder")
    deprecated(groups["what to plan"], "--experiment", "--study", "study")
    hw = groups["cluster and communication"]
    hw.add_argument("--cluster", dest=REQUEST + "cluster", default=argparse.SUPPRESS, action=_ClusterOrOldShape,
                    metavar="NAME|FILE",
                    help=field_docs(PlanRequest)["cluster"] + " (a layer profile's default: dgx1-v100; required with "
                    "--model)")
    deprecated(hw, "--cluster-file", "--cluster", REQUEST + "cluster")
    deprecated(hw, "--shape", "--shapes", REQUEST + "shapes")
    hw.add_argument("--comm-model", type=Path, default=None,
                    help="fitted comm_model.json (paraplan fit); default: DAPPLE's formulas at the cluster "
                         "file's link bandwidths (dgx1-v100: 25 GB/s inside, 3 GB/s across)")
    groups["search"].add_argument("--jobs", type=int, default=0,
                                  help="processes for the batch-size sweep (0: all cores)")
    llm = parser.add_argument_group("transformer (--model)")
    from paraplan.predict.models import PRESETS

    llm.add_argument("--model", default=None, metavar="NAME|FILE",
                     help=f"a preset ({', '.join(PRESETS)}), a Hugging Face config.json (or the model folder "
                          "holding it) or a model YAML (docs/models.md)")
    llm.add_argument("--gpus", type=int, default=None, help="GPUs to plan for (the cluster's node type, any count)")
    llm.add_argument("--global-batch-size", type=int, default=None, help="sequences per iteration")
    llm.add_argument("--seq-length", type=int, default=None, help="tokens per sequence (default: a preset's "
                     "pre-training length, 2,048-8,192; a config.json's max_position_embeddings, said in a warning)")
    llm.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp8", "fp32"), help="training precision")
    llm.add_argument("--fp8-recipe", default="", choices=("delayed", "tensorwise", "blockwise", "mxfp8"),
                     help="with --dtype fp8: Megatron-LM's --fp8-recipe (default: its default, delayed; docs/fp8.md)")
    llm.add_argument("--calibration", default=None,
                     help="calibration name or file from `paraplan calibrate` (default: the shipped one made for the "
                             "cluster's device, else a100-vtrain with a warning)")
    llm.add_argument("--top-k", type=int, default=5, help="plans to keep, best first")
    llm.add_argument("--allow-cross-node-tp", action="store_true",
                     help="let tensor-parallel groups span nodes (default: at most one node)")
    llm.add_argument("--context-parallel-sizes", default=None, metavar="C[,C...]",
                     help="context_parallel_size values to search, e.g. 1 (no context parallelism) or 1,2,4,8 "
                          "(default: 1, and for sequences of 16,384 tokens or more every power of two dividing "
                          "--gpus)")
    # z6-plansearch: what the post-pass may try (`paraplan.plan.transformer.variants`, docs/stages/plan.md)
    llm.add_argument("--schedules", default=None, metavar="S[,S...]",
                     help="pipeline schedules to search among 1f1b, interleaved_1f1b, zb_h1, gpipe, dualpipe "
                          "(default: all; dualpipe needs 1f1b beside it and a framework that runs DeepSeek's "
                          "DualPipe, which Megatron-LM does not)")
    llm.add_argument("--moe-token-dispatcher-type", default=None, choices=("alltoall", "flex"),
                     help="a mixture-of-experts model's token dispatcher (default alltoall: NCCL's all-to-alls); flex "
                          "runs DeepEP's or HybridEP's kernels, searched only at the expert layouts they were measured "
                          "at (docs/moe.md)")
    llm.add_argument("--moe-flex-dispatcher-backend", default=None, choices=("deepep", "hybridep"),
                     help="with --moe-token-dispatcher-type flex: DeepEP's kernels (default) or HybridEP's")
    llm.add_argument("--no-overlap-flags", action="store_true",
                     help="do not try tp_comm_overlap, overlap_moe_expert_parallel_comm and "
                          "moe_shared_expert_overlap on the best plans (e.g. for Megatron-LM's --deterministic-mode, "
                          "which forbids tp_comm_overlap)")
    add_output_argument(parser, "plan CSV (with --study or several --shapes: a folder of <name>__<shape>.csv)")
    parser.add_argument("--plots", type=Path, default=None, metavar="DIR",
                        help="folder for the speedup figure (PNG + PDF), named after the CSV")
    add_tracking_arguments(parser)


_SHAPE = re.compile(r"^\d+x\d+$")


class _ClusterOrOldShape(argparse.Action):
    """`--cluster NAME`; the 0.1 `--cluster NxG` (a shape, before --shapes existed) still
    sets the shape, with a warning."""

    def __call__(self, parser, namespace, values, option_string=None):
        if _SHAPE.match(values):
            warn_deprecated(parser.prog, f"--cluster {values}", f"--shapes {values}")
            setattr(namespace, REQUEST + "shapes", values)
        else:
            setattr(namespace, self.dest, values)


def _load_profile(path: Path, profile_batch_size: int | None):
    if path.suffix == ".txt":
        from paraplan.profile.pipedream import read_pipedream

        return read_pipedream(path, profile_batch_size)
    from paraplan.profile.io import read_profile

    return read_profile(path, profile_batch_size)


def _comm(comm_path: Path | None, cluster):
    if comm_path is not None:
        from paraplan.comm.model import FittedCommModel

        return FittedCommModel.from_json(comm_path)
    from paraplan.plan.hybrid.comm_constants import DappleConstantsModel

    return DappleConstantsModel(cluster.intra.bandwidth_Bps, cluster.inter.bandwidth_Bps)


def _request(args: argparse.Namespace):
    """The plan request: the study's settings (if any) with the options given here on top."""
    from paraplan.cli.common import study_path
    from paraplan.plan.hybrid.request import PlanRequest
    from paraplan.studies.plan import PlanStudy, with_study_paths
    from paraplan.typed import Source, given, load, read_yaml, upgrade_keys

    options = given(PlanRequest, args, REQUEST)
    if args.study is None:
        return load(PlanRequest, options, Source.command_line()), None
    path = study_path("plan", args.study)
    in_file = Source.file(path)
    raw = read_yaml(path, "a planning study (config/studies/plan/*.yaml)")
    if not isinstance(raw, dict):
        from paraplan.typed.convert import not_a_mapping

        raise in_file.error((), not_a_mapping(raw))
    merged = {**upgrade_keys(PlanStudy, raw, in_file, ()), **options}
    study = load(PlanStudy, merged, Source("file", str(path), frozenset(options)))
    return with_study_paths(study, path, frozenset(options)), path


def _refuse_unused(args: argparse.Namespace, model: bool) -> None:
    """An option the chosen planner does not read is an error, not ignored (y1-hostile:
    `--model` with `--memory-gb nan` planned as if it were absent)."""
    from paraplan.core import ConfigError

    if model:
        unused = [f"--{name.replace('_', '-').lower()}" for names in _GROUPS.values() for name in names
                  if hasattr(args, REQUEST + name)]
        unused += [flag for flag, value in (("--comm-model", args.comm_model), ("--plots", args.plots),
                                            ("--jobs", args.jobs or None))  # q4-hostile: --jobs -1 was ignored
                   if value is not None]
        if unused:
            raise ConfigError(unused[0], "is for a layer profile (--profile or --study), not --model (a "
                              "transformer's memory comes from the cluster file, its communication from the "
                              "calibration)")
        return
    unused = [flag for flag, given_ in (
        ("--gpus", args.gpus is not None), ("--global-batch-size", args.global_batch_size is not None),
        ("--seq-length", args.seq_length is not None), ("--fp8-recipe", bool(args.fp8_recipe)),
        ("--calibration", args.calibration is not None), ("--allow-cross-node-tp", args.allow_cross_node_tp),
        ("--context-parallel-sizes", args.context_parallel_sizes is not None),
        ("--schedules", args.schedules is not None), ("--no-overlap-flags", args.no_overlap_flags),
        ("--moe-token-dispatcher-type", args.moe_token_dispatcher_type is not None),
        ("--moe-flex-dispatcher-backend", args.moe_flex_dispatcher_backend is not None)) if given_]
    if unused:
        raise ConfigError(unused[0], "is for a transformer (--model), not a layer profile")


def _check(args: argparse.Namespace) -> None:
    from paraplan.core import ConfigError

    if args.jobs < 0:
        raise ConfigError("--jobs", f"must be >= 0, got {args.jobs}")


def _run_one(args, settings, sizes, csv_path: Path, plots: Path | None, title: str):
    import pandas as pd

    from paraplan.files import write_csv
    from paraplan.plan.hybrid.sweep import COLUMNS, plan_sweep, slower_than_one_device
    from paraplan.progress import bar

    start = time.perf_counter()
    with bar(len(sizes), f"plan {csv_path.stem}", "gbs") as progress:
        rows = plan_sweep(settings, sizes, args.jobs, on_done=progress.update)
    wall = time.perf_counter() - start
    if all(r.infeasible for r in rows):
        from paraplan.plan.hybrid.search import NoFeasiblePlanError

        raise NoFeasiblePlanError(rows[0].infeasible + " (at every batch size asked for)")
    for r in rows:
        if r.infeasible:
            print(f"paraplan plan: gbs {r.gbs}: {r.infeasible}", file=sys.stderr)
    frame = pd.DataFrame([r.as_record() for r in rows], columns=list(COLUMNS))
    write_csv(csv_path, frame)
    figures = []
    if plots is not None:
        from paraplan.plots.plan import plot_plan_speedups

        figures = plot_plan_speedups([r.as_record() for r in rows], title, plots / csv_path.stem,
                                     settings.cluster.num_devices)
    for r in rows:
        diff = r.hybrid_est_vs_sim
        print(f"gbs {r.gbs:>5}: DP {r.dp_no_overlap:6.2f} | DP+overlap {r.dp_overlap:6.2f} | "
              f"P3 {r.dp_p3:6.2f} (est {r.dp_p3_est:6.2f}) | "
              f"hybrid {r.best_hybrid:6.2f} (est {r.best_hybrid_est:6.2f}, "
              f"{diff:+.1%}) {r.stages}", file=sys.stderr)
    for r in rows:
        slower = slower_than_one_device(r, settings.profile.batch_size)
        if slower:
            print(f"paraplan plan: warning: {slower}", file=sys.stderr)
    print(f"paraplan plan: {len(rows)} batch sizes in {wall:.2f} s -> {csv_path}", file=sys.stderr)
    return rows, wall, figures


def _runlog(args, rows, wall, csv_path, figures, params):
    """One run per planned layout: the batch sizes' plans (the CSV's rows) as a table
    whose numeric columns are logged with step = the row's index."""
    from paraplan.plan.hybrid.sweep import COLUMNS
    from paraplan.track import RunLog, Table

    numeric = [c for c in COLUMNS if c != "stages"]
    table = Table(rows=[{**r.as_record(), "hybrid_est_vs_sim": r.hybrid_est_vs_sim,
                         "num_microbatches": r.num_microbatches, "accumulation_steps": r.accumulation_steps}
                        for r in rows],
                  metrics=[*numeric, "hybrid_est_vs_sim"])
    metrics = {"sweep_wall_s": wall, "total_planning_time_s": sum(r.planning_time_s for r in rows)}
    return RunLog(stage="plan", run_name=csv_path.stem, params=params, metrics=metrics,
                  artifacts=[csv_path, *figures], table=table)


def _search_space(args: argparse.Namespace, cp_sizes: tuple[int, ...]):
    """The transformer planner's search space from --allow-cross-node-tp,
    --context-parallel-sizes, --schedules and --no-overlap-flags."""
    from paraplan.core import ConfigError
    from paraplan.plan.transformer.space import POST_PASS_SCHEDULES, SCHEDULES, SearchSpace

    known = (*SCHEDULES, *POST_PASS_SCHEDULES)
    schedules = known if args.schedules is None else tuple(x.strip() for x in args.schedules.split(","))
    bad = [x for x in schedules if x not in known]
    if bad or not schedules:
        raise ConfigError("--schedules", f"expected schedules among {', '.join(known)} separated by commas, got "
                          f"{args.schedules!r}")
    if "dualpipe" in schedules and "1f1b" not in schedules:
        raise ConfigError("--schedules", "dualpipe needs 1f1b beside it (DualPipe is tried on the best 1F1B "
                          "candidates)")
    off = (False,) if args.no_overlap_flags else (False, True)
    return SearchSpace(allow_cross_node_tensor=args.allow_cross_node_tp, context_parallel_sizes=cp_sizes,
                       schedules=schedules, tp_comm_overlap=off, overlap_moe_expert_parallel_comm=off,
                       moe_shared_expert_overlap=off)


def _context_parallel_sizes(text: str | None) -> tuple[int, ...]:
    """--context-parallel-sizes as integers >= 1 (empty: the search's default)."""
    from paraplan.core import ConfigError

    if text is None:
        return ()
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise ConfigError("--context-parallel-sizes", f"expected integers >= 1 separated by commas, got {text!r}")
    return sizes


ATTENTION_MFU_NOTE = 1.5
"""Where the MFU with the attention FLOPs is this many times the 6 x parameters x tokens
one, the plan's summary says both (long sequences: at 128K tokens Llama 3.1 8B's
attention is most of its FLOPs, and an MFU of 12% sits beside 646 TFLOP/s per H100; at
8K tokens attention adds about 20%, and the line says the MFU alone)."""


def context_parallel_note(model: TransformerModel, cp_sizes: tuple[int, ...]) -> str:
    """Why a long sequence is planned without context parallelism, when the search
    would otherwise try it (`--context-parallel-sizes` not given, `MIN_CP_SEQ_LENGTH`
    tokens or more) but the model's attention is not priced for it; '' otherwise."""
    from paraplan.core.run_settings_checks import context_parallel_unpriced
    from paraplan.plan.transformer.space import MIN_CP_SEQ_LENGTH

    unpriced = context_parallel_unpriced(model)
    if cp_sizes or model.seq_length < MIN_CP_SEQ_LENGTH or not unpriced:
        return ""
    return (f"context parallelism is not searched: it is not priced for {model.name}'s {unpriced} "
            f"(docs/stages/plan.md), so its {model.seq_length:,}-token sequences are planned without it")


def mfu_text(model: TransformerModel, global_batch_size: int, mfu: float) -> str:
    """'MFU x%' as predict's column counts it (6 x active parameters x tokens), and
    beside it, where attention is a large share, the MFU counting the attention FLOPs
    (PaLM's convention; forward and backward, no recomputation)."""
    with_attention = mfu * (model.model_flops_per_iteration(global_batch_size, 0.0)
                            / model.mfu_flops_per_iteration(global_batch_size))
    if with_attention < ATTENTION_MFU_NOTE * mfu:
        return f"MFU {mfu:.1%}"
    return f"MFU {mfu:.1%} (6 x parameters x tokens; {with_attention:.1%} counting the attention FLOPs)"


def baseline_text(best_s: float, baselines: Mapping[str, RunPrediction | None]) -> str:
    """The answer's speedup over the fastest data-parallel baseline that fits memory
    (the search's own candidates: no overlap, overlap, ZeRO-1/2/3), or that none fits."""
    fitting = {name: b.iteration_s for name, b in baselines.items() if b is not None and b.fits_memory}
    if not fitting:
        return "no data-parallel baseline fits memory: the model needs the split"
    name = min(fitting, key=lambda n: fitting[n])
    return (f"speedup over the fastest data-parallel baseline ({name}, {fitting[name]:.3g} s): "
            f"{fitting[name] / best_s:.2f}x")


def baselines_run_text(baselines: Mapping[str, RunPrediction | None]) -> str:
    """What the data-parallel baselines that fit run (`search.baseline_settings`: every
    GPU data-parallel, micro-batch 1, full recomputation), said once above their times;
    '' when none fits. On one GPU a plan of the same layout at a larger micro-batch read
    as '4.34x over the fastest data-parallel baseline' without it."""
    fitting = [b.settings for b in baselines.values() if b is not None and b.fits_memory]
    if not fitting:
        return ""
    s = fitting[0]
    recompute = "no" if s.recompute_granularity == "none" else s.recompute_granularity
    return (f"data-parallel baselines (DP {s.data_parallel_size}, micro-batch {s.micro_batch_size}, {recompute} "
            "recomputation, each with its own overlap or ZeRO stage):")


def model_reference(spec: str, table: Path) -> str:
    """The `model` cell of a plan row written to `table`: a preset's name, else the
    model file's path relative to the table's folder, where `paraplan predict` looks for
    it (the model's name alone would be read as a preset, or as no model at all)."""
    from paraplan.predict.models import PRESETS

    if spec in PRESETS:
        return spec
    relative = os.path.relpath(Path(spec).resolve(), table.resolve().parent)
    return f"./{relative}" if relative in PRESETS else relative  # a bare preset name would read the preset


def _run_llm(args: argparse.Namespace) -> int:
    """The transformer planner (--model): search, write the ranked plans, track them."""
    import csv

    from paraplan.cli.common import notes_tags, track
    from paraplan.clusters import load_cluster
    from paraplan.core import ConfigError
    from paraplan.files import atomic_open, check_outputs
    from paraplan.plan.transformer.memory_text import peak_parts_text
    from paraplan.plan.transformer.output import PLAN_COLUMNS, describe, plan_rows
    from paraplan.plan.transformer.request import TransformerPlanRequest
    from paraplan.plan.transformer.search import search
    from paraplan.predict.calibration import calibration_for
    from paraplan.predict.models import load_model
    from paraplan.predict.peak_memory import PEAK_MEMORY_COLUMNS
    from paraplan.track import RunLog, Table

    for option, value in (("--gpus", args.gpus), ("--global-batch-size", args.global_batch_size)):
        if value is None:
            raise ConfigError(option, "needed with --model")
        if value < 1:
            raise ConfigError(option, f"must be >= 1, got {value}")
    if args.seq_length is not None and args.seq_length < 1:
        raise ConfigError("--seq-length", f"must be >= 1, got {args.seq_length}")
    if args.top_k < 1:
        raise ConfigError("--top-k", f"must be >= 1, got {args.top_k}")
    cp_sizes = _context_parallel_sizes(args.context_parallel_sizes)
    check_outputs([args.output])
    said: list[str] = []  # the notes and warnings printed, kept in the tracked run's description
    try:
        model = load_model(args.model, args.seq_length, prog="paraplan plan", said=said)
    except ConfigError as exc:
        if exc.key != "seq_length":
            raise
        raise exc.as_option("--seq-length") from None
    cluster_name = getattr(args, REQUEST + "cluster", None)
    if cluster_name is None:
        raise ConfigError("--cluster", "needed with --model (e.g. dgx-a100, dgx-h100)")
    cluster = load_cluster(cluster_name)
    calibration = calibration_for(cluster, args.calibration,
                                  warn=lambda m: print(f"paraplan plan: warning: {m}", file=sys.stderr))
    if args.fp8_recipe and args.dtype != "fp8":
        raise ConfigError("--fp8-recipe", f"applies to --dtype fp8 only, got --dtype {args.dtype}")
    if args.dtype == "fp8":
        from paraplan.core.run_settings import DEFAULT_FP8_RECIPE

        print(f"paraplan plan: FP8 recipe {args.fp8_recipe or DEFAULT_FP8_RECIPE}"
              + ("" if args.fp8_recipe else " (Megatron-LM's default; --fp8-recipe to choose)"), file=sys.stderr)
    dispatcher = args.moe_token_dispatcher_type or "alltoall"
    if args.moe_flex_dispatcher_backend is not None and dispatcher != "flex":
        raise ConfigError("--moe-flex-dispatcher-backend", "needs --moe-token-dispatcher-type flex")
    if dispatcher != "alltoall" and not model.is_moe:
        raise ConfigError("--moe-token-dispatcher-type", f"needs a mixture-of-experts model; '{model.name}' has no "
                          "experts")
    request = TransformerPlanRequest(model, cluster, args.gpus, args.global_batch_size, dtype=args.dtype,
                                     top_k=args.top_k, fp8_recipe=args.fp8_recipe,
                                     moe_token_dispatcher_type=dispatcher,  # type: ignore[arg-type]
                                     moe_flex_dispatcher_backend=args.moe_flex_dispatcher_backend or "deepep",
                                     space=_search_space(args, cp_sizes))
    print(f"paraplan plan: {model.name} on {args.gpus} x {cluster.device.name}, global batch "
          f"{args.global_batch_size} x {model.seq_length} tokens ...", file=sys.stderr)
    unsearched = context_parallel_note(model, cp_sizes)
    if unsearched:
        said.append(f"note: {unsearched}")
        print(f"paraplan plan: {said[-1]}", file=sys.stderr)
    from paraplan.core.transformer_blocks import attention_head_widths
    from paraplan.kernels.attention_backends import unmeasured_head_width

    width = unmeasured_head_width(cluster.device.compute_name, attention_head_widths(model)[0])
    if width:
        said.append(f"note: {model.name}: {width}")
        print(f"paraplan plan: {said[-1]}", file=sys.stderr)
    result = search(request, calibration.comm_model(cluster), calibration.efficiency,
                    progress=lambda m: print(f"paraplan plan: {m}", file=sys.stderr))
    rows = plan_rows(model, result, calibration.label, calibration.efficiency)
    for row in rows:  # what `paraplan predict` on this CSV reads the same model from
        row["model"] = model_reference(args.model, args.output)
    with atomic_open(args.output, "w") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(PLAN_COLUMNS), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    best = result.plans[0]
    print(f"paraplan plan: best: {describe(best)}: {best.iteration_s:.3g} s per iteration, "
          f"{best.tflops_per_gpu:.0f} TFLOP/s per GPU, {mfu_text(model, args.global_batch_size, best.mfu)}, "
          f"{best.peak_memory_bytes / 1e9:.1f} GB "
          f"per GPU ({result.candidates} candidates, {result.retimed} re-timed, {result.search_s:.2f} s)",
          file=sys.stderr)
    print(f"paraplan plan: best plan's peak memory: {peak_parts_text(best.peak_memory)}", file=sys.stderr)
    from paraplan.predict.device_notes import device_notes

    after = [f"note: {note}" for note in device_notes(cluster, args.gpus)]
    if rows[0]["plausibility"]:
        after.append(f"warning: the best plan's {rows[0]['plausibility']}; outside anything published, check the "
                     "calibration")
    for line in after:
        print(f"paraplan plan: {line}", file=sys.stderr)
    said += after
    if baselines_run_text(result.baselines):
        print(f"paraplan plan: {baselines_run_text(result.baselines)}", file=sys.stderr)
    for name, base in result.baselines.items():
        if base is not None and base.fits_memory:
            print(f"paraplan plan: baseline {name}: {base.iteration_s:.3g} s", file=sys.stderr)
    print(f"paraplan plan: {baseline_text(best.iteration_s, result.baselines)}", file=sys.stderr)
    print(f"paraplan plan: {len(rows)} plan(s) -> {args.output}", file=sys.stderr)
    numeric = ("predicted_iteration_s", "predicted_tokens_per_s", "predicted_tflops_per_gpu", "predicted_mfu",
               "predicted_peak_memory_bytes", *PEAK_MEMORY_COLUMNS, "bubble_fraction")
    track(args, RunLog(
        stage="plan", run_name=args.output.stem,
        params={"model": model.name, "cluster": cluster.name, "num_gpus": args.gpus,
                "global_batch_size": args.global_batch_size, "seq_length": model.seq_length, "dtype": args.dtype,
                "calibration": calibration.label},
        metrics={"search_s": result.search_s, "candidates": float(result.candidates), "retimed": float(result.retimed),
                 **{f"best_{k}": float(rows[0][k]) for k in numeric}},
        table=Table(rows=rows, metrics=("rank", *numeric)),
        artifacts=[args.output], tags=notes_tags(said)))
    return 0


def run(args: argparse.Namespace) -> int:
    from paraplan.cli.common import track
    from paraplan.clusters import load_cluster
    from paraplan.core import ConfigError

    if args.model is not None:
        if getattr(args, REQUEST + "profile", None) is not None or args.study is not None:
            raise ConfigError("--model", "plans a transformer; --profile and --study plan a layer profile: give one")
        _refuse_unused(args, model=True)
        return _run_llm(args)
    _refuse_unused(args, model=False)
    _check(args)
    request, study_path = _request(args)
    if request.profile is None:
        raise ConfigError("--profile", "give a profile (or --study NAME)")
    if request.global_batch_sizes is None:
        raise ConfigError("--global-batch-sizes", "give the global batch sizes to plan, e.g. 32,64,128 or 32:4096:64")
    for warning in request.warnings():
        print(f"paraplan plan: warning: {warning}", file=sys.stderr)
    profile = _load_profile(request.profile, request.profile_batch_size)
    base = load_cluster(request.cluster)
    clusters = request.clusters(base)
    name = getattr(request, "name", profile.name)
    into_folder = study_path is not None or len(clusters) > 1
    sizes = list(request.global_batch_sizes.values)
    for cluster in clusters:
        settings = request.settings(profile, cluster, _comm(args.comm_model, cluster))
        shape = f"{cluster.nodes}x{cluster.devices_per_node}"
        csv_path = args.output / f"{name}__{shape}.csv" if into_folder else args.output
        plots = args.plots or (args.output if study_path is not None else None)
        title = f"{name}: {profile.name} on {cluster.name} ({shape})" if study_path else \
            f"{profile.name} on {cluster.name} ({shape})"
        rows, wall, figures = _run_one(args, settings, sizes, csv_path, plots, title)
        params = {
            "profile": str(request.profile), "cluster_file": request.cluster, "cluster": shape,
            "comm_model": str(args.comm_model) if args.comm_model else "dapple_constants",
            "memory_bytes": settings.memory.memory_bytes, "model_state_factor": request.model_state_factor,
            "peak_activation_bytes_per_sample": request.peak_activation_bytes_per_sample,
            "min_micro_batch_size": settings.min_micro_batch_size, "global_batch_sizes": sizes, "jobs": args.jobs,
            "candidates": request.candidates,
            **({"study": str(args.study)} if study_path is not None else {}),
        }
        track(args, _runlog(args, rows, wall, csv_path, figures, params))
    return 0
