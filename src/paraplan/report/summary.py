"""Build `summary.md` from the stages' result files (pure: frames in, Markdown out).

Each section takes the parsed files of one stage and returns Markdown lines: a
small table of headline numbers and the commands that reproduce them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from paraplan.profile.consistency import profile_inconsistency
from paraplan.validate.compare import LOAD_COLUMN
from paraplan.validate.load import BUSY_LOAD_PER_CORE


@dataclass(frozen=True)
class StageFiles:
    """Parsed result files, keyed by the name that identifies each."""

    collectives: Mapping[str, pd.DataFrame]  # "<cluster>/<collective>_n<world>"
    fits: Mapping[str, dict]  # cluster -> comm_model.json
    profiles: Mapping[str, tuple[pd.DataFrame, dict]]  # model -> (csv, meta)
    # study -> (results, timing, published comparison)
    simulations: Mapping[str, tuple[pd.DataFrame, dict, pd.DataFrame | None]]
    plans: Mapping[str, pd.DataFrame]  # "<model>__<cluster>"
    validations: Mapping[str, pd.DataFrame]  # model
    calibrations: Mapping[str, dict] = field(default_factory=dict)  # name -> calibration JSON
    predictions: Mapping[str, pd.DataFrame] = field(default_factory=dict)  # table -> predicted.csv
    llm_plans: Mapping[str, pd.DataFrame] = field(default_factory=dict)  # name -> plans/llm/<name>.csv
    kernels: Mapping[str, dict] = field(default_factory=dict)  # results/kernels/... path -> kernel fit JSON


def _fmt(value: object, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value).replace("|", "\\|")  # a pipe would end the table cell


def _pct(value: float | None) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out.extend("| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows)
    return out


def bench_section(collectives: Mapping[str, pd.DataFrame]) -> list[str]:
    rows = []
    for key, frame in sorted(collectives.items()):
        if frame.empty or "sample" in frame.columns:
            continue
        first = frame.sort_values("size_bytes").iloc[0]
        peak = frame.loc[frame["busbw_GBps"].idxmax()]
        rows.append([key, first["backend"], int(first["size_bytes"]), float(first["time_us"]),
                     float(peak["busbw_GBps"]), int(peak["size_bytes"])])
    if not rows:
        return []
    return [
        "## bench: collective benchmarks",
        "",
        *_table(["sweep", "backend", "smallest size (B)", "latency there (us)", "peak busbw (GB/s)",
                 "at size (B)"], rows),
        "",
        "Reproduce: `snakemake -R bench --until bench` (one job per collective and world size), "
        "or `paraplan bench --world-size N --collectives C -o DIR`.",
        "",
    ]


def fit_section(fits: Mapping[str, dict]) -> list[str]:
    rows = []
    for cluster, doc in sorted(fits.items()):
        by_sweep: dict[tuple, dict[str, dict]] = {}
        for entry in doc.get("fits", []):
            key = (entry["collective"], entry["world_size"], entry.get("nodes", 1))
            by_sweep.setdefault(key, {})[entry["model"]] = entry
        for (collective, world, nodes), models in sorted(by_sweep.items()):
            chosen = next((m for m in models.values() if m.get("chosen")), None)
            rows.append([
                cluster, f"{collective} n{world}" + (f" ({nodes} nodes)" if nodes > 1 else ""),
                chosen["model"] if chosen else "",
                _pct(chosen.get("heldout_gmae")) if chosen else "",
                *(_pct(models[m].get("heldout_gmae")) if m in models else ""
                  for m in ("alpha_beta", "sigmoid_bw", "table")),
            ])
    if not rows:
        return []
    return [
        "## fit: communication cost models (held-out GMAE, leave-one-out)",
        "",
        *_table(["cluster", "sweep", "chosen", "chosen GMAE", "alpha_beta", "sigmoid_bw", "table"], rows),
        "",
        "Reproduce: `snakemake -R fit --until fit`, or "
        "`paraplan fit results/collectives/<cluster>/*.csv -o comm_model.json --plots DIR`.",
        "",
    ]


def _inconsistent(profiles: Mapping[str, tuple[pd.DataFrame, dict]]) -> list[str]:
    """'**Warning**' lines for the profiles whose layers do not add up to their whole step."""
    return [f"**Warning: profile `{model}`**: {problem}." for model, (_, meta) in sorted(profiles.items())
            if (problem := profile_inconsistency(meta))]


def profile_section(profiles: Mapping[str, tuple[pd.DataFrame, dict]]) -> list[str]:
    rows = []
    for model, (frame, meta) in sorted(profiles.items()):
        flag = " (inconsistent)" if profile_inconsistency(meta) else ""
        rows.append([
            model, len(frame), meta.get("batch_size", ""), meta.get("device", ""), meta.get("threads", ""),
            1e3 * float(frame["fwd_s"].sum()), 1e3 * float(frame["bwd_s"].sum()),
            float(frame["param_bytes"].sum()) / 1e6,
            _pct(meta.get("sum_vs_whole_rel_err")) + flag if "sum_vs_whole_rel_err" in meta else "",
        ])
    if not rows:
        return []
    warnings = _inconsistent(profiles)
    return [
        "## profile: layer-wise profiles",
        "",
        *_table(["model", "layers", "batch", "device", "threads", "fwd total (ms)", "bwd total (ms)",
                 "params (MB)", "sum vs whole step"], rows),
        "",
        *(line for w in warnings for line in (w, "")),
        "Reproduce: `snakemake -R profile --until profile`, or "
        "`paraplan profile --model NAME --profile-batch-size B -o PROFILE.csv`.",
        "",
    ]


def simulate_section(simulations: Mapping[str, tuple[pd.DataFrame, dict, pd.DataFrame | None]]) -> list[str]:
    rows = []
    for experiment, (frame, timing, comparison) in sorted(simulations.items()):
        modes = ", ".join(sorted(frame["mode"].astype(str).unique())) if "mode" in frame else ""
        best = frame.loc[frame["speedup"].idxmax()] if "speedup" in frame and frame["speedup"].notna().any() else None
        vs = ""
        if comparison is not None and not comparison.empty:
            parts = []
            for (mode, reference), part in comparison.groupby(["mode", "reference"]):
                err = part["rel_diff"].abs()
                parts.append(f"{mode} vs {reference}: max {_pct(err.max())}, median {_pct(err.median())}")
            vs = "; ".join(parts)
        elif timing.get("published"):
            vs = str(timing["published"])
        rows.append([
            experiment, len(frame), modes, timing.get("simulate_s"),
            f"{best['speedup']:.2f}x at D{best['D']} T{best['T']} P{best['P']}" if best is not None else "",
            vs,
        ])
    if not rows:
        return []
    return [
        "## simulate: studies",
        "",
        *_table(["study", "configurations", "modes", "simulate_s", "best speedup",
                 "difference to published"], rows),
        "",
        "Reproduce: `snakemake -R simulate --until simulate`, or "
        "`paraplan simulate --study config/studies/simulate/<name>.yaml -o DIR`.",
        "",
    ]


def plan_section(plans: Mapping[str, pd.DataFrame]) -> list[str]:
    lines: list[str] = []
    for key, frame in sorted(plans.items()):
        if frame.empty:
            continue
        if not lines:
            lines = ["## plan: best hybrid plans (simulated speedup over one device)", ""]
        # every batch size for short sweeps; first, quartiles and last for long ones
        n = len(frame)
        picks = range(n) if n <= 12 else sorted({0, n // 4, n // 2, 3 * n // 4, n - 1})
        rows = [
            [int(r["gbs"]), r.get("dp_no_overlap"), r.get("dp_overlap"), r.get("dp_p3"),
             r.get("best_hybrid"), r.get("stages", "")]
            for r in (frame.iloc[i] for i in picks)
        ]
        lines += [f"### {key}", "",
                  *_table(["gbs", "DP no overlap", "DP overlap", "DP + P3", "best hybrid", "stages"], rows), ""]
    if lines:
        lines += ["Reproduce: `snakemake -R plan_measured --until plan_measured`, or "
                  "`paraplan plan --profile PROFILE --cluster NAME --shapes NxG --global-batch-sizes 32,64,128 "
                  "-o PLAN.csv`.",
                  ""]
    return lines


def validate_section(validations: Mapping[str, pd.DataFrame],
                     profiles: Mapping[str, tuple[pd.DataFrame, dict]] | None = None) -> list[str]:
    """The validation table; a warning for each validation measured on a busy machine
    (`LOAD_COLUMN`) and each whose profile does not add up to its whole step."""
    rows = []
    warnings = []
    for model, frame in sorted(validations.items()):
        for r in frame.itertuples(index=False):
            rows.append([model, r.strategy, 1e3 * r.measured_s,
                         f"{1e3 * r.measured_p10_s:.3g} .. {1e3 * r.measured_p90_s:.3g}",
                         1e3 * r.predicted_s, _pct(r.rel_err)])
        if LOAD_COLUMN in frame and len(frame) and float(frame[LOAD_COLUMN].max()) > BUSY_LOAD_PER_CORE:
            warnings.append(f"**Warning: `{model}` was measured on a busy machine**: other processes' load "
                            f"{float(frame[LOAD_COLUMN].max()):.2f} per core (above {BUSY_LOAD_PER_CORE:.2f}); "
                            "its errors include their work, not the model's alone. Rerun on an idle machine.")
    if not rows:
        return []
    warnings += [w for w in _inconsistent({m: p for m, p in (profiles or {}).items() if m in validations})]
    errs = pd.concat(list(validations.values()))["rel_err"].abs()
    return [
        "## validate: predicted vs measured step time",
        "",
        *_table(["model", "strategy", "measured (ms)", "p10 .. p90 (ms)", "predicted (ms)",
                 "error (pred/meas - 1)"], rows),
        "",
        f"Absolute error: median {_pct(errs.median())}, max {_pct(errs.max())}.",
        "",
        *(line for w in warnings for line in (w, "")),
        "Reproduce: `snakemake -R validate --until validate`, or `paraplan validate --help`.",
        "",
    ]


def calibrate_section(calibrations: Mapping[str, dict]) -> list[str]:
    rows = []
    for name, cal in sorted(calibrations.items()):
        errors = cal.get("errors", {})
        cv, ins, rank = errors.get("cross_validated", {}), errors.get("in_sample", {}), errors.get("ranking", {})
        data = cal.get("data", {})
        rows.append([name, cal.get("device", ""), data.get("measurements", data.get("rows", "")), _pct(ins.get("mape")),
                     _pct(cv.get("mape")), _pct(cv.get("median_ape")), _pct(cv.get("max_ape")),
                     _fmt(cv.get("spearman")), _pct(rank.get("measured_fastest_in_top_k")),
                     _pct(rank.get("predicted_fastest_within_5pct")), len(cal.get("layer_time_factors", []))])
    if not rows:
        return []
    return [
        "## calibrate: device model fitted to measured iteration times",
        "",
        *_table(["calibration", "device", "runs", "in-sample MAPE", "cross-validated MAPE", "CV median",
                 "CV max", "CV Spearman", "fastest in top 3", "pick within 5%", "layer factors"], rows),
        "",
        "Cross-validated: each model shape predicted by a fit that never saw it (its layer shapes' factors "
        "from the other models). Reproduce: "
        "`snakemake -R calibrate --until calibrate`, or `paraplan calibrate RUNS.csv --cluster dgx-a100 "
        "--comm-model comm_model.json -o CAL.json`.",
        "",
    ]


def kernels_section(kernels: Mapping[str, dict]) -> list[str]:
    rows = []
    for where, fit in sorted(kernels.items()):
        gemm, att = fit.get("gemm", {}), fit.get("attention") or {}
        eff = fit.get("efficiency", {})
        sustained = "held" if "held" in gemm else _fmt((gemm.get("sustained") or {}).get("factor"))
        rows.append([where, fit.get("device", ""), gemm.get("n_points", ""), _fmt(eff.get("gemm_efficiency")),
                     sustained, _fmt(gemm.get("params", {}).get("gemm_k_half")), _pct(gemm.get("mape")),
                     _pct(gemm.get("heldout_mape")), _fmt(eff.get("attention_fwd_efficiency")),
                     _fmt(eff.get("attention_bwd_efficiency")), _pct(att.get("heldout_mape"))])
    if not rows:
        return []
    return [
        "## kernels: GEMM and attention ceilings fitted to kernel measurements",
        "",
        *_table(["fit", "device", "GEMMs", "gemm_efficiency", "sustained", "gemm_k_half", "GEMM MAPE", "GEMM held-out",
                 "attention fwd", "attention bwd", "attention held-out"], rows),
        "",
        "gemm_efficiency: what a training step holds, the burst fit's times `sustained` (sustained / burst "
        "GEMM throughput at the power limit; empty: none measured; held: the GEMMs were timed at the power "
        "limit, no factor). "
        "Held-out: GEMMs leave one shape out, attention one sequence length out (docs/kernels.md). Reproduce: "
        "`snakemake -R kernels_bench --until kernels_all`, or `paraplan fit --kind kernels CSV... --cluster NAME "
        "-o FIT.json`.",
        "",
    ]


def _layout(r: Mapping) -> str:
    """TP/PP/DP, with the context-parallel size where a run has one above 1."""
    text = f"{r['tensor_model_parallel_size']}/{r['pipeline_model_parallel_size']}/{r['data_parallel_size']}"
    cp = str(r.get("context_parallel_size", "") or "").strip()
    return text + (f" CP {int(float(cp))}" if cp and cp.lower() != "nan" and int(float(cp)) > 1 else "")


def predict_section(predictions: Mapping[str, pd.DataFrame]) -> list[str]:
    lines: list[str] = []
    for table, frame in sorted(predictions.items()):
        rows = []
        for r in frame.to_dict("records"):
            rows.append([r.get("name", ""), _layout(r), r.get("micro_batch_size", ""),
                         r.get("virtual_pipeline_model_parallel_size", ""), r.get("recompute_granularity", ""),
                         float(r["predicted_iteration_s"]), float(r["predicted_tflops_per_gpu"]),
                         _pct(float(r["predicted_mfu"])), float(r["predicted_peak_memory_bytes"]) / 1e9,
                         r["fits_memory"]])
        lines += [f"## predict: {table}", "",
                  *_table(["run", "TP/PP/DP", "micro-batch", "v", "recompute", "iteration (s)", "TFLOP/s per GPU",
                           "MFU", "peak memory (GB)", "fits"], rows), ""]
    if lines:
        lines += ["Reproduce: `snakemake -R predict --until predict`, or "
                  "`paraplan predict RUNS.csv --cluster dgx-a100 -o OUT.csv`.", ""]
    return lines


def llm_plan_section(plans: Mapping[str, pd.DataFrame]) -> list[str]:
    rows = []
    for name, frame in sorted(plans.items()):
        if frame.empty:
            continue
        r = frame.iloc[0]
        v = int(r["virtual_pipeline_model_parallel_size"])
        rows.append([name, _layout(r), int(r["micro_batch_size"]), v, r["schedule"],
                     r["recompute_granularity"], r["sequence_parallel"],
                     "dist. opt." if str(r["use_distributed_optimizer"]).lower() == "true" else int(r["zero_stage"]),
                     float(r["predicted_iteration_s"]), _pct(float(r["predicted_mfu"])),
                     float(r["predicted_peak_memory_bytes"]) / 1e9, float(r["search_s"])])
    if not rows:
        return []
    return [
        "## plan: transformers on GPU clusters (best plan of each)",
        "",
        *_table(["plan", "TP/PP/DP", "micro-batch", "v", "schedule", "recompute", "SP", "ZeRO", "iteration (s)",
                 "MFU", "memory (GB)", "search (s)"], rows),
        "",
        "Reproduce: `snakemake -R plan_llm --until plan_llm`, or `paraplan plan --model gpt3-175b "
        "--cluster dgx-a100 --gpus 1024 --global-batch-size 1536 -o PLANS.csv`.",
        "",
    ]


def render(files: StageFiles, title: str = "paraplan summary") -> str:
    lines = [f"# {title}", "",
             "Headline numbers of every stage of the last `snakemake` run; every figure is in "
             "`results/figures/` and in MLflow (`mlflow ui`).", ""]
    for section in (bench_section(files.collectives), fit_section(files.fits),
                    profile_section(files.profiles), simulate_section(files.simulations),
                    plan_section(files.plans), validate_section(files.validations, files.profiles),
                    kernels_section(files.kernels), calibrate_section(files.calibrations),
                    predict_section(files.predictions),
                    llm_plan_section(files.llm_plans)):
        lines += section
    return "\n".join(lines).rstrip() + "\n"
