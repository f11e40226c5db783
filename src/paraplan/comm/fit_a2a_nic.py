"""The per-NIC efficiency of all_to_all across nodes, from published nccl-tests
`alltoall_perf` rows (data/published/alltoall/, provenance in data/README.md).

NCCL runs all_to_all as point-to-point sends, no ring or tree: every GPU sends S / n to
each of the n ranks, and (N - 1) / N of its S leave its node over its own share of the
NICs (PXN forwards a message over NVLink to the GPU on the destination's rail first).
With `share` NICs per GPU (1 on a rail-optimised node, k / d with k NICs for d GPUs) of
line rate B, each at efficiency e, the bandwidth-bound time is
t = (N - 1) / N x S / (e x share x B); nccl-tests prints busbw = S / t x (n - 1) / n, so

    e = busbw x n / (n - 1) x (N - 1) / N / (share x B).

The latency term is left out: it is meant for rows of large sizes (GiB) only.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from paraplan.core.errors import InputFileError


@dataclass(frozen=True)
class AlltoallRow:
    """One printed `alltoall_perf` row across `nodes` nodes of `gpus_per_node` GPUs."""

    source: str
    gpu: str
    nodes: int
    gpus_per_node: int
    nics_per_node: int | None  # None: not stated by the source
    nic_bandwidth_Bps: float | None
    size_bytes: float
    time_s: float | None
    busbw_Bps: float

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node


def read_alltoall_rows(path: str | Path) -> tuple[AlltoallRow, ...]:
    """The rows of a data/published/alltoall CSV (bad values: one `InputFileError`)."""
    rows = []
    with open(path, newline="") as handle:
        for line, record in enumerate(csv.DictReader(handle), start=2):
            try:
                nics, gbps, time_us = record["nics_per_node"], record["nic_Gbps"], record["time_us"]
                rows.append(AlltoallRow(
                    source=record["source"], gpu=record["gpu"], nodes=int(record["nodes"]),
                    gpus_per_node=int(record["gpus_per_node"]),
                    nics_per_node=int(nics) if nics else None,
                    nic_bandwidth_Bps=float(gbps) * 1e9 / 8 if gbps else None,
                    size_bytes=float(record["size_bytes"]),
                    time_s=float(time_us) * 1e-6 if time_us else None,
                    busbw_Bps=float(record["busbw_GBps"]) * 1e9))
            except (KeyError, ValueError) as exc:
                raise InputFileError(path, f"expected source, gpu, nodes, gpus_per_node, nics_per_node, nic_Gbps, "
                                           f"size_bytes, time_us, busbw_GBps ({exc})", line=line) from None
    return tuple(rows)


def nic_share(nics_per_node: int, gpus_per_node: int) -> float:
    """NICs one GPU drives while every GPU of its node sends across nodes."""
    if nics_per_node >= gpus_per_node:
        return float(nics_per_node // gpus_per_node)
    return nics_per_node / gpus_per_node


def nic_efficiency(row: AlltoallRow) -> float:
    """The e of the module docstring for one row (its NICs must be stated)."""
    if row.nics_per_node is None or row.nic_bandwidth_Bps is None or row.nodes < 2:
        raise ValueError(f"{row.source}: the NICs per node and their rate are needed, across >= 2 nodes")
    n, nodes = row.ranks, row.nodes
    algbw_Bps = row.busbw_Bps * n / (n - 1)
    return algbw_Bps * (nodes - 1) / nodes / (nic_share(row.nics_per_node, row.gpus_per_node) * row.nic_bandwidth_Bps)
