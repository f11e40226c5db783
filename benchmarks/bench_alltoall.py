"""all_to_all across nodes against the published nccl-tests `alltoall_perf` rows
(data/published/alltoall/, provenance in data/README.md): the NIC efficiency each row
with stated NICs implies (`paraplan.comm.fit_a2a_nic`), the shipped
`A2A_NIC_EFFICIENCY`, and every row predicted by `TopologyCommModel` on the cluster file
of its GPU with the row's NICs where stated (row 1: dgx-a100 with 4 x 200 Gb/s NICs per node;
row 2, held out of the fit: dgx-h800, whose 8 x 400 Gb/s NICs the issue does not state),
the intra-node model as `paraplan predict` builds it.

    python benchmarks/bench_alltoall.py
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from paraplan.clusters import load_cluster
from paraplan.comm.fit_a2a_nic import nic_efficiency, read_alltoall_rows
from paraplan.comm.topology import A2A_NIC_EFFICIENCY
from paraplan.core import Group
from paraplan.predict.calibration import load_calibration

DATA = Path(__file__).resolve().parents[1] / "data/published/alltoall/nccl_tests_alltoall_multinode.csv"
CLUSTERS = {"A100": "dgx-a100", "H800": "dgx-h800"}
FIT_SOURCE = "NVIDIA/nccl#1138"


def main() -> None:
    rows = read_alltoall_rows(DATA)
    print(f"A2A_NIC_EFFICIENCY = {A2A_NIC_EFFICIENCY} (fitted on {FIT_SOURCE})")
    calibration = load_calibration()
    for row in rows:
        implied = f"{nic_efficiency(row):.3f}" if row.nics_per_node is not None else "NICs not stated"
        cluster = load_cluster(CLUSTERS[row.gpu])
        if row.nics_per_node is not None and row.nic_bandwidth_Bps is not None and cluster.network is not None:
            network = replace(cluster.network, nics_per_node=row.nics_per_node,
                              nic_bandwidth_Bps=row.nic_bandwidth_Bps)
            cluster = replace(cluster, name=f"{cluster.name} with the row's NICs", network=network)
        model = calibration.comm_model(cluster)
        predicted_s = model.time_s("all_to_all", row.size_bytes, Group(row.ranks, row.nodes))
        measured_s = row.time_s if row.time_s is not None else \
            row.size_bytes / (row.busbw_Bps * row.ranks / (row.ranks - 1))
        role = "fit" if row.source == FIT_SOURCE else "held out"
        print(f"{row.source:18s} {role:8s} {row.nodes} x {row.gpus_per_node} {row.size_bytes / 2**20:8.0f} MiB  "
              f"implied e {implied:16s} measured {measured_s * 1e6:9.1f} us  predicted on {cluster.name} "
              f"{predicted_s * 1e6:9.1f} us  ({predicted_s / measured_s - 1:+.1%})")


if __name__ == "__main__":
    main()
