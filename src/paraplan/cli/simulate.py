"""Simulate a named study (config/studies/simulate/<name>.yaml): every configuration
of its sweep in each of its modes (`distir-v0.1`: DistIR's own semantics, to
reproduce the DistIR paper; `corrected`: paraplan's physical engine). Or (--runs) the
iterations of a run table's transformer runs on a cluster with a calibration: the
timeline of each (`paraplan predict` gives their numbers), as Chrome traces and Gantt
charts of the pipeline ranks.

Writes DIR/results.csv (one row per configuration), DIR/timing.json (simulate_s:
simulation wall time only, best of --repeats), DIR/published_comparison.csv when the
study names published numbers that exist, the figures (PNG + PDF, in --plots,
default DIR/figures) and, for Gantt studies, DIR/traces/*.json (Chrome trace,
opens in Perfetto). A study is a name (config/studies/simulate/<name>.yaml here, in
the checkout, or the copy the package carries) or a YAML path.

Examples:
  paraplan simulate --study schedules -o results/simulations/schedules
  paraplan simulate --runs config/runs/llm_a100.csv --cluster dgx-a100 -o results/simulations/llm_a100
  paraplan simulate --study config/studies/simulate/distir_fig3.yaml -o out/fig3 --modes corrected
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from paraplan.cli.common import (
    add_output_argument,
    add_tracking_arguments,
    deprecated,
    name_list,
    track,
)

if TYPE_CHECKING:
    import pandas as pd

    from paraplan.studies.simulate_study import SimulateStudy

NAME = "simulate"
HELP = "simulate strategies of a named study (DistIR figures, pipeline schedules)"
ORDER = 40


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--study", default=None, metavar="NAME|FILE",
                        help="study name (distir_fig3, distir_fig4, schedules, ...) or YAML file")
    deprecated(parser, "--experiment", "--study", "study")
    runs = parser.add_argument_group("transformer runs (instead of a study)")
    runs.add_argument("--runs", type=Path, default=None, metavar="FILE",
                      help="run table (see paraplan predict --help): one timeline per row")
    runs.add_argument("--cluster", default=None, metavar="NAME|FILE", help="cluster of the runs (with --runs)")
    runs.add_argument("--calibration", default=None,
                      help="calibration name or file (default: as paraplan predict, the shipped one made for "
                           "the cluster's device, else a100-vtrain with a warning; with --runs)")
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


MAX_GANTT_EVENTS = 50_000  # larger timelines get a trace only


def _time_unit(span_s: float) -> tuple[float, str]:
    """The largest of s, ms, us that puts at least 2 units across `span_s`."""
    for unit_s, name in ((1.0, "s"), (1e-3, "ms")):
        if span_s >= 2 * unit_s:
            return unit_s, name
    return 1e-6, "us"


def _run_tables(args: argparse.Namespace) -> int:
    """Timelines of a run table's iterations (--runs)."""
    from paraplan.clusters import load_cluster
    from paraplan.core import ConfigError, InputFileError
    from paraplan.core.names import file_stems
    from paraplan.files import check_outputs, write_json
    from paraplan.plots.gantt import save_gantt
    from paraplan.predict.calibration import calibration_for
    from paraplan.predict.runtable import read_run_table
    from paraplan.predict.timelines import run_timelines
    from paraplan.sim import to_chrome_trace
    from paraplan.track import RunLog

    if args.cluster is None:
        raise ConfigError("--cluster", "needed with --runs (e.g. dgx-a100)")
    check_outputs([args.output / "timelines.json"])
    cluster = load_cluster(args.cluster)
    calibration = calibration_for(cluster, args.calibration,
                                  warn=lambda m: print(f"paraplan simulate: warning: {m}", file=sys.stderr))
    comm = calibration.comm_model(cluster)
    _, rows = read_run_table(args.runs)
    stems, collision = file_stems(row.name for row in rows)
    if collision:
        raise InputFileError(args.runs, f"run names {collision} (traces/<name>.json)", field="column 'name'")
    timelines = run_timelines(rows, cluster, comm, calibration.efficiency, str(args.runs))
    figures = args.plots if args.plots is not None else args.output / "figures"
    summary, artifacts = [], []
    for run, stem in zip(timelines, stems, strict=True):
        result = run.result
        assert result.timeline is not None
        trace = args.output / "traces" / f"{stem}.json"
        write_json(trace, to_chrome_trace(result.timeline))
        if not args.no_plots and result.timeline.num_events <= MAX_GANTT_EVENTS:
            unit_s, unit_name = _time_unit(result.iteration_s)
            artifacts += save_gantt(result.timeline, figures / stem, title=run.title, time_unit_s=unit_s,
                                    unit_name=unit_name)
        summary.append({"name": run.name, "iteration_s": result.iteration_s, "bubble_fraction": result.bubble_fraction,
                        "events": result.timeline.num_events, "trace": str(trace)})
    write_json(args.output / "timelines.json", {"calibration": calibration.label, "cluster": cluster.name,
                                                "runs": summary})
    print(f"paraplan simulate: {len(rows)} run(s) of {args.runs} with {calibration.label} -> {args.output}",
          file=sys.stderr)
    track(args, RunLog(stage="simulate", run_name=args.runs.stem,
                       params={"runs": str(args.runs), "cluster": cluster.name, "calibration": calibration.label},
                       metrics={"runs": float(len(rows))},
                       artifacts=[args.output / "timelines.json", *artifacts]))
    return 0


