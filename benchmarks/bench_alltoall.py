"""all_to_all across nodes against published multi-node micro-benchmarks, and what the
MoE test rows spend on it.

1. The nccl-tests `alltoall_perf` rows (data/published/alltoall/nccl_tests_alltoall_multinode.csv,
   provenance in data/README.md): the NIC efficiency each row with stated NICs implies
   (`paraplan.comm.fit_a2a_nic`), the shipped `A2A_NIC_EFFICIENCY`, and every row predicted by
   `TopologyCommModel` on the cluster file of its GPU with the row's NICs where stated (row 1:
   dgx-a100 with 4 x 200 Gb/s NICs per node, the fit; row 2, held out: dgx-h800, whose
   8 x 400 Gb/s NICs the issue does not state), the intra-node model as `paraplan predict`
   builds it; the held-out row's time split into its latency and bandwidth terms.
2. The rates stated in words with their NICs (nccl_alltoall_nic_statements.csv, held out):
   the efficiency each implies and the bus bandwidth the model predicts there at 1 GiB.
3. `--moe`: the published MoE rows whose expert-parallel group spans nodes (test sets: printed,
   never fitted): one all-to-all's size and time, and the expert-parallel time of the
   iteration (`paraplan predict --explain`'s `ep_comm`) with the row's all-to-all overlap and
   without it, i.e. what the overlap hides (docs/moe.md, "All-to-all across nodes").

    python benchmarks/bench_alltoall.py [--moe]
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import replace
from pathlib import Path

from paraplan.clusters import load_cluster
from paraplan.comm.fit_a2a_nic import nic_efficiency, read_alltoall_rows, read_nic_statements
from paraplan.comm.topology import A2A_NIC_EFFICIENCY, TopologyCommModel
from paraplan.core import Group
from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel
from paraplan.predict.calibration import Calibration, calibration_for

ALLTOALL = Path(__file__).resolve().parents[1] / "data/published/alltoall"
CLUSTERS = {"A100": "dgx-a100", "H800": "dgx-h800", "H100": "dgx-h100"}
FIT_SOURCE = "NVIDIA/nccl#1138"
GiB = float(1 << 30)


def with_nics(cluster: Cluster, nics_per_node: int | None, nic_bandwidth_Bps: float | None) -> Cluster:
    """The cluster with the NICs a measurement states (unchanged where it states none)."""
    if nics_per_node is None or nic_bandwidth_Bps is None or cluster.network is None:
        return cluster
    network = replace(cluster.network, nics_per_node=nics_per_node, nic_bandwidth_Bps=nic_bandwidth_Bps)
    return replace(cluster, name=f"{cluster.name} with the row's NICs", network=network)


def own_calibration(cluster: Cluster) -> Calibration:
    """The calibration `paraplan predict` picks for the cluster's device."""
    return calibration_for(cluster, None, warn=lambda m: print(f"warning: {m}", file=sys.stderr))


def busbw_Bps(model: CommModel, size_bytes: float, group: Group) -> float:
    return size_bytes / model.time_s("all_to_all", size_bytes, group) * (group.size - 1) / group.size


def printed_rows() -> None:
    print(f"A2A_NIC_EFFICIENCY = {A2A_NIC_EFFICIENCY} (fitted on {FIT_SOURCE})")
    for row in read_alltoall_rows(ALLTOALL / "nccl_tests_alltoall_multinode.csv"):
        implied = f"{nic_efficiency(row):.3f}" if row.nics_per_node is not None else "NICs not stated"
        cluster = with_nics(load_cluster(CLUSTERS[row.gpu]), row.nics_per_node, row.nic_bandwidth_Bps)
        model = own_calibration(cluster).comm_model(cluster)
        group = Group(row.ranks, row.nodes)
        predicted_s = model.time_s("all_to_all", row.size_bytes, group)
        measured_s = row.time_s if row.time_s is not None else \
            row.size_bytes / (row.busbw_Bps * row.ranks / (row.ranks - 1))
        role = "fit" if row.source == FIT_SOURCE else "held out"
        print(f"{row.source:18s} {role:8s} {row.nodes} x {row.gpus_per_node} {row.size_bytes / 2**20:8.0f} MiB  "
              f"implied e {implied:16s} measured {measured_s * 1e6:9.1f} us  predicted on {cluster.name} "
              f"{predicted_s * 1e6:9.1f} us  ({predicted_s / measured_s - 1:+.1%})")
        if role == "held out" and isinstance(model, TopologyCommModel):
            rail = model.rail_for(row.nodes)
            latency_s = (row.nodes - 1) * rail.latency_s
            print(f"{'':27s}of which latency (N - 1) a = {row.nodes - 1} x {rail.latency_s * 1e6:.1f} us = "
                  f"{latency_s * 1e6:.1f} us, bandwidth {(predicted_s - latency_s) * 1e6:.1f} us; "
                  f"{row.size_bytes / row.ranks / 1024:.0f} KiB per peer")


