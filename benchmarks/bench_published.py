"""paraplan's predictor on published large-scale training measurements (test sets,
never fitted on; provenance in benchmarks/data/README.md), with the configurations as
their authors ran them:

- per table: rows, mean signed error, MAPE and largest error of the iteration time
  (error = predicted / measured - 1), and every row measured vs predicted; rows paraplan
  cannot express yet are listed with their published time and the reason (most rows
  of the mixture-of-experts tables, `published.MOE_TABLES`: recipes with DeepEP,
  the all-to-all overlap or DualPipe);
- the GPT-3 175B plan of docs/stages/plan.md on 1,024 A100 (`paraplan plan --model gpt3-175b --cluster
  dgx-a100 --gpus 1024 --global-batch-size 1536`): its predicted MFU beside the published
  175B A100 range;
- torchtitan's Llama 3.1 H100 benchmarks: tokens/s per GPU and peak memory per GPU,
  published vs predicted, and for reference the AutoModel FSDP2 + EP rows
  (`fsdp_published`);
- Llama 3 405B, Meta's three configurations (8,192 and 16,384 H100 at 8K tokens; 16,384
  at 131,072 tokens with CP 16): predicted TFLOP/s per GPU, in the FLOP convention Meta
  published (PaLM's), beside the published 430 / 400 / 380; and, since Meta does not say
  which attention kernel its stack ran, each row predicted with every attention kernel
  the H100 kernel file has (`LLAMA_ATTENTION`; the table's own row keeps `auto`);
- NVIDIA's FP8 H100 recipes (`FP8_TABLE`): each row predicted with every Hopper FP8
  recipe and as its BF16 twin (iteration time and memory);
- for reference, one transformer layer of Korthikanti et al. 2022's 22B model (Table 4,
  `data/published/korthikanti2022_table4.csv`): forward and backward device time per
  setting. That table is per-layer micro-benchmark data that may be fitted on; it is shown
  here, not counted in any test-set figure.

It reports and never gates: the exit status is 0 whenever the tables could be read.

    python benchmarks/bench_published.py [--calibration FILE] [--csv OUT] [--tables STEM,...] [--no-plan]
        [--no-layers]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paraplan.clusters import load_cluster
from paraplan.core.errors import StrategyError
from paraplan.predict.calibration import Calibration, calibration_for
from paraplan.predict.predictor import RunPrediction, predict_rows
from paraplan.predict.runtable import RunRow

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fsdp_published import TORCHTITAN_TABLE, automodel_reference, torchtitan_check
from published import MOE_TABLES, TABLES, PublishedRow, load_table, palm_flops, table_paths

PLAN_GPUS, PLAN_GLOBAL_BATCH = 1024, 1536
GPT3_PUBLISHED_MFU = (0.449, 0.514)  # SC21 175B on 1,024 A100 (140 TFLOP/s counting recompute) .. Korthikanti 175B
GPT3_TARGET_MFU = 0.60  # issue 22: inside the published range, at most 60%
LLAMA_TABLE = "llama3_405b_table4"
LLAMA_ATTENTION: tuple[tuple[str, str, int], ...] = (
    ("cuDNN", "auto", 0),  # what the table's rows price: Transformer Engine's pick on H100 (= fused)
    ("FlashAttention-2", "flash", 0),
    ("FlashAttention-3", "flash", 3))
"""(kernel, attention_backend, flash_attention_version): every attention kernel of
config/kernels/H100-SXM5-80GB.json. Meta's PyTorch-based stack is not Megatron/Transformer
Engine and neither the Llama 3 paper nor Meta's posts found name its attention kernel, so
each row is shown with each kernel (the sensitivity), never the one closest to the
measurement."""
FP8_TABLE = "megatron_bridge_h100_llama3_fp8"
HOPPER_RECIPES: tuple[str, ...] = ("delayed", "tensorwise", "blockwise")  # mxfp8 needs Blackwell
LAYER_TABLE = Path(__file__).resolve().parents[1] / "data/published/korthikanti2022_table4.csv"
CSV_COLUMNS = ("table", "name", "num_gpus", "tensor_model_parallel_size", "pipeline_model_parallel_size",
               "data_parallel_size", "micro_batch_size", "virtual_pipeline_model_parallel_size",
               "measured_iteration_s", "predicted_iteration_s", "error", "predicted_tflops_per_gpu",
               "predicted_mfu", "bubble_fraction", "fits_memory", "chosen", "published_value", "published_unit",
               "not_expressible", "failure")


@dataclass(frozen=True)
class RowResult:
    table: str
    row: PublishedRow
    prediction: RunPrediction | None
    failure: str = ""  # why paraplan could not predict an expressible row

    @property
    def error(self) -> float | None:
        run, pred = self.row.run, self.prediction
        if run is None or pred is None or run.measured_iteration_s is None:
            return None
        return pred.iteration_s / run.measured_iteration_s - 1


def predict_table(stem: str, rows: list[PublishedRow], calibration: Calibration) -> list[RowResult]:
    """Every expressible row predicted (in one batch; row by row where a row fails)."""
    cluster = load_cluster(TABLES[stem][0])
    comm = calibration.comm_model(cluster)
    runs: list[RunRow] = [r.run for r in rows if r.run is not None]
    try:
        preds: list[RunPrediction | None] = list(predict_rows(runs, cluster, comm, calibration.efficiency))
        failures = [""] * len(runs)
    except StrategyError:
        preds, failures = [], []
        for run in runs:
            try:
                preds.append(predict_rows([run], cluster, comm, calibration.efficiency)[0])
                failures.append("")
            except StrategyError as exc:
                preds.append(None)
                failures.append(str(exc))
    out, k = [], 0
    for row in rows:
        if row.run is None:
            out.append(RowResult(stem, row, None))
            continue
        out.append(RowResult(stem, row, preds[k], failures[k]))
        k += 1
    return out


@dataclass(frozen=True)
class Summary:
    rows: int
    mean_signed: float
    mape: float
    max_error: float  # the signed error of largest magnitude

    @staticmethod
    def of(errors: list[float]) -> Summary | None:
        if not errors:
            return None
        e = np.array(errors)
        return Summary(len(e), float(e.mean()), float(np.abs(e).mean()), float(e[np.argmax(np.abs(e))]))

    def line(self) -> str:
        return (f"{self.rows} rows, mean signed error {self.mean_signed:+.1%}, MAPE {self.mape:.1%}, "
                f"max error {self.max_error:+.1%}")


def _settings_text(result: RowResult) -> str:
    pred = result.prediction
    if pred is None:
        return ""
    s = pred.settings
    cp = f" c{s.context_parallel_size}" if s.context_parallel_size > 1 else ""
    text = f"t{s.tensor_model_parallel_size}{cp} p{s.pipeline_model_parallel_size} d{s.data_parallel_size} " \
           f"b{s.micro_batch_size}"
    if s.virtual_pipeline_model_parallel_size > 1:
        text += f" v{s.virtual_pipeline_model_parallel_size}"
    return text + ("" if pred.fits_memory else f" (does not fit: {pred.peak_memory_bytes / 1e9:.1f} GB > "
                                                f"{pred.memory_capacity_bytes / 1e9:.1f} usable)")


def print_table(stem: str, results: list[RowResult], calibration: Calibration) -> Summary | None:
    errors = [r.error for r in results if r.error is not None]
    summary = Summary.of(errors)
    cluster = load_cluster(TABLES[stem][0])
    transferred = "" if cluster.device.compute_name == calibration.device else (
        f"; calibration fitted on {calibration.device}, efficiencies taken as fractions of this device's peaks")
    print(f"\n== {stem}: {TABLES[stem][1]} [{cluster.name}{transferred}]")
    print(f"   {summary.line() if summary else 'no predicted rows'}")
    if len(results) > 20:  # large sweeps: the error by tensor-parallel size
        by_tp: dict[int, list[float]] = {}
        for r in results:
            if r.error is not None and r.row.run is not None:
                by_tp.setdefault(r.row.run.settings.tensor_model_parallel_size, []).append(r.error)
        for t in sorted(by_tp):
            s = Summary.of(by_tp[t])
            if s:
                print(f"   TP{t}: {s.line()}")
    print(f"   {'run':44s} {'GPUs':>6s} {'measured s':>11s} {'predicted s':>11s} {'error':>7s}  settings predicted")
    for r in results:
        run = r.row.run
        if run is None:
            cells = r.row.cells
            measured_text = cells.get("measured_iteration_s", "")
            gpus = cells.get("num_gpus", "")
            print(f"   {r.row.name[:44]:44s} {gpus:>6s} {measured_text:>11s} {'-':>11s} {'-':>7s}  not expressible: "
                  f"{r.row.not_expressible}")
            continue
        measured = run.measured_iteration_s or float("nan")
        if r.prediction is None:
            print(f"   {r.row.name[:44]:44s} {run.settings.num_gpus:6d} {measured:11.4g} {'-':>11s} {'-':>7s}  "
                  f"failed: {r.failure}")
            continue
        print(f"   {r.row.name[:44]:44s} {run.settings.num_gpus:6d} {measured:11.4g} "
              f"{r.prediction.iteration_s:11.4g} {r.error:+7.1%}  {_settings_text(r)}")
    return summary


def plan_check(calibration: Calibration) -> None:
    """The GPT-3 175B plan of docs/stages/plan.md on 1,024 A100: predicted MFU vs the published range."""
    from paraplan.plan.transformer.output import describe
    from paraplan.plan.transformer.request import TransformerPlanRequest
    from paraplan.plan.transformer.search import search
    from paraplan.predict.models import PRESETS

    cluster = load_cluster("dgx-a100")
    request = TransformerPlanRequest(PRESETS["gpt3-175b"], cluster, PLAN_GPUS, PLAN_GLOBAL_BATCH)
    started = time.perf_counter()
    result = search(request, calibration.comm_model(cluster), calibration.efficiency)
    wall = time.perf_counter() - started
    best = result.plans[0]
    low, high = GPT3_PUBLISHED_MFU
    print(f"\n== GPT-3 175B plan, {PLAN_GPUS} x A100, global batch {PLAN_GLOBAL_BATCH} "
          "(paraplan plan --model gpt3-175b)")
    print(f"   best: {describe(best)}: {best.iteration_s:.3g} s, MFU {best.mfu:.1%} "
          f"(published 175B on A100: {low:.1%}-{high:.1%}; target <= {GPT3_TARGET_MFU:.0%}); search {wall:.2f} s")


def llama_check(results: dict[str, list[RowResult]], calibration: Calibration) -> None:
    """Llama 3 405B, each of Meta's configurations: predicted TFLOP/s per GPU in Meta's
    (PaLM's) FLOP count, then with each attention kernel of `LLAMA_ATTENTION`."""
    for r in results.get(LLAMA_TABLE, []):
        run, pred = r.row.run, r.prediction
        if run is None or pred is None:
            continue
        m, s = run.model, run.settings
        flops = palm_flops(s.global_batch_size * m.seq_length, m.num_parameters, m.num_layers, m.hidden_size,
                           m.seq_length)
        tflops = flops / pred.iteration_s / s.num_gpus / 1e12
        published = float(r.row.annotations["published_value"])
        cp = (f" CP{s.context_parallel_size} ({s.cp_comm_type})" if s.context_parallel_size > 1 else "")
        print(f"\n== Llama 3 405B, {s.num_gpus} x H100, {m.seq_length:,} tokens, TP{s.tensor_model_parallel_size}{cp}"
              f" PP{s.pipeline_model_parallel_size} DP{s.data_parallel_size} (Meta's configuration)")
        print(f"   predicted {tflops:.0f} TFLOP/s per GPU (PaLM's count, as published; {pred.tflops_per_gpu:.0f} in "
              f"Megatron's) vs published {published:.0f}: {tflops / published - 1:+.1%} (target within 10%); "
              f"{pred.peak_memory_bytes / 1e9:.1f} GB per GPU"
              f"{'' if pred.fits_memory else f' (does not fit in {pred.memory_capacity_bytes / 1e9:.1f} usable)'}")
        llama_attention_kernels(r, flops, published, calibration)


def llama_attention_kernels(r: RowResult, flops: float, published: float, calibration: Calibration) -> None:
    """One Llama 3 405B row predicted with each attention kernel of `LLAMA_ATTENTION`
    (the row's own `attention_backend` marked): how much the unpublished kernel moves it."""
    from dataclasses import replace

    run = r.row.run
    assert run is not None and run.measured_iteration_s is not None
    cluster = load_cluster(TABLES[LLAMA_TABLE][0])
    comm = calibration.comm_model(cluster)
    print("   attention kernel (not published by Meta; the row prices its `attention_backend`)")
    print(f"     {'kernel':18s} {'attention_backend':34s} {'predicted s':>11s} {'error':>7s} {'TFLOP/s':>7s} "
          f"{'vs published':>12s}  settings predicted")
    for kernel, backend, version in LLAMA_ATTENTION:
        settings = replace(run.settings, attention_backend=backend, flash_attention_version=version)
        pred = predict_rows([replace(run, settings=settings)], cluster, comm, calibration.efficiency)[0]
        tflops = flops / pred.iteration_s / settings.num_gpus / 1e12
        label = backend + (f", flash_attention_version {version}" if version else "")
        own = (backend, version) == (run.settings.attention_backend, run.settings.flash_attention_version)
        print(f"     {kernel:18s} {label + (' (the row)' if own else ''):34s} {pred.iteration_s:11.4g} "
              f"{pred.iteration_s / run.measured_iteration_s - 1:+7.1%} {tflops:7.0f} {tflops / published - 1:+12.1%}"
              f"  {_settings_text(RowResult(LLAMA_TABLE, r.row, pred))}")


def fp8_check(results: dict[str, list[RowResult]], calibration: Calibration) -> None:
    """NVIDIA's FP8 H100 recipes (`FP8_TABLE`): each expressible row predicted with every
    Hopper recipe and as its BF16 twin (the page prints no BF16 twin of these rows on
    H100): the FP8 speedup and memory paraplan predicts (docs/fp8.md)."""
    from dataclasses import replace

    rows = [r for r in results.get(FP8_TABLE, []) if r.row.run is not None and r.prediction is not None]
    if not rows:
        return
    cluster = load_cluster(TABLES[FP8_TABLE][0])
    comm = calibration.comm_model(cluster)
    print("\n== FP8 recipes and BF16 twins of the Megatron-Bridge H100 rows (predicted; measured: the row's recipe)")
    print(f"   {'run':22s} {'measured s':>10s} " + " ".join(f"{n:>15s}" for n in (*HOPPER_RECIPES, "bf16 twin"))
          + "  (s, GB)")
    for r in rows:
        run = r.row.run
        assert run is not None
        cells = []
        for recipe in (*HOPPER_RECIPES, ""):
            settings = replace(run.settings, dtype="fp8" if recipe else "bf16", fp8_recipe=recipe)
            pred = predict_rows([replace(run, settings=settings)], cluster, comm, calibration.efficiency)[0]
            cells.append(f"{pred.iteration_s:7.3g} {pred.peak_memory_bytes / 1e9:5.1f}GB")
        print(f"   {r.row.name:22s} {run.measured_iteration_s or 0:10.4g} " + " ".join(f"{c:>15s}" for c in cells))


def layer_check(calibration: Calibration) -> None:
    """Korthikanti 2022 Table 4: one layer of the 22B model (TP 8, micro-batch 4, s 2,048)
    on one DGX A100; the backward as published includes the recomputation."""
    from dataclasses import replace

    from paraplan.core.run_settings import RunSettings
    from paraplan.core.transformer import TransformerModel
    from paraplan.predict.build import kernel_times_by_pass, run_structure
    from paraplan.predict.pass_times import pass_times

    cluster = load_cluster("dgx-a100")
    comm = calibration.comm_model(cluster)
    with LAYER_TABLE.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    print("\n== Korthikanti 2022 Table 4: one layer of the 22B model, TP 8 (fitting data, for reference; ms)")
    print(f"   {'experiment':26s} {'fwd':>6s} {'pred':>6s} {'err':>7s} {'bwd':>6s} {'pred':>6s} {'err':>7s}")
    base = RunSettings(tensor_model_parallel_size=8, dtype="fp16", use_flash_attn=False)
    for r in rows:
        h, heads, seq, mbs = (int(r[k]) for k in ("hidden_size", "num_attention_heads", "seq_length",
                                                   "micro_batch_size"))
        model = TransformerModel(name="korthikanti-22b", num_layers=48, hidden_size=h, num_attention_heads=heads,
                                 seq_length=seq, vocab_size=51200)
        settings = replace(base, tensor_model_parallel_size=int(r["tensor_model_parallel_size"]),
                           global_batch_size=mbs, micro_batch_size=mbs,
                           recompute_granularity=r["recompute_granularity"],  # type: ignore[arg-type]
                           sequence_parallel=r["sequence_parallel"] == "true")
        structure = run_structure(model, settings, cluster, comm)
        times = pass_times(structure, kernel_times_by_pass([structure], calibration.efficiency)[0],
                           calibration.efficiency)
        fwd, bwd = times.device_s[0] * 1e3, (times.device_s[1] + times.device_s[2]) * 1e3
        f, b = float(r["forward_ms"]), float(r["backward_ms"])
        print(f"   {r['experiment']:26s} {f:6.1f} {fwd:6.2f} {fwd / f - 1:+7.1%} "
              f"{b:6.1f} {bwd:6.2f} {bwd / b - 1:+7.1%}")


def write_csv(path: Path, results: dict[str, list[RowResult]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
        writer.writeheader()
        for stem, rows in results.items():
            for r in rows:
                run, pred = r.row.run, r.prediction
                cells: dict[str, object] = {"table": stem, "name": r.row.name, "not_expressible": r.row.not_expressible,
                         "failure": r.failure, "published_value": r.row.annotations.get("published_value", ""),
                         "published_unit": r.row.annotations.get("published_unit", "")}
                if run is not None:
                    s = pred.settings if pred is not None else run.settings
                    cells.update(num_gpus=s.num_gpus, tensor_model_parallel_size=s.tensor_model_parallel_size,
                                 pipeline_model_parallel_size=s.pipeline_model_parallel_size,
                                 data_parallel_size=s.data_parallel_size,
                                 measured_iteration_s=f"{run.measured_iteration_s:.6g}")
                if pred is not None:
                    cells.update(micro_batch_size=pred.settings.micro_batch_size,
                                 virtual_pipeline_model_parallel_size=pred.settings.virtual_pipeline_model_parallel_size,
                                 predicted_iteration_s=f"{pred.iteration_s:.6g}", error=f"{r.error:.4f}",
                                 predicted_tflops_per_gpu=f"{pred.tflops_per_gpu:.4g}",
                                 predicted_mfu=f"{pred.mfu:.4f}", bubble_fraction=f"{pred.bubble_fraction:.4f}",
                                 fits_memory=str(pred.fits_memory).lower(), chosen=";".join(pred.chosen))
                writer.writerow(cells)


SUMMARY_MD = "benchmarks/results/published-summary.md"
"""The committed summary the published-benchmarks docs page shows (`docs/gen_pages.py`
inserts it); `--markdown benchmarks/results/published-summary.md` rewrites it and a test
checks it is current."""


def summary_markdown(results: dict[str, list[RowResult]], summaries: dict[str, Summary | None]) -> str:
    """The per-table summary (iteration time) as a Markdown table."""
    lines = [f"<!-- Written by `python benchmarks/bench_published.py --markdown {SUMMARY_MD}`; do not edit. -->",
             "",
             "| table | predicted / listed rows | mean signed error | MAPE | largest error |",
             "|---|---|---|---|---|"]
    for stem, summary in summaries.items():
        listed = len(results[stem])
        predicted = summary.rows if summary else 0
        cells = ([f"{summary.mean_signed:+.1%}", f"{summary.mape:.1%}", f"{summary.max_error:+.1%}"] if summary
                 else ["-", "-", "-"])
        lines.append(f"| `{stem}` ({TABLES[stem][1]}) | {predicted} / {listed} | " + " | ".join(cells) + " |")
    moe = moe_together(results)
    if moe is not None:
        summary, listed = moe
        lines.append(f"| the mixture-of-experts tables together (issue 24's criterion) | {summary.rows} / {listed} | "
                     f"{summary.mean_signed:+.1%} | {summary.mape:.1%} | {summary.max_error:+.1%} |")
    return "\n".join(lines) + "\n"


def moe_together(results: dict[str, list[RowResult]]) -> tuple[Summary, int] | None:
    """The mixture-of-experts tables' rows (`MOE_TABLES`) as one test set: the summary of
    their predicted rows and how many they list; None when none of them was run."""
    stems = [s for s in MOE_TABLES if s in results]
    summary = Summary.of([r.error for s in stems for r in results[s] if r.error is not None])
    return None if summary is None else (summary, sum(len(results[s]) for s in stems))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calibration", default=None,
                        help="calibration for every table (default: each table's device's shipped calibration, as "
                             "paraplan predict picks it)")
    parser.add_argument("--csv", type=Path, default=None, help="write the per-row results here")
    parser.add_argument("--tables", default=",".join(TABLES), help="comma-separated table stems (default: all)")
    parser.add_argument("--no-plan", action="store_true", help="skip the GPT-3 175B plan search")
    parser.add_argument("--no-layers", action="store_true", help="skip the per-layer Korthikanti Table 4 lines")
    parser.add_argument("--markdown", type=Path, default=None,
                        help=f"write the per-table summary as a Markdown table here (the docs show {SUMMARY_MD})")
    args = parser.parse_args()
    def calibration_of(cluster_name: str) -> Calibration:
        return calibration_for(load_cluster(cluster_name), args.calibration,
                               warn=lambda m: print(f"warning: {m}", file=sys.stderr))

    calibration = calibration_of("dgx-a100")
    print("calibration: each table's device's own (paraplan predict's default) unless --calibration; errors are "
          "predicted / measured - 1")
    paths = table_paths()
    results: dict[str, list[RowResult]] = {}
    summaries: dict[str, Summary | None] = {}
    for stem in [s.strip() for s in args.tables.split(",") if s.strip()]:
        if stem not in TABLES:
            parser.error(f"--tables: unknown table '{stem}'; expected among {', '.join(TABLES)}")
        started = time.perf_counter()
        own = calibration_of(TABLES[stem][0])
        print(f"\n[{stem}: calibration {own.label}, fitted on {own.device}]", end="")
        results[stem] = predict_table(stem, load_table(paths[stem]), own)
        summaries[stem] = print_table(stem, results[stem], own)
        print(f"   ({time.perf_counter() - started:.1f} s)")
    print("\n== summary (iteration time)")
    for stem, summary in summaries.items():
        listed = len(results[stem])
        expressible = sum(r.row.run is not None for r in results[stem])
        moe = " (MoE)" if stem in MOE_TABLES else ""
        print(f"   {stem + moe:40s} {summary.line() if summary else 'no predicted rows'}"
              + ("" if expressible == listed else f"; {listed - expressible} of {listed} rows not expressible"))
    together = moe_together(results)
    if together is not None:
        print(f"   {'MoE tables together':40s} {together[0].line()} ({together[1]} listed)")
    if LLAMA_TABLE in results:
        llama_check(results, calibration_of(TABLES[LLAMA_TABLE][0]))
    if FP8_TABLE in results:
        fp8_check(results, calibration_of(TABLES[FP8_TABLE][0]))
    if TORCHTITAN_TABLE in results:  # FSDP2: torchtitan's tokens/s and memory, AutoModel's FSDP2 + EP rows
        torchtitan_check([r.row for r in results[TORCHTITAN_TABLE]], [r.prediction for r in results[TORCHTITAN_TABLE]])
        automodel_reference(calibration_of(TABLES[TORCHTITAN_TABLE][0]))
    if not args.no_plan:
        plan_check(calibration)  # (the A100 plan)
    if not args.no_layers:
        layer_check(calibration)
    if args.markdown:
        args.markdown.write_text(summary_markdown(results, summaries))
        print(f"\nsummary table -> {args.markdown}")
    if args.csv:
        write_csv(args.csv, results)
        print(f"\nper-row results -> {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
