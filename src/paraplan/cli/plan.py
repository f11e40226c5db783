"""Plan hybrid pipeline x data parallelism (DAPPLE-style) for a model on a cluster, for
one or many global batch sizes: the data-parallel baselines (no overlap, normal
overlap, P3; gradient accumulation where memory requires) and the best hybrid plan of
an exact search, re-timed with the simulator.

Writes a CSV (gbs, dp_no_overlap, dp_p3, dp_overlap, best_hybrid, stages,
planning_time_s, and the planner's estimates *_est); speedups are over one device.

Examples:
  paraplan plan --profile ../shared/data/pipedream-profiles/vgg-19-pbs-32.txt \
      --cluster dgx1-v100 --shape 2x8 --gbs 32,64,128 -o vgg.csv
  paraplan plan --profile results/profiles/mlp.csv --cluster local-cpu \
      --comm-model results/fits/local-cpu/comm_model.json --gbs 8,16,32 -o mlp.csv
  paraplan plan --experiment dapple_resnet50 -o results/plans/dapple_resnet50
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path

from paraplan.cli.common import (
    add_output_argument,
    add_tracking_arguments,
    deprecated,
    warn_deprecated,
)

NAME = "plan"
HELP = "plan hybrid pipeline x data parallelism over global batch sizes (DAPPLE-style)"
ORDER = 50


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("what to plan")
    src.add_argument("--profile", type=Path, metavar="FILE",
                     help="layer profile: paraplan CSV or PipeDream TorchGraph .txt")
    src.add_argument("--pbs", type=int, default=None,
                     help="profile batch size (PipeDream text: default from '-pbs-N' in the name; CSV: its meta)")
    src.add_argument("--experiment", default=None, metavar="NAME|FILE",
                     help="a planning study (dapple_resnet50, or a YAML file); -o is then a folder")
    hw = parser.add_argument_group("cluster and communication")
    hw.add_argument("--cluster", default="dgx1-v100", action=_ClusterOrOldShape, metavar="NAME|FILE",
                    help="cluster name (config/clusters/<name>.yaml) or YAML path: device memory and links")
    hw.add_argument("--shape", default="", metavar="NxG",
                    help="NODESxDEVICES, e.g. 2x8 (16x1: flat); default: the cluster's own shape")
    deprecated(hw, "--cluster-file", "--cluster", "cluster")
    hw.add_argument("--comm-model", type=Path, default=None,
                    help="fitted comm_model.json (paraplan fit); default: DAPPLE's formulas at the cluster "
                         "file's link bandwidths (dgx1-v100: 25 GB/s inside, 3 GB/s across)")
    bs = parser.add_argument_group("batch sizes")
    bs.add_argument("--gbs", default="", help="global batch sizes, e.g. 32,64,128")
    bs.add_argument("--gbs-range", default="",
                    help="A:B:S = A, then every multiple of S in (A, B]; 32:4096:64 is 65 sizes")
    bs.add_argument("--mbs", type=int, default=None,
                    help="smallest micro-batch of one pipeline copy (default: the profile batch size)")
    mem = parser.add_argument_group("memory per device")
    mem.add_argument("--memory-gb", type=float, default=None, help="default: the cluster file's device memory")
    mem.add_argument("--optimizer-factor", type=float, default=2.0,
                     help="model state (weights + gradients + optimizer state) in parameter bytes; DAPPLE: 2")
    mem.add_argument("--peak-activation-bytes-per-sample", type=float, default=None,
                     help="whole-model activation bytes per sample (DAPPLE ResNet-50: 7e7); "
                          "default: the profile's activation bytes")
    search = parser.add_argument_group("search")
    search.add_argument("--max-pipeline-devices", type=int, default=0,
                        help="widest pipeline copy searched (0: all devices)")
    search.add_argument("--candidates", type=int, default=3,
                        help="best plans re-timed with the simulator (the best simulated one is reported)")
    search.add_argument("--jobs", type=int, default=0, help="processes for the batch-size sweep (0: all cores)")
    add_output_argument(parser, "plan CSV (with --experiment: a folder for <name>__<layout>.csv)")
    parser.add_argument("--plots", type=Path, default=None, metavar="DIR",
                        help="folder for the speedup figure (PNG + PDF), named after the CSV")
    add_tracking_arguments(parser)


_SHAPE = re.compile(r"^\d+x\d+$")


class _ClusterOrOldShape(argparse.Action):
    """`--cluster NAME`; the old `--cluster NxG` (a shape, before --shape existed) still
    sets the shape, with a warning."""

    def __call__(self, parser, namespace, values, option_string=None):
        if _SHAPE.match(values):
            warn_deprecated(parser.prog, f"--cluster {values}", f"--shape {values}")
            namespace.shape = values
        else:
            namespace.cluster = values


def _load_profile(path: Path, pbs: int | None):
    if path.suffix == ".txt":
        from paraplan.profile.pipedream import read_pipedream

        return read_pipedream(path, pbs)
    from paraplan.profile.io import read_profile

    return read_profile(path, pbs)


def _settings(profile, cluster, comm_path, memory_gb, optimizer_factor, peak, mbs, max_devices, candidates):
    from paraplan.plan.comm_constants import DappleConstantsModel
    from paraplan.plan.problem import MemorySettings
    from paraplan.plan.sweep import PlanSettings

    if comm_path is not None:
        from paraplan.comm.model import FittedCommModel

        comm = FittedCommModel.from_json(comm_path)
    else:
        comm = DappleConstantsModel(cluster.intra.bandwidth_Bps, cluster.inter.bandwidth_Bps)
    memory = MemorySettings(
        memory_bytes=(memory_gb * 1e9) if memory_gb is not None else cluster.device.memory_bytes,
        optimizer_factor=optimizer_factor,
        peak_activation_bytes_per_sample=peak,
    )
    return PlanSettings(profile, cluster, comm, memory, mbs or profile.batch_size, max_devices, candidates)


def _check(args: argparse.Namespace) -> None:
    from paraplan.core import ConfigError

    for key in ("mbs", "pbs"):
        value = getattr(args, key)
        if value is not None and value < 1:
            raise ConfigError(f"--{key}", f"must be >= 1, got {value}")
    if args.jobs < 0:
        raise ConfigError("--jobs", f"must be >= 0, got {args.jobs}")
    if args.candidates < 1:
        raise ConfigError("--candidates", f"must be >= 1, got {args.candidates}")
    if args.max_pipeline_devices < 0:
        raise ConfigError("--max-pipeline-devices", "must be >= 0")


def _run_one(args, settings, sizes, csv_path: Path, plots: Path | None, title: str):
    import pandas as pd

    from paraplan.files import write_csv
    from paraplan.plan.sweep import COLUMNS, plan_sweep
    from paraplan.progress import bar

    start = time.perf_counter()
    with bar(len(sizes), f"plan {csv_path.stem}", "gbs") as progress:
        rows = plan_sweep(settings, sizes, args.jobs, on_done=progress.update)
    wall = time.perf_counter() - start
    if all(r.infeasible for r in rows):
        from paraplan.plan.search import NoFeasiblePlanError

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
              f"P3 {r.dp_p3:6.2f} (est {r.dp_p3_est:6.2f}) | hybrid {r.best_hybrid:6.2f} (est {r.best_hybrid_est:6.2f}, "
              f"{diff:+.1%}) {r.stages}", file=sys.stderr)
    print(f"paraplan plan: {len(rows)} batch sizes in {wall:.2f} s -> {csv_path}", file=sys.stderr)
    return rows, wall, figures


def _runlog(args, rows, wall, csv_path, figures, params):
    from paraplan.plan.sweep import COLUMNS
    from paraplan.track import RunLog

    numeric = [c for c in COLUMNS if c not in ("gbs", "stages")]
    children = []
    for r in rows:
        rec = r.as_record()
        children.append(RunLog(
            stage="plan", run_name=f"{csv_path.stem}__gbs{r.gbs}",
            params={"gbs": r.gbs, "stages": r.stages, "microbatches": r.microbatches,
                    "accumulation_steps": r.accumulation_steps},
            metrics={**{c: rec[c] for c in numeric if not math.isnan(rec[c])},
                     "hybrid_est_vs_sim": r.hybrid_est_vs_sim},
        ))
    step_metrics = {c: [(r.gbs, r.as_record()[c]) for r in rows] for c in numeric}
    metrics = {"sweep_wall_s": wall, "planning_time_s": sum(r.planning_time_s for r in rows)}
    return RunLog(stage="plan", run_name=csv_path.stem, params=params, metrics=metrics,
                  step_metrics=step_metrics, artifacts=[csv_path, *figures], children=children)


def run(args: argparse.Namespace) -> int:
    from paraplan.cli.common import track
    from paraplan.clusters import load_cluster
    from paraplan.core import ConfigError
    from paraplan.plan.inputs import parse_cluster_shape, parse_gbs_list, parse_gbs_range

    _check(args)
    if args.experiment is not None:
        return _run_experiment(args)
    if args.profile is None:
        raise ConfigError("--profile", "give a profile (or --experiment FILE)")
    if bool(args.gbs) == bool(args.gbs_range):
        raise ConfigError("--gbs", "give exactly one of --gbs and --gbs-range")
    sizes = parse_gbs_list(args.gbs, "--gbs") if args.gbs else parse_gbs_range(args.gbs_range, "--gbs-range")
    cluster = load_cluster(args.cluster)
    if args.shape:
        cluster = cluster.with_shape(*parse_cluster_shape(args.shape, "--shape"))
    profile = _load_profile(args.profile, args.pbs)
    settings = _settings(profile, cluster, args.comm_model, args.memory_gb, args.optimizer_factor,
                         args.peak_activation_bytes_per_sample, args.mbs, args.max_pipeline_devices,
                         args.candidates)
    shape = f"{cluster.nodes}x{cluster.devices_per_node}"
    title = f"{profile.name} on {cluster.name} ({shape})"
    rows, wall, figures = _run_one(args, settings, sizes, args.output, args.plots, title)
    params = {
        "profile": str(args.profile), "cluster_file": args.cluster, "cluster": shape,
        "comm_model": str(args.comm_model) if args.comm_model else "dapple_constants",
        "memory_bytes": settings.memory.memory_bytes, "optimizer_factor": args.optimizer_factor,
        "peak_activation_bytes_per_sample": args.peak_activation_bytes_per_sample,
        "mbs": settings.min_microbatch, "gbs": sizes, "jobs": args.jobs, "candidates": args.candidates,
    }
    track(args, _runlog(args, rows, wall, args.output, figures, params))
    return 0


def _run_experiment(args: argparse.Namespace) -> int:
    from paraplan.cli.common import track
    from paraplan.clusters import load_cluster
    from paraplan.config_files import find
    from paraplan.plan.experiment import load_plan_experiment

    exp = load_plan_experiment(find("experiments", args.experiment))
    profile = _load_profile(exp.profile, exp.pbs)
    base = load_cluster(exp.cluster_file)
    for nodes, per_node in exp.layouts:
        cluster = base.with_shape(nodes, per_node)
        settings = _settings(profile, cluster, args.comm_model, exp.memory_gb, exp.optimizer_factor,
                             exp.peak_activation_bytes_per_sample, exp.mbs, exp.max_pipeline_devices,
                             exp.candidates)
        shape = f"{nodes}x{per_node}"
        csv_path = args.output / f"{exp.name}__{shape}.csv"
        plots = args.plots or args.output
        title = f"{exp.name}: {profile.name} on {cluster.name} ({shape})"
        rows, wall, figures = _run_one(args, settings, list(exp.batch_sizes), csv_path, plots, title)
        params = {
            "experiment": str(args.experiment), "profile": str(exp.profile), "cluster_file": exp.cluster_file,
            "cluster": shape, "comm_model": str(args.comm_model) if args.comm_model else "dapple_constants",
            "memory_bytes": settings.memory.memory_bytes, "optimizer_factor": exp.optimizer_factor,
            "peak_activation_bytes_per_sample": exp.peak_activation_bytes_per_sample,
            "mbs": settings.min_microbatch, "gbs": list(exp.batch_sizes), "jobs": args.jobs,
        }
        track(args, _runlog(args, rows, wall, csv_path, figures, params))
    return 0
