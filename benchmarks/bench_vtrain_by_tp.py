"""Why the Megatron-DeepSpeed multi-node test set (vTrain, `vtrain-a100`) is predicted fast
by tensor-parallel size: the collective-side candidates, each checked with numbers from
micro-benchmarks (never from the test set, which is only predicted here).

1. Collectives inside an A100 node for 2, 4 and 8 ranks: vTrain's own measured NCCL
   all_reduce tables (data/published/allreduce/vtrain_a100/, the authors' A100 node)
   against what the shipped `a100-vtrain` calibration prices (its intra-node fit has 8
   ranks only; 2-7 ranks are extrapolated from it with the ring formulas), at the sizes
   of the table's tensor-parallel all-reduces (b x s x h x 2 bytes).
2. The same tables fitted per world size (`paraplan.comm.fit_sweep`, the power-of-two
   sizes 1 MiB-1 GiB): held-out error, then the vTrain table predicted with those fits
   for 2-7 ranks in place of the extrapolation (everything else of the calibration
   unchanged, not refitted), error by TP size beside the shipped calibration's.
3. The data-parallel gradient reduction: the bytes each node sends across nodes per
   iteration (the same for every t at a given p: t groups of P / (t p) parameters each),
   and DeepSpeed's buckets (500M elements, `MEMORY_OPT_ALLREDUCE_SIZE`) against the
   40M-parameter buckets the predictor prices.
4. NIC efficiency: published nccl-tests of A100 nodes with 4 x 200 Gb/s HDR, the node
   type of `vtrain-a100` (data/published/allreduce/a100_hdr4_published.csv), against the
   bus bandwidth the topology model gives that shape.

    python benchmarks/bench_vtrain_by_tp.py [--write-comm-model PATH]

`--write-comm-model` also writes the shipped intra-node fits with vTrain's 2-7-rank fits added
(a comm_model.json) for refitting the calibration on them (docs/accuracy-at-scale.md):
`paraplan ingest --format vtrain data/published/vtrain_a100_single_node_measured.csv -o runs.csv`,
then `paraplan calibrate runs.csv --cluster dgx-a100 --comm-model PATH --kernel-ceilings device
--no-layer-factors --no-cross-validation -o cal.json` and
`python benchmarks/bench_published.py --calibration cal.json`.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from paraplan.clusters import load_cluster
from paraplan.comm.fit_sweep import fit_sweep
from paraplan.comm.topology import DEFAULT_RAIL_LATENCY_S, Rail, TopologyCommModel
from paraplan.comm.vtrain_lut import read_vtrain_lut
from paraplan.core import CommModel, Group
from paraplan.predict.calibration import Calibration, load_calibration
from paraplan.predict.predictor import predict_rows
from paraplan.sim.builder.placement import strided_group_nodes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from published import load_table, table_paths

ROOT = Path(__file__).resolve().parents[1]
LUTS = ROOT / "data/published/allreduce/vtrain_a100"
HDR4 = ROOT / "data/published/allreduce/a100_hdr4_published.csv"
TABLE = "megatron_deepspeed_vtrain_multinode"
MIB = 2**20
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000  # deepspeed/runtime/engine.py MEMORY_OPT_ALLREDUCE_SIZE
MEGATRON_BUCKET_PARAMS = 40_000_000  # paraplan.predict.rank_state.GRAD_BUCKET_PARAMS


def measured(world: int) -> tuple[np.ndarray, np.ndarray]:
    rows = read_vtrain_lut(LUTS / f"AR_GPU{world}_1M_1024M_LUT").rows
    return np.array([r.size_bytes for r in rows], float), np.array([r.time_us for r in rows]) * 1e-6


def lut_fits() -> list[dict]:
    """Every model fitted to each world size's power-of-two sizes (comm_model.json entries,
    one `chosen`), with the chosen one's errors printed."""
    from paraplan.comm.model import FittedCommModel

    fits = []
    for world in range(2, 9):
        sizes, times = measured(world)
        keep = np.isin(sizes, [MIB * 2**k for k in range(11)])
        entries = [e.to_dict() for e in fit_sweep("all_reduce", world, 1, sizes[keep], times[keep])]
        model = FittedCommModel.from_dict({"schema_version": 1, "fits": entries}, f"AR_GPU{world}")
        chosen = next(e for e in entries if e["chosen"])
        inner = ~keep
        predicted = np.array([float(model.time_s("all_reduce", s, Group(world, 1))) for s in sizes[inner]])
        print(f"   n={world}: {chosen['model']:10s} held-out GMAE {chosen['heldout_gmae']:6.2%} (leave one of 11 "
              f"out); on the table's other {inner.sum()} sizes: mean |error| "
              f"{np.mean(np.abs(predicted / times[inner] - 1)):6.2%}")
        fits += entries
    return fits