def run(args: argparse.Namespace) -> int:
    from paraplan.cli.common import study_path
    from paraplan.core import ConfigError
    from paraplan.files import write_csv, write_json
    from paraplan.progress import bar
    from paraplan.studies import simulate as st
    from paraplan.studies.simulate_report import simulate
    from paraplan.studies.simulate_study import MODES

    if (args.study is None) == (args.runs is None):
        raise ConfigError("--study", "give a study (--study NAME) or a run table (--runs FILE)")
    if args.runs is not None:
        return _run_tables(args)
    if args.repeats < 1:
        raise ConfigError("--repeats", f"must be >= 1, got {args.repeats}")
    study_file = study_path("simulate", args.study)
    study = st.load_study(study_file)
    modes = tuple(name_list(args.modes, "--modes", MODES)) if args.modes.strip() else ()
    chosen = [m for m in (modes or study.modes.names) if m in study.modes.names]
    published, note = _published(study, study_file)
    total = sum(len(st.mode_configurations(study, m)) for m in chosen)
    with bar(total, f"simulate {study.name}", "config") as progress:
        report = simulate(study, modes, args.repeats, published, note, on_point=progress.update)  # type: ignore[arg-type]
    out: Path = args.output
    write_csv(out / "results.csv", report.rows)
    write_json(out / "timing.json", report.timing)
    artifacts = [out / "results.csv", out / "timing.json"]
    if report.comparison is not None:
        write_csv(out / "published_comparison.csv", report.comparison)
        artifacts.append(out / "published_comparison.csv")
    for line in report.comparison_lines():
        print(f"paraplan simulate: {line}", file=sys.stderr)
    if not args.no_plots:
        figures = args.plots if args.plots is not None else out / "figures"
        artifacts.extend(_figures(study, report.result, report.rows, published, figures, out / "traces"))
    print(f"paraplan simulate: {study.name}: {len(report.rows)} configurations, "
          f"simulate_s {report.result.simulate_s:.4f} (best of {report.result.repeats}) -> {out}", file=sys.stderr)
    track(args, _runlog(study, study_file, report.result, report.rows, report.summary, artifacts))
    return 0


