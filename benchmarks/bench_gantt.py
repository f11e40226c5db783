"""Drawing speed of the Gantt charts (`paraplan.plots.gantt.save_gantt`, PNG + PDF).

Simulates the `schedules` study once (18 timelines, the reference charts of
docs/pipeline-schedules.md) and, optionally, the run table `config/runs/llm_a100.csv` on
dgx-a100 (transformer timelines of up to ~25,000 compute events), then draws and saves
every chart into a temporary folder, best of `--repeats`: wall and CPU time of the drawing
alone (no start-up, no simulation) and the chart with the most events.

    python benchmarks/bench_gantt.py [--repeats 3] [--runs]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from paraplan.core import Timeline
from paraplan.plots.gantt import save_gantt
from paraplan.studies import simulate as st

REPO_ROOT = Path(__file__).resolve().parent.parent
Chart = tuple[str, Timeline, float, str | None]
"""A file stem, its timeline, the time unit in seconds and the unit's name (None: steps)."""


def schedule_timelines() -> list[Chart]:
    study = st.load_study(REPO_ROOT / "config/studies/simulate/schedules.yaml")
    result = st.run_study(study, repeats=1)
    return [(f"{sim.configuration.series}_{i}", sim.timeline, 1.0, None) for i, sim in enumerate(result.simulated)]


def run_table_timelines() -> list[Chart]:
    from paraplan.cli.simulate import MAX_GANTT_EVENTS, _time_unit
    from paraplan.clusters import load_cluster
    from paraplan.predict.calibration import calibration_for
    from paraplan.predict.runtable import read_run_table
    from paraplan.predict.timelines import run_timelines

    cluster = load_cluster("dgx-a100")
    calibration = calibration_for(cluster, None, warn=lambda m: None)
    runs_file = REPO_ROOT / "config/runs/llm_a100.csv"
    _, rows = read_run_table(runs_file)
    charts: list[Chart] = []
    for i, run in enumerate(run_timelines(rows, cluster, calibration.comm_model(cluster), calibration.efficiency,
                                          str(runs_file))):
        timeline = run.result.timeline
        if timeline is not None and timeline.num_events <= MAX_GANTT_EVENTS:
            charts.append((f"run{i}", timeline, *_time_unit(run.result.iteration_s)))
    return charts


def draw_all(charts: list[Chart], folder: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, slowest chart's wall s) to draw and save every chart."""
    wall0, cpu0, slowest = time.perf_counter(), time.process_time(), 0.0
    for stem, timeline, unit_s, unit_name in charts:
        t0 = time.perf_counter()
        save_gantt(timeline, folder / stem, time_unit_s=unit_s, unit_name=unit_name)
        slowest = max(slowest, time.perf_counter() - t0)
    return time.perf_counter() - wall0, time.process_time() - cpu0, slowest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runs", action="store_true", help="also the run table's transformer timelines")
    args = parser.parse_args(argv)
    sets = [("schedules study", schedule_timelines())]
    if args.runs:
        sets.append(("llm_a100.csv runs", run_table_timelines()))
    with tempfile.TemporaryDirectory() as tmp:
        for name, charts in sets:
            events = max(int((tl.stream == 0).sum()) for _, tl, _, _ in charts)
            best = min((draw_all(charts, Path(tmp)) for _ in range(args.repeats)), key=lambda t: t[0])
            print(f"{name:18s} {len(charts):3d} charts (largest {events:6d} compute events)  best of "
                  f"{args.repeats}: {best[0]:6.2f} s wall, {best[1]:6.2f} s CPU, slowest chart {best[2]:5.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