def intra_check(calibration: Calibration) -> None:
    cluster = load_cluster("vtrain-a100")
    comm = calibration.comm_model(cluster)
    print("\n== 1. all_reduce inside an A100 node: vTrain's measured table vs the shipped a100-vtrain pricing")
    print(f"   {'ranks':>5s} " + " ".join(f"{m:>5d} MiB" for m in (4, 16, 64, 256, 1024)) + "   (priced / measured)")
    for world in (2, 4, 8):
        sizes, times = measured(world)
        cells = []
        for mib in (4, 16, 64, 256, 1024):
            k = int(np.argmin(np.abs(sizes - mib * MIB)))
            cells.append(f"{float(comm.time_s('all_reduce', sizes[k], Group(world, 1))) / times[k]:9.2f}")
        print(f"   {world:5d} " + " ".join(cells))
    rows = [r.run for r in load_table(table_paths()[TABLE]) if r.run is not None]
    shapes = sorted({(r.settings.tensor_model_parallel_size, r.settings.micro_batch_size * r.model.seq_length
                      * r.model.hidden_size * 2) for r in rows if r.settings.tensor_model_parallel_size in (2, 4, 8)})
    ratio: dict[int, list[float]] = {}
    for t, nbytes in shapes:
        sizes, times = measured(t)
        ratio.setdefault(t, []).append(float(comm.time_s("all_reduce", nbytes, Group(t, 1)))
                                       / float(np.interp(nbytes, sizes, times)))
    for t, values in sorted(ratio.items()):
        print(f"   the table's TP{t} all-reduce sizes ({len(values)}): priced / measured "
              f"{min(values):.2f}-{max(values):.2f}")


def table_errors(calibration: Calibration, comm: CommModel | None = None) -> dict[int, list[float]]:
    cluster = load_cluster("vtrain-a100")
    rows = [r.run for r in load_table(table_paths()[TABLE]) if r.run is not None]
    preds = predict_rows(rows, cluster, comm or calibration.comm_model(cluster), calibration.efficiency)
    by_tp: dict[int, list[float]] = {}
    for run, pred in zip(rows, preds, strict=True):
        assert run.measured_iteration_s is not None
        by_tp.setdefault(run.settings.tensor_model_parallel_size, []).append(
            pred.iteration_s / run.measured_iteration_s - 1)
    return by_tp


def _line(by_tp: dict[int, list[float]]) -> str:
    every = [e for v in by_tp.values() for e in v]
    parts = [f"TP{t} {np.mean(v):+.1%}" for t, v in sorted(by_tp.items())]
    return f"MAPE {np.mean(np.abs(every)):.2%}; mean signed " + ", ".join(parts)


def swap_check(calibration: Calibration, write_comm_model: Path | None) -> None:
    print("\n== 2. vTrain's tables fitted per world size, then the vTrain table predicted with them")
    fits = lut_fits()
    shipped = calibration.intra_node_comm or {"schema_version": 1, "fits": []}
    swapped = replace(calibration, intra_node_comm={
        **shipped, "fits": [*shipped["fits"], *(f for f in fits if f["world_size"] < 8)]})
    if write_comm_model is not None:
        write_comm_model.write_text(json.dumps(swapped.intra_node_comm, indent=1) + "\n")
        print(f"   (the shipped fits with the 2-7-rank ones -> {write_comm_model})")
    print(f"   shipped a100-vtrain:                   {_line(table_errors(calibration))}")
    print(f"   with the 2-7-rank fits (not refitted): {_line(table_errors(swapped))}")
    every = replace(calibration, intra_node_comm={"schema_version": 1, "fits": fits})
    print(f"   with the 2-8-rank fits (not refitted): {_line(table_errors(every))}")