def statements() -> None:
    print("\nrates stated with their NICs (held out; large messages, the model at 1 GiB):")
    for s in read_nic_statements(ALLTOALL / "nccl_alltoall_nic_statements.csv"):
        cluster = with_nics(load_cluster(CLUSTERS[s.gpu]), s.nics_per_node, s.nic_bandwidth_Bps)
        group = Group(s.nodes * s.gpus_per_node, s.nodes)
        predicted = busbw_Bps(own_calibration(cluster).comm_model(cluster), GiB, group)
        stated = "" if s.busbw_Bps is None else f"busbw {s.busbw_Bps / 1e9:5.1f} GB/s, predicted " \
            f"{predicted / 1e9:5.1f} ({predicted / s.busbw_Bps - 1:+.1%}); "
        print(f"{s.source:22s} {s.gpu} {s.nodes} x {s.gpus_per_node}, {s.nics_per_node} x "
              f"{s.nic_bandwidth_Bps * 8 / 1e9:.0f} Gb/s, NCCL {s.nccl_version or '?':9s} {stated}"
              f"implied e {s.efficiency():.3f} (shipped {A2A_NIC_EFFICIENCY})")


def moe_rows() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts: not a package
    tables = importlib.import_module("bench_published").TABLES
    published = importlib.import_module("published")

    from paraplan.predict.explain import explain_run
    from paraplan.predict.moe_shape import moe_shape
    from paraplan.predict.placement import expert_parallel_groups, placement

    print("\nMoE test rows with the EP group across nodes (printed, never fitted): one token all-to-all, and "
          "ep_comm of the iteration with the row's overlap and without it")
    paths = published.table_paths()
    for stem in ("megatron_bridge_h100_moe", "automodel_h100_moe", "deepseek_v3_report"):
        cluster = load_cluster(tables[stem][0])
        calibration = own_calibration(cluster)
        comm = calibration.comm_model(cluster)
        for row in published.load_table(paths[stem]):
            run = row.run
            if run is None:
                continue
            settings, model = run.settings, run.model
            ep = expert_parallel_groups(settings, placement(settings, cluster.devices_per_node))["ep"]
            if ep.nodes < 2:
                continue
            flex = settings.moe_token_dispatcher_type == "flex"
            a2a_bytes = moe_shape(model, settings).a2a_bytes
            one = "DeepEP kernels" if flex else \
                f"{a2a_bytes / 2**20:.0f} MiB in {comm.time_s('all_to_all', a2a_bytes, ep) * 1e3:.2f} ms"
            overlapped = [k for k in ("overlap_moe_expert_parallel_comm", "moe_shared_expert_overlap")
                          if getattr(settings, k)]
            with_overlap = explain_run(model, settings, cluster, comm, calibration.efficiency)
            line = f"   {row.name:30s} EP {ep.size} over {ep.nodes} nodes: {one}; ep_comm " \
                   f"{with_overlap.seconds['ep_comm']:.2f} s of {with_overlap.iteration_s:.2f} s"
            if overlapped:
                plain = replace(settings, overlap_moe_expert_parallel_comm=False, moe_shared_expert_overlap=False)
                without = explain_run(model, plain, cluster, comm, calibration.efficiency)
                line += f", without {'/'.join(overlapped)} {without.seconds['ep_comm']:.2f} s"
            print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moe", action="store_true", help="also the MoE test rows' all-to-all time")
    args = parser.parse_args()
    printed_rows()
    statements()
    if args.moe:
        moe_rows()


if __name__ == "__main__":
    main()
