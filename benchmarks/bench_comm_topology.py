"""Topology-aware collectives vs published multi-node nccl-tests logs.

For every multi-node log in data/nccl-tests/ (data/README.md says where each comes
from): the rail curve (latency, efficiency x NIC line rate) is fitted on all the OTHER
logs (leave one log out; efficiencies are shared across fabrics as a fraction of line
rate), the held-out log is predicted with `paraplan.comm.topology.TopologyCommModel`
and the cluster file it ran on, and predicted vs measured bus bandwidth is printed at a
few sizes with the held-out GMAE of time over every size >= 1 MiB (smaller sizes are
latency: printed separately). The flat ring at the cluster file's `links.inter` (the
model before topology-aware collectives) is printed beside it. Last, the fit on all
logs: the `DEFAULT_RAIL_EFFICIENCY` / `DEFAULT_RAIL_LATENCY_S` of the module.

    python benchmarks/bench_comm_topology.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from paraplan.clusters import load_cluster
from paraplan.comm.fit_rail import (
    MeasuredSweep,
    fit_rail,
    intra_link_model,
    leave_one_out,
    model_for,
    predict_sweep,
    rail_fits,
)
from paraplan.comm.log_common import ImportOptions
from paraplan.comm.nccl_tests import read_nccl_tests
from paraplan.comm.topology import Rail, nearest_fit
from paraplan.core import Group, busbw_factor, ring_time_s

ROOT = Path(__file__).resolve().parents[1]
LOGS = (  # file, cluster it ran on, collective when the log does not name it
    ("02_gh200_alps_2x4_slingshot_all_reduce.txt", "gh200-alps", None),
    ("04_gh200_alps_2node_1gpu_all_reduce.txt", "gh200-alps", None),
    ("10_h100_ndr400_2x8_all_reduce.txt", "dgx-h100", None),
    ("11_h100_ndr400_4x8_vm_all_reduce.txt", "dgx-h100", None),
    ("12_h100_ib400_8x8_all_reduce.txt", "dgx-h100", "all_reduce"),
    ("13_h100_ib400_2x8_all_reduce.txt", "dgx-h100", "all_reduce"),
    ("14_h100_ib400_4x8_all_reduce.txt", "dgx-h100", None),
    ("15_h100_gcp_a3mega_2x8_all_reduce.txt", "gcp-a3-mega", None),
    ("16_a100_oci_bm_gpu4_2x8_all_reduce.txt", "oci-bm-gpu4-8", "all_reduce"),
)
SAME_FABRIC = ("10_", "11_", "12_", "13_", "14_")  # H100, 8 x 400 Gb/s IB: dgx-h100's rail_fits
MIN_BANDWIDTH_BYTES = 2**20
SHOWN_SIZES = (2**20, 2**24, 2**27, 2**30, 2**33)


def sweeps() -> list[MeasuredSweep]:
    out = []
    for name, cluster_name, collective in LOGS:
        path = ROOT / "data" / "nccl-tests" / name
        rows = read_nccl_tests(path, ImportOptions(collective=collective)).rows
        cluster = load_cluster(cluster_name)
        first = rows[0]
        out.append(MeasuredSweep(name, cluster, intra_link_model(cluster), first.collective, first.world_size,
                                 first.nodes, tuple(float(r.size_bytes) for r in rows),
                                 tuple(r.time_us * 1e-6 for r in rows)))
    return out


def gmae(pred: np.ndarray, meas: np.ndarray) -> float:
    err = np.abs(pred / meas - 1)
    return float(np.exp(np.mean(np.log(np.maximum(err, 1e-12))))) if err.size else float("nan")


def same_fabric(measured: list[MeasuredSweep]) -> None:
    """Held out within one fabric: each H100 NDR log predicted by `rail_fits` (one curve
    per node count, as dgx-h100.yaml ships) fitted on the other H100 NDR logs, the
    nearest node count used."""
    logs = [s for s in measured if s.name.startswith(SAME_FABRIC)]
    print("same fabric (H100 8 x 400 Gb/s), leave one log out, per-node-count rail_fits as dgx-h100.yaml ships:")
    errors = []
    for held in logs:
        fits = rail_fits([s for s in logs if s is not held])
        fit = nearest_fit(fits, held.nodes)
        assert fit is not None
        pred = predict_sweep(held, fit.latency_s, fit.bandwidth_Bps / 50e9)
        sizes, meas = np.array(held.size_bytes), np.array(held.time_s)
        big = sizes >= MIN_BANDWIDTH_BYTES
        errors.append(np.abs(pred[big] / meas[big] - 1))
        print(f"  {held.name:42s} fit of {fit.nodes} nodes ({fit.bandwidth_Bps / 1e9:.1f} GB/s per NIC, "
              f"{fit.latency_s * 1e6:.1f} us): held-out GMAE >= 1 MiB {gmae(pred[big], meas[big]):.1%}")
    err = np.concatenate(errors)
    print(f"  all: {np.exp(np.mean(np.log(np.maximum(err, 1e-12)))):.1%} over {err.size} sizes")


def main() -> None:
    measured = sweeps()
    print("held-out (leave one log out) topology model vs measured all_reduce bus bandwidth, GB/s")
    print(f"{'log':42s} {'n x N':>6s} {'eta':>5s} {'a_us':>5s} | size: measured / topology (algorithm) / flat ring")
    all_big, all_small = [], []
    for sweep, fit, pred in leave_one_out(measured):
        sizes, meas = np.array(sweep.size_bytes), np.array(sweep.time_s)
        big = sizes >= MIN_BANDWIDTH_BYTES
        all_big.append(np.abs(pred[big] / meas[big] - 1))
        all_small.append(np.abs(pred[~big] / meas[~big] - 1))
        model = model_for(sweep, fit.rail(sweep.cluster))
        group = Group(sweep.world_size, sweep.nodes)
        factor = busbw_factor(sweep.collective, sweep.world_size)
        inter = sweep.cluster.inter
        cells = []
        for s in SHOWN_SIZES:
            hit = np.nonzero(sizes == s)[0]
            if not hit.size:
                continue
            i = int(hit[0])
            algorithm, _ = model.choose(sweep.collective, s, group)
            flat = ring_time_s(sweep.collective, s, sweep.world_size, inter.latency_s, inter.bandwidth_Bps)
            cells.append(f"{s / 2**20:g}M: {s * factor / meas[i] / 1e9:.0f} / {s * factor / pred[i] / 1e9:.0f} "
                         f"({algorithm[:4]}) / {s * factor / flat / 1e9:.0f}")
        per_node = sweep.world_size // sweep.nodes
        print(f"{sweep.name:42s} {per_node:>2d}x{sweep.nodes:<3d} {fit.efficiency:5.2f} {fit.latency_s * 1e6:5.1f} | "
              + "; ".join(cells))
        print(f"{'':42s} held-out GMAE of time: sizes >= 1 MiB {gmae(pred[big], meas[big]):.1%}, "
              f"smaller {gmae(pred[~big], meas[~big]):.1%}")
    big_err, small_err = np.concatenate(all_big), np.concatenate(all_small)
    print(f"all logs, held out: GMAE sizes >= 1 MiB {np.exp(np.mean(np.log(np.maximum(big_err, 1e-12)))):.1%} "
          f"({big_err.size} points), smaller {np.exp(np.mean(np.log(np.maximum(small_err, 1e-12)))):.1%} "
          f"({small_err.size} points)")
    same_fabric(measured)
    fit = fit_rail(measured)
    print(f"fit on all {len(measured)} logs: latency {fit.latency_s * 1e6:.2f} us, efficiency {fit.efficiency:.3f} "
          f"of line rate, in-sample GMAE {fit.gmae:.1%} over {fit.n_points} points "
          "(DEFAULT_RAIL_LATENCY_S / DEFAULT_RAIL_EFFICIENCY)")
    h100 = next(s for s in measured if s.name.startswith("13_"))
    print("example, 2 x 8 H100 NDR all_reduce of 1 GiB with that fit: " + ", ".join(
        f"{name} {t * 1e3:.2f} ms" for name, t in model_for(h100, Rail(fit.latency_s, fit.efficiency * 50e9))
        .algorithm_times("all_reduce", 2**30, Group(16, 2)).items()))


if __name__ == "__main__":
    main()