def dp_check(calibration: Calibration) -> None:
    cluster = load_cluster("vtrain-a100")
    comm = calibration.comm_model(cluster)
    g = cluster.devices_per_node
    print("\n== 3. the data-parallel gradient all-reduce (fp16 gradients, after the backward, not overlapped)")
    print("   GB/node: bytes each node sends across nodes per iteration (fp16); buckets: how many all-reduces "
          "and their seconds at each bucket size")
    print(f"   {'run':22s} {'GB/node':>8s} {'ranks/node':>10s} {'buckets 40M':>11s} {'s':>7s} "
          f"{'buckets 500M':>12s} {'s':>7s}")
    seen = set()
    for row in load_table(table_paths()[TABLE]):
        run = row.run
        if run is None:
            continue
        s = run.settings
        t, p, d = s.tensor_model_parallel_size, s.pipeline_model_parallel_size, s.data_parallel_size
        key = (run.model.num_parameters, t, p, d)
        if key in seen or p > 1:
            continue
        seen.add(key)
        params = run.model.num_parameters / (t * p)
        group = Group(d, strided_group_nodes(d, t, g))
        # a node holds ranks of min(t, g) data-parallel groups; a ring sends ~2 S out per group
        per_node = min(t, g) * 2 * params * 2 / 1e9
        cells = []
        for bucket in (MEGATRON_BUCKET_PARAMS, DEEPSPEED_BUCKET_ELEMENTS):
            n = math.ceil(params / bucket)
            cells.append((n, n * float(comm.time_s("all_reduce", params / n * 2, group))))
        print(f"   {row.name.rsplit(' b', 1)[0]:22s} {per_node:8.1f} {max(1, g // t):10d} {cells[0][0]:11d} "
              f"{cells[0][1]:7.3f} {cells[1][0]:12d} {cells[1][1]:7.3f}")


def nic_check() -> None:
    print("\n== 4. all_reduce across A100 nodes with 4 x 200 Gb/s HDR (published) vs the topology model")
    with HDR4.open(newline="") as handle:
        published = list(csv.DictReader(handle))
    cluster = load_cluster("vtrain-a100")
    assert cluster.network is not None
    shipped = load_calibration().comm_model(cluster)
    line_rate = cluster.network.nic_bandwidth_Bps
    assert isinstance(shipped, TopologyCommModel)
    ring = replace(shipped, rail=Rail(DEFAULT_RAIL_LATENCY_S, line_rate * 0.96), all_reduce_algorithms=("ring",))
    models = (("shipped (default rail efficiency)", shipped), ("ring only, line rate x 0.96", ring))
    for label, comm in models:
        for r in published:
            world, nodes = int(r["world_size"]), int(r["nodes"])
            size = float(r["size_bytes"]) if r["size_bytes"] else 2.0**30
            time_s = float(comm.time_s("all_reduce", size, Group(world, nodes)))
            busbw = size / time_s * 2 * (world - 1) / world / 1e9
            shown = f"{size / MIB:7.1f} MiB" if r["size_bytes"] else "size not stated (model at 1 GiB)"
            print(f"   {label:34s} {nodes} x {world // nodes} ranks, {shown}: model busbw {busbw:6.1f} GB/s, "
                  f"published {float(r['busbw_GBps']):6.1f} ({r['source']})")
    calibration = load_calibration()
    print(f"   the vTrain table, shipped:                     {_line(table_errors(calibration))}")
    print(f"   the vTrain table, ring only at 0.96 line rate: {_line(table_errors(calibration, ring))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-comm-model", type=Path, default=None, metavar="PATH")
    args = parser.parse_args()
    calibration = load_calibration()
    intra_check(calibration)
    swap_check(calibration, args.write_comm_model)
    dp_check(calibration)
    nic_check()


if __name__ == "__main__":
    main()
