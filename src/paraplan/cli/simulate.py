"""Simulate a named experiment (config/experiments/<name>.yaml): every configuration
of its sweep in each of its modes (`distir-v0.1`: DistIR's own semantics, to
reproduce seed 000; `corrected`: paraplan's physical engine).

Writes DIR/results.csv (one row per configuration), DIR/timing.json (simulate_s:
simulation wall time only, best of --repeats), DIR/published_comparison.csv when the
experiment names published numbers that exist, the figures (PNG + PDF, in --plots,
default DIR/figures) and, for Gantt experiments, DIR/traces/*.json (Chrome trace,
opens in Perfetto). An experiment is a name (config/experiments/<name>.yaml here, in
the checkout, or the copy the package carries) or a YAML path.

Examples:
  paraplan simulate --experiment schedules -o results/simulations/schedules
  paraplan simulate --experiment config/experiments/distir_fig3.yaml -o out/fig3 --modes corrected
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paraplan.cli.common import add_output_argument, add_tracking_arguments, deprecated, name_list

NAME = "simulate"
HELP = "simulate strategies of a named experiment (DistIR figures, pipeline schedules)"
ORDER = 40


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--experiment", required=True, metavar="NAME|FILE",
                        help="experiment name (distir_fig3, distir_fig4, schedules, ...) or YAML file")
    add_output_argument(parser, "output folder (results.csv, timing.json, figures/, traces/)")
    parser.add_argument("--plots", type=Path, default=None, metavar="DIR",
                        help="folder for the figures (PNG + PDF); default: OUTPUT/figures")
    deprecated(parser, "--figures", "--plots", "plots", convert=Path)
    parser.add_argument("--modes", default="",
                        help="comma-separated subset of the file's modes (distir-v0.1, corrected); default: all")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timing: best of this many runs of the sweep when one run is cheap (< 2 s)")
    parser.add_argument("--no-plots", action="store_true", help="write results and timing only")
    deprecated(parser, "--no-figures", "--no-plots", "no_plots", flag=True)
    add_tracking_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from paraplan.core import ConfigError
    from paraplan.files import write_csv, write_json
    from paraplan.sim import experiments as ex
    from paraplan.sim import published as pb

    if args.repeats < 1:
        raise ConfigError("--repeats", f"must be >= 1, got {args.repeats}")
    from paraplan.config_files import find
    from paraplan.progress import bar

    exp = ex.load_experiment(find("experiments", args.experiment))
    modes = tuple(name_list(args.modes, "--modes", ex.MODES)) if args.modes.strip() else ()
    total = sum(len(ex.experiment_points(exp, m)) for m in (modes or tuple(exp.modes)) if m in exp.modes)
    with bar(total, f"simulate {exp.name}", "config") as progress:
        result = ex.run_experiment(exp, modes, repeats=args.repeats, on_point=progress.update)
    out: Path = args.output
    rows = pd.DataFrame(ex.result_rows(result), columns=list(ex.RESULT_COLUMNS))

    published = None
    comparison = None
    published_note = ""
    if exp.published is not None:
        source = _published_source(Path(exp.published.file), Path(exp.path))
        if source.is_file():
            published = pb.load_published(source, exp.published.format)
            comparison = pb.compare(rows, published)
        else:
            published_note = f"not compared: {exp.published.file} not found"
            print(f"paraplan simulate: published numbers {source} not found; no comparison",
                  file=sys.stderr)

    write_csv(out / "results.csv", rows)
    timing = {
        "experiment": exp.name,
        "simulate_s": result.simulate_s,
        "simulate_s_by_mode": dict(result.simulate_s_by_mode),
        "repeats": result.repeats,
        "configurations": len(rows),
        **({"published": published_note} if published_note else {}),
    }
    write_json(out / "timing.json", timing)
    artifacts = [out / "results.csv", out / "timing.json"]
    summary: dict[str, float] = {"simulate_s": result.simulate_s, "configurations": float(len(rows))}
    for mode, seconds in result.simulate_s_by_mode.items():
        summary[f"simulate_s__{mode}"] = seconds
    if comparison is not None:
        write_csv(out / "published_comparison.csv", comparison)
        artifacts.append(out / "published_comparison.csv")
        for mode, part in comparison.groupby("mode"):
            err = part["rel_diff"].abs()
            summary[f"max_abs_rel_diff__{mode}"] = float(err.max())
            summary[f"median_abs_rel_diff__{mode}"] = float(err.median())
            print(f"paraplan simulate: {exp.name} {mode} vs {part['reference'].iloc[0]}: "
                  f"max |rel diff| {err.max():.3%}, median {err.median():.3%} over {len(part)} points",
                  file=sys.stderr)

    if not args.no_plots:
        figures = args.plots if args.plots is not None else out / "figures"
        artifacts.extend(_figures(exp, result, rows, published, figures, out / "traces"))

    print(f"paraplan simulate: {exp.name}: {len(rows)} configurations, "
          f"simulate_s {result.simulate_s:.4f} (best of {result.repeats}) -> {out}", file=sys.stderr)
    from paraplan.cli.common import track

    track(args, _runlog(exp, result, rows, summary, artifacts))
    return 0


def _published_source(path: Path, experiment_file: Path) -> Path:
    """A relative published-numbers path is relative to the working directory (the
    repository root under Snakemake); failing that, to the checkout that holds the
    experiment file (`<checkout>/config/experiments/x.yaml`), so a run from any
    directory finds the same reference data."""
    if path.is_absolute() or path.is_file():
        return path
    checkout = experiment_file.resolve().parent.parent.parent
    beside = checkout / path
    return beside if beside.is_file() else path


def _figures(exp, result, rows, published, figures: Path, traces: Path) -> list[Path]:
    paths: list[Path] = []
    modes = list(dict.fromkeys(rows["mode"]))
    if exp.figure == "distir_fig3":
        from paraplan.plots.distir import figure3

        for mode in modes:
            label = "published (DistIR v0.1)" if mode == "distir-v0.1" else "DistIR 83d7fc3 (4800 Gbps)"
            paths += figure3(rows, published, mode, figures / f"{exp.name}_{_slug(mode)}", label,
                             _subtitle(exp, mode))
    elif exp.figure == "distir_fig4":
        from paraplan.plots.distir import figure4

        baseline = None
        if published is not None:
            one = published[(published["devices"] == 1) & (published["microbatches"] == 1)]
            baseline = float(one["throughput"].iloc[0]) if not one.empty else None
        for mode in modes:
            note = _subtitle(exp, mode)
            if mode == "corrected":
                note = note[:-1] + ", speedup over one device without transfers)"
            paths += figure4(rows, published, mode, figures / f"{exp.name}_{_slug(mode)}", baseline, note)
    elif exp.figure == "gantt":
        paths += _gantt_and_traces(result, figures, traces)
    return paths


def _gantt_and_traces(result, figures: Path, traces: Path) -> list[Path]:
    """A Gantt chart (seed 001's style) and a Chrome trace per simulated timeline; only
    the charts are returned for logging."""
    from paraplan.files import write_json
    from paraplan.plots.gantt import save_gantt
    from paraplan.sim import to_chrome_trace

    paths: list[Path] = []
    for sim in result.simulated:
        pt = sim.point
        stem = f"{pt.series}_b{pt.batch_size}_m{pt.microbatches}_it{pt.iterations}"
        title = (f"{pt.series}: {pt.P} stages, {pt.iterations} iteration(s), batch {pt.batch_size}, "
                 f"{pt.microbatches} micro-batches")
        paths += save_gantt(sim.timeline, figures / stem, title=title)
        write_json(traces / f"{stem}.json", to_chrome_trace(sim.timeline))
    return paths


def _subtitle(exp, mode: str) -> str:
    return f"({exp.modes[mode].bandwidth_gbps:g} Gbps)"


def _slug(mode: str) -> str:
    """`distir-v0.1` -> `distir_v0_1` (a dot would read as a file suffix)."""
    return mode.replace("-", "_").replace(".", "_")


def _runlog(exp, result, rows, summary, artifacts):
    from paraplan.track import RunLog

    children = []
    for rec in rows.to_dict("records"):
        name = (f"{rec['mode']}/{rec['series']}/D{rec['D']}T{rec['T']}P{rec['P']}"
                f"M{rec['microbatches']}/b{rec['batch_size']}")
        params = {k: rec[k] for k in ("mode", "series", "D", "T", "P", "microbatches", "schedule",
                                      "batch_size", "devices")}
        metrics = {k: rec[k] for k in ("step_time_s", "throughput", "speedup", "bubble_fraction",
                                       "peak_mem_bytes") if _is_number(rec[k])}
        children.append(RunLog("simulate", name, params=params, metrics=metrics))
    params = {"experiment": exp.name, "experiment_file": exp.path, "modes": ",".join(result.simulate_s_by_mode),
              "repeats": result.repeats, "figure": exp.figure}
    for mode, settings in exp.modes.items():
        params[f"mode.{mode}"] = {k: getattr(settings, k) for k in settings.__dataclass_fields__}
    return RunLog("simulate", exp.name, params=params, metrics=summary,
                  artifacts=artifacts,
                  children=children)


def _is_number(value) -> bool:
    import math

    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(float(value))
