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

MLflow (experiment paraplan-fit): one run per fit with one child run per sweep
(`<collective>_n<world>`), whose metrics share their names across sweeps
(`heldout_gmae__<model>`, `chosen_heldout_gmae`, ...) so the UI compares sweeps.

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
  paraplan fit results/collectives/local-cpu/*.csv -o comm_model.json --plots figs/
  paraplan ingest --format nccl-tests data/nccl-tests/10_h100_ndr400_2x8_all_reduce.txt -o h100_2x8.csv
  paraplan fit h100_2x8.csv --cluster dgx-h100 -o h100_comm_model.json
  paraplan fit --kind kernels data/published/gemm/*.csv data/published/attention/*.csv \
      --cluster dgx-h100 -o config/kernels/H100-SXM5-80GB.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paraplan.cli.common import add_output_argument, add_tracking_arguments, deprecated, track
from paraplan.core import ConfigError, InputFileError

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
    parser.add_argument("--attention-kernel", default="flash-attention-2",
                        help="kernels: the attention rows' kernel (the end of their source column)")
    parser.add_argument("--attention-head-dim", type=int, default=128,
                        help="kernels: the head dimension of the attention rows to fit (causal rows only)")
    add_tracking_arguments(parser)


def _sweep_names(entries) -> dict[tuple[str, int, int], str]:
    """`<collective>_n<world>`, plus `_nodes<k>` where one world size was measured on
    several node counts."""
    keys = sorted({(e.collective, e.world_size, e.nodes) for e in entries})
    names = {}
    for collective, world, nodes in keys:
        clash = sum(1 for c, w, _ in keys if (c, w) == (collective, world)) > 1
        names[(collective, world, nodes)] = f"{collective}_n{world}" + (f"_nodes{nodes}" if clash else "")
    return names


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from paraplan.comm.fit_a2av import a2av_frame, predict_a2av, sample_rows
    from paraplan.comm.fit_input import read_sweeps
    from paraplan.comm.fit_sweep import fit_frame
    from paraplan.comm.model import FittedCommModel, fits_document
    from paraplan.files import check_outputs, write_csv, write_json
    from paraplan.track import RunLog

    if args.kind == "kernels":
        from paraplan.cli._kernel_fit import run_kernel_fit

        return run_kernel_fit(args)
    if args.device is not None:
        raise ConfigError("--device", "applies to --kind kernels only")
    check_outputs(files=[args.output, args.a2av_output], folders=[args.plots])
    frame = read_sweeps(args.inputs)
    samples = sample_rows(frame)
    has_a2av = bool(samples.any())
    if samples.all():
        raise InputFileError(args.inputs[0], "no size sweeps to fit (only all_to_allv samples); add the all_to_all CSV")
    if args.a2av_output is not None and not has_a2av:
        raise InputFileError(args.inputs[0], "--a2av-output given but no input has all_to_allv rows")
    entries = fit_frame(frame)
    document = fits_document(entries)
    rail_rows: list[dict] = []
    if args.cluster is not None:
        rail_rows = _rail_fits(frame, args.cluster, args.inputs[0])
        document["rail_fits"] = rail_rows
    names = _sweep_names(entries)

    a2av_results = []
    if has_a2av:
        model = FittedCommModel.from_dict(document, str(args.output))
        a2av_results = predict_a2av(frame, model)
        for result in a2av_results:
            if result.flagged:
                print(f"paraplan fit: warning: all_to_allv n={result.world_size}: {result.flagged} of "
                      f"{result.n_points} '{result.variant}' predictions lie outside the measured all_to_all "
                      "range or world size (extrapolated)", file=sys.stderr)

    # Outputs first, tracking last: a tracking failure leaves the files intact.
    write_json(args.output, document)
    if args.a2av_output is not None:
        write_csv(args.a2av_output, a2av_frame(a2av_results))
    figures: list[Path] = []
    if args.plots is not None:
        from paraplan.comm.model import FittedCommModel as _Model
        from paraplan.core import Group
        from paraplan.plots.fit import plot_a2av, plot_sweep

        sweeps = frame.loc[~samples]
        for key, name in names.items():
            rows = sweeps.loc[
                (sweeps["collective"] == key[0]) & (sweeps["world_size"] == key[1]) & (sweeps["nodes"] == key[2])
            ]
            sweep_entries = [e for e in entries if (e.collective, e.world_size, e.nodes) == key]
            figures += plot_sweep(sweep_entries, rows["size_bytes"].to_numpy(float),
                                  rows["time_us"].to_numpy(float) * 1e-6, args.plots / f"fit_{name}")
        model = _Model.from_dict(document, str(args.output))
        for world, nodes in sorted({(r.world_size, r.nodes) for r in a2av_results}):
            group_results = [r for r in a2av_results if (r.world_size, r.nodes) == (world, nodes)]
            sizes = np.concatenate([np.array(r.effective_size_bytes, float) for r in group_results])
            grid = np.geomspace(sizes.min(), sizes.max(), 200)
            curve = np.array([model.time_s("all_to_allv", s, Group(world, nodes)) for s in grid])
            suffix = f"_nodes{nodes}" if nodes > 1 else ""
            figures += plot_a2av(group_results, grid, curve, args.plots / f"a2av_n{world}{suffix}")

    per_sweep: dict[str, dict[str, float]] = {name: {} for name in names.values()}
    sweep_keys = {name: key for key, name in names.items()}
    chosen: dict[str, dict[str, object]] = {}
    print(f"{'sweep':<28} {'model':<11} {'GMAE':>7} {'held-out':>9} {'mean':>7} {'std':>7}  points", file=sys.stderr)
    for entry in entries:
        name = names[(entry.collective, entry.world_size, entry.nodes)]
        sweep = per_sweep[name]
        sweep[f"gmae__{entry.model}"] = entry.gmae
        sweep[f"heldout_gmae__{entry.model}"] = entry.heldout_gmae
        sweep[f"mean_abs_rel_err__{entry.model}"] = entry.mean_abs_rel_err
        sweep["n_points"] = float(entry.n_points)
        if entry.chosen:
            chosen[name] = {"model": entry.model, **_loggable(entry.params)}
            sweep.update(chosen_gmae=entry.gmae, chosen_heldout_gmae=entry.heldout_gmae,
                         chosen_mean_abs_rel_err=entry.mean_abs_rel_err)
        print(f"{name:<28} {entry.model + ('*' if entry.chosen else ''):<11} {entry.gmae:>7.2%} "
              f"{entry.heldout_gmae:>9.2%} {entry.mean_abs_rel_err:>7.2%} {entry.std_abs_rel_err:>7.2%}  "
              f"{entry.n_points}", file=sys.stderr)
    for result in a2av_results:
        name = f"all_to_allv_n{result.world_size}" + (f"_nodes{result.nodes}" if result.nodes > 1 else "")
        sweep = per_sweep.setdefault(name, {})
        sweep_keys[name] = ("all_to_allv", result.world_size, result.nodes)
        sweep[f"gmae__{result.variant}"] = result.gmae
        sweep[f"mean_abs_rel_err__{result.variant}"] = result.mean_abs_rel_err
        sweep[f"std_abs_rel_err__{result.variant}"] = result.std_abs_rel_err
        sweep["n_points"] = float(result.n_points)
        print(f"{name:<28} {result.variant:<11} {result.gmae:>7.2%} {'':>9} {result.mean_abs_rel_err:>7.2%} "
              f"{result.std_abs_rel_err:>7.2%}  {result.n_points}", file=sys.stderr)
    print(f"paraplan fit: {len(names)} sweep(s) fitted -> {args.output}", file=sys.stderr)
    if rail_rows:
        print(f"paraplan fit: rail curve of {args.cluster}; under its cluster file's `network:`\n  rail_fits:",
              file=sys.stderr)
        for row in rail_rows:
            print(f"    - {{nodes: {row['nodes']}, latency_us: {row['latency_us']:.3g}, "
                  f"bandwidth_GBps: {row['bandwidth_GBps']:.3g}}}  # {row['efficiency']:.0%} of line rate, "
                  f"GMAE {row['gmae']:.1%} over {row['n_points']} sizes", file=sys.stderr)

    artifacts = [args.output, *figures]
    if args.a2av_output is not None:
        artifacts.append(args.a2av_output)
    children = [
        RunLog(stage="fit", run_name=name, params=_sweep_params(name, sweep_keys[name], chosen.get(name)),
               metrics=sweep)
        for name, sweep in per_sweep.items()
    ]
    chosen_errors = [m["chosen_heldout_gmae"] for m in per_sweep.values() if "chosen_heldout_gmae" in m]
    summary = {"sweeps": float(len(names))}
    for row in rail_rows:
        summary.update({f"rail_bandwidth_GBps__nodes{row['nodes']}": row["bandwidth_GBps"],
                        f"rail_latency_us__nodes{row['nodes']}": row["latency_us"],
                        f"rail_gmae__nodes{row['nodes']}": row["gmae"]})
    if chosen_errors:
        summary.update(max_chosen_heldout_gmae=max(chosen_errors),
                       median_chosen_heldout_gmae=float(np.median(chosen_errors)))
    track(
        args,
        RunLog(
            stage="fit",
            run_name=args.output.parent.name or "fit",
            params={"inputs": [str(p) for p in args.inputs], "chosen": chosen},
            metrics=summary,
            artifacts=artifacts,
            children=children,
        ),
    )
    return 0


def _rail_fits(frame, cluster_name: str, first_input: Path) -> list[dict]:
    """`rail_fits` rows: per node count, the rail curve fitted on the sweeps across nodes."""
    from paraplan.clusters import load_cluster
    from paraplan.comm.fit_input import fitted_sweeps
    from paraplan.comm.fit_rail import MeasuredSweep, fit_rail, intra_link_model
    from paraplan.core import ConfigError

    cluster = load_cluster(cluster_name)
    if cluster.network is None:
        raise ConfigError("--cluster", f"cluster '{cluster.name}' has no `network` section (nics_per_node, nic_Gbps); "
                          "a rail fit needs it (docs/clusters.md)")
    intra = intra_link_model(cluster)
    sweeps = [MeasuredSweep(f"{c}_n{w}_nodes{n}", cluster, intra, c, w, n, tuple(rows["size_bytes"].astype(float)),
                            tuple(rows["time_us"].astype(float) * 1e-6))
              for (c, w, n), rows in fitted_sweeps(frame) if n >= 2 and c != "all_to_allv"]
    if not sweeps:
        raise InputFileError(first_input, "--cluster given but no sweep ran across nodes (nodes >= 2) to fit a rail "
                             "curve on")
    out = []
    for nodes in sorted({s.nodes for s in sweeps}):
        same = [s for s in sweeps if s.nodes == nodes]
        fit = fit_rail(same)
        bandwidth = fit.efficiency * cluster.network.nic_bandwidth_Bps
        out.append({"nodes": nodes, "latency_us": fit.latency_s * 1e6, "bandwidth_GBps": bandwidth / 1e9,
                    "efficiency": fit.efficiency, "gmae": fit.gmae, "n_points": fit.n_points,
                    "sweeps": [s.name for s in same]})
    return out


def _sweep_params(name: str, key: tuple[str, int, int], chosen: dict | None) -> dict[str, object]:
    """A sweep child's params: which sweep, and the chosen model with its parameters."""
    collective, world, nodes = key
    params: dict[str, object] = {"sweep": name, "collective": collective, "world_size": world, "nodes": nodes}
    if chosen:
        params["chosen_model"] = chosen["model"]
        params.update({f"chosen.{k}": v for k, v in chosen.items() if k != "model"})
    return params


def _loggable(params: dict) -> dict:
    """A model's parameters as MLflow params (table knots summarised by their count)."""
    if "log2_size_bytes" in params:
        return {"knots": len(params["log2_size_bytes"])}
    return {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in params.items()}