def _published(study: SimulateStudy, study_file: Path) -> tuple[pd.DataFrame | None, str]:
    """The study's published numbers, read from the study's root (paraplan.studies.paths);
    None: it names none, or their file is missing: then a note for timing.json, and a warning
    naming the study and the path tried."""
    from paraplan.studies import published as pb
    from paraplan.studies.paths import missing, resolve

    if study.published is None:
        return None, ""
    source = resolve(study_file, study.published.file)
    if not source.is_file():
        print(f"paraplan simulate: warning: {missing(study_file, ('published', 'file'), study.published.file)}; "
              "no comparison", file=sys.stderr)
        return None, f"not compared: {study.published.file} not found"
    return pb.load_published(source, study.published.format), ""


def _figures(study, result, rows, published, figures: Path, traces: Path) -> list[Path]:
    paths: list[Path] = []
    modes = list(dict.fromkeys(rows["mode"]))
    if study.figure == "distir_fig3":
        from paraplan.plots.distir import figure3

        for mode in modes:
            label = "published (DistIR v0.1)" if mode == "distir-v0.1" else "DistIR 83d7fc3 (4800 Gbps)"
            paths += figure3(rows, published, mode, figures / f"{study.name}_{_slug(mode)}", label,
                             _subtitle(study, mode))
    elif study.figure == "distir_fig4":
        from paraplan.plots.distir import figure4

        baseline = None
        if published is not None:
            one = published[(published["devices"] == 1) & (published["microbatches"] == 1)]
            baseline = float(one["throughput"].iloc[0]) if not one.empty else None
        for mode in modes:
            note = _subtitle(study, mode)
            if mode == "corrected":
                note = note[:-1] + ", speedup over one device without transfers)"
            paths += figure4(rows, published, mode, figures / f"{study.name}_{_slug(mode)}", baseline, note)
    elif study.figure == "gantt":
        paths += _gantt_and_traces(result, figures, traces)
    return paths


def _gantt_and_traces(result, figures: Path, traces: Path) -> list[Path]:
    """A Gantt chart (the style of docs/pipeline-schedules.md's reference charts) and a
    Chrome trace per simulated timeline; only the charts are returned for logging."""
    from paraplan.files import write_json
    from paraplan.plots.gantt import save_gantt
    from paraplan.sim import to_chrome_trace

    paths: list[Path] = []
    for sim in result.simulated:
        conf = sim.configuration
        s = conf.strategy
        stem = f"{conf.series}_b{conf.global_batch_size}_m{s.num_microbatches}_it{s.iterations}"
        title = (f"{conf.series}: {s.pipeline_model_parallel_size} stages, {s.iterations} iteration(s), "
                 f"batch {conf.global_batch_size}, {s.num_microbatches} micro-batches")
        paths += save_gantt(sim.timeline, figures / stem, title=title)
        write_json(traces / f"{stem}.json", to_chrome_trace(sim.timeline))
    return paths


def _subtitle(study, mode: str) -> str:
    return f"({study.mode(mode).bandwidth_Gbit_per_s:g} Gbps)"


def _slug(mode: str) -> str:
    """`distir-v0.1` -> `distir_v0_1` (a dot would read as a file suffix)."""
    return mode.replace("-", "_").replace(".", "_")


def _runlog(study, study_file, result, rows, summary, artifacts):
    """One run for the study: its settings, summary metrics, figures, and the
    configurations (the rows of results.csv) as a table whose metric columns are
    logged with step = the row's index."""
    from paraplan.track import RunLog, Table

    params = {"study": study.name, "study_file": str(study_file), "modes": ",".join(result.simulate_s_by_mode),
              "repeats": result.repeats, "figure": study.figure}
    for mode in study.modes.names:
        settings = study.mode(mode)
        params[f"mode.{mode}"] = {k: getattr(settings, k) for k in settings.__dataclass_fields__}
    table = Table(rows=rows.to_dict("records"),
                  metrics=("step_time_s", "throughput", "speedup", "bubble_fraction", "peak_mem_bytes"))
    return RunLog("simulate", study.name, params=params, metrics=summary, artifacts=artifacts, table=table)
