"""Fit communication cost models to measured sweeps, with honest errors.

Reads bench CSVs (`paraplan bench` or `paraplan ingest` output) and fits, per
collective x world size x node count, three models of time vs size: `alpha_beta`
(Hockney, relative-error least squares), `sigmoid_bw` (Lin et al.'s three-region
bandwidth model, bounded with a fallback) and `table` (PCHIP in log-log). Each is
scored in-sample and leave-one-out over the interior sizes; the lowest held-out
GMAE is `chosen`. Writes comm_model.json (docs/design.md), which
`paraplan.comm.model.FittedCommModel` reads. all_to_allv rows (uneven DLRM-style
exchanges) are predicted from the all_to_all fit of the same world size with three
effective sizes (sum, max_of_max, max_of_sum) and their errors reported.

MLflow (experiment paraplan-fit): one run per fit with a table of its sweeps
(`sweeps.json`, one row per `<collective>_n<world>`) whose error columns
(`heldout_gmae__<model>`, `chosen_heldout_gmae`, ...) are also metrics with step = the
sweep's row, so the UI plots every sweep's errors side by side.

With `--cluster NAME` (a cluster file with a `network` section), the sweeps across
nodes also fit the per-NIC rail curve of the topology-aware collectives
(`paraplan.comm.fit_rail`, one alpha-beta per node count, sizes >= 1 MiB, the
cluster's intra-node link for the NVLink stages): written as `rail_fits` in
comm_model.json and printed as the lines to paste under the cluster file's `network:`.

With --kind kernels, the inputs are GEMM and attention CSVs (`paraplan bench --kind
gemm|attention`, data/published/gemm|attention), --cluster names the device's cluster
file (peaks, compute units), and the output is the device's kernel ceilings
(config/kernels/<device>.json): the device model's GEMM curve (ceiling, wave
quantisation over the cluster file's compute units, small-k penalty) and attention
efficiencies, each with its held-out error (docs/kernels.md).

Examples:
  paraplan fit results/collectives/local-cpu/*.csv -o comm_model.json --plots figs/  # after `paraplan bench`
  paraplan ingest --format nccl-tests data/nccl-tests/10_h100_ndr400_2x8_all_reduce.txt -o h100_2x8.csv
  paraplan fit h100_2x8.csv --cluster dgx-h100 -o h100_comm_model.json
  paraplan fit --kind kernels data/published/gemm/mamf_best_shapes_bf16.csv \\
      data/published/attention/flash2_fwd_bwd.csv --cluster dgx-a100 -o a100_kernels.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from paraplan.cli.common import add_output_argument, add_tracking_arguments, deprecated, track
from paraplan.core import ConfigError, InputFileError

if TYPE_CHECKING:
    from paraplan.comm.fit_report import FitReport

NAME = "fit"
HELP = "fit alpha-beta, sigmoid-bandwidth and table models to collective sweeps, or kernel ceilings"
ORDER = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", type=Path, metavar="IN.csv",
                        help="bench CSVs (several collectives allowed)")
    add_output_argument(parser, "output comm_model.json", old=["--out"])
    parser.add_argument("--plots", type=Path, default=None, metavar="DIR",
                        help="folder for figures: fit_<collective>_n<world>.png/.pdf per sweep, a2av_n<world> "
                             "per all_to_allv study")
    parser.add_argument("--a2av-output", type=Path, default=None, metavar="PATH",
                        help="CSV of the all_to_allv errors per world size and effective-size variant "
                             "(needs all_to_allv rows in the inputs)")
    deprecated(parser, "--a2av-out", "--a2av-output", "a2av_output", convert=Path)
    parser.add_argument("--cluster", default=None, metavar="NAME",
                        help="cluster the sweeps ran on (name or YAML with a `network` section): also fit the "
                             "per-NIC rail curve of the sweeps across nodes (rail_fits); --kind kernels: the "
                             "device's cluster file (peaks and compute units)")
    parser.add_argument("--kind", choices=("collectives", "kernels"), default="collectives",
                        help="what the inputs measure: collective sweeps, or GEMM/attention kernels")
    parser.add_argument("--device", default=None, help="kernels: the device rows to fit (default: the cluster's)")
    parser.add_argument("--gemm-dtype", default="bfloat16", help="kernels: the GEMM rows' dtype to fit")
    parser.add_argument("--min-gemm-flops", type=float, default=1e10,
                        help="kernels: GEMMs with fewer FLOPs are left out of the fit (their error is reported)")
    parser.add_argument("--gemm-latency-s", type=float, default=None,
                        help="kernels: hold the GEMM fit's kernel_latency_s at this value instead of fitting it "
                             "(for shapes all far above the latency, where it cannot be told from the tile tail)")
    parser.add_argument("--attention-kernel", default="flash-attention-2",
                        help="kernels: the attention rows' kernels (the end of their source column), "
                             "comma-separated; the first is the one calibrations hold (attention_backend auto), "
                             "the others are priced for runs whose attention_backend runs them")
    parser.add_argument("--attention-head-dim", default="128",
                        help="kernels: the head dimensions of the attention rows to fit (causal rows only), "
                             "comma-separated; the first is the main fit, each further one d adds every "
                             "kernel again as attention_kernels['<kernel>@hdim<d>'] (docs/kernels.md)")
    parser.add_argument("--sustained-from", default=None, metavar="DEVICE",
                        help="kernels: the device whose sustained-GEMM rows (sustained/burst throughput at the "
                             "power limit) scale the GEMM and attention ceilings of the dtypes the fitted device "
                             "has no rows of (its own rows come first). Only a device of the same die at the same "
                             "power limit (docs/kernels.md)")
    add_tracking_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from paraplan.clusters import load_cluster
    from paraplan.comm.fit_a2av import a2av_frame, sample_rows
    from paraplan.comm.fit_input import read_sweeps
    from paraplan.comm.fit_report import fit_sweeps
    from paraplan.files import check_outputs, write_csv, write_json
    from paraplan.track import RunLog, Table

    if args.kind == "kernels":
        from paraplan.cli._kernel_fit import run_kernel_fit

        return run_kernel_fit(args)
    if args.device is not None:
        raise ConfigError("--device", "applies to --kind kernels only")
    if args.sustained_from is not None:
        raise ConfigError("--sustained-from", "applies to --kind kernels only")
    check_outputs(files=[args.output, args.a2av_output], folders=[args.plots])
    frame = read_sweeps(args.inputs)
    samples = sample_rows(frame)
    if samples.all():
        raise InputFileError(args.inputs[0], "no size sweeps to fit (only all_to_allv samples); add the all_to_all CSV")
    if args.a2av_output is not None and not samples.any():
        raise InputFileError(args.inputs[0], "--a2av-output given but no input has all_to_allv rows")
    cluster = None if args.cluster is None else load_cluster(args.cluster)
    report = fit_sweeps(frame, cluster, args.inputs[0], str(args.output),
                        warn=lambda m: print(f"paraplan fit: warning: {m}", file=sys.stderr))
    # Outputs first, tracking last: a tracking failure leaves the files intact.
    write_json(args.output, report.document)
    if args.a2av_output is not None:
        write_csv(args.a2av_output, a2av_frame(list(report.a2av)))
    figures = [] if args.plots is None else _figures(report, frame.loc[~samples], args.plots, str(args.output))
    _say(report, args)
    per_sweep, keys, chosen = report.sweep_metrics()
    # one row per fitted sweep: which sweep, its chosen model, and its errors (logged
    # as metrics with step = the row's index, so the UI plots every sweep's error)
    rows = [{**_sweep_params(name, keys[name], chosen.get(name)), **sweep} for name, sweep in per_sweep.items()]
    columns = list(dict.fromkeys(key for sweep in per_sweep.values() for key in sweep))
    artifacts = [args.output, *figures, *([args.a2av_output] if args.a2av_output is not None else [])]
    track(args, RunLog(stage="fit", run_name=args.output.parent.name or "fit",
                       params={"inputs": [str(p) for p in args.inputs], "chosen": chosen}, metrics=report.summary(),
                       artifacts=artifacts, table=Table(rows=rows, metrics=columns, name="sweeps")))
    return 0


def _say(report: FitReport, args: argparse.Namespace) -> None:
    for line in report.table_lines():
        print(line, file=sys.stderr)
    print(f"paraplan fit: {len(report.names)} sweep(s) fitted -> {args.output}", file=sys.stderr)
    if report.rails:
        print(f"paraplan fit: rail curve of {args.cluster}; under its cluster file's `network:`\n  rail_fits:",
              file=sys.stderr)
        for line in report.rail_lines():
            print(line, file=sys.stderr)


def _figures(report: FitReport, sweeps, plots: Path, source: str) -> list[Path]:
    """fit_<sweep> per fitted sweep (`sweeps`: the bench rows without all_to_allv
    samples), a2av_n<world> per all_to_allv study."""
    import numpy as np

    from paraplan.comm.model import FittedCommModel
    from paraplan.core import Group
    from paraplan.plots.fit import plot_a2av, plot_sweep

    figures: list[Path] = []
    for key, name in report.names.items():
        rows = sweeps.loc[
            (sweeps["collective"] == key[0]) & (sweeps["world_size"] == key[1]) & (sweeps["nodes"] == key[2])
        ]
        sweep_entries = [e for e in report.entries if (e.collective, e.world_size, e.nodes) == key]
        figures += plot_sweep(sweep_entries, rows["size_bytes"].to_numpy(float),
                              rows["time_us"].to_numpy(float) * 1e-6, plots / f"fit_{name}")
    model = FittedCommModel.from_dict(report.document, source)
    for world, nodes in sorted({(r.world_size, r.nodes) for r in report.a2av}):
        group_results = [r for r in report.a2av if (r.world_size, r.nodes) == (world, nodes)]
        sizes = np.concatenate([np.array(r.effective_size_bytes, float) for r in group_results])
        grid = np.geomspace(sizes.min(), sizes.max(), 200)
        curve = np.array([model.time_s("all_to_allv", s, Group(world, nodes)) for s in grid])
        suffix = f"_nodes{nodes}" if nodes > 1 else ""
        figures += plot_a2av(group_results, grid, curve, plots / f"a2av_n{world}{suffix}")
    return figures


def _sweep_params(name: str, key: tuple[str, int, int], chosen: dict | None) -> dict[str, object]:
    """A sweep's row: which sweep, and the chosen model with its parameters."""
    collective, world, nodes = key
    params: dict[str, object] = {"sweep": name, "collective": collective, "world_size": world, "nodes": nodes}
    if chosen:
        params["chosen_model"] = chosen["model"]
        params.update({f"chosen.{k}": v for k, v in chosen.items() if k != "model"})
    return params
