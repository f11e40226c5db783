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

Beside the printed rows, `data/published/alltoall/nccl_alltoall_nic_statements.csv` holds the
multi-node all_to_all rates people stated in words, with their NICs (`NicRateStatement`): a bus
bandwidth at a node count (its e by the formula above) or a rate per NIC (e = rate / line
rate). They are held out: `benchmarks/bench_alltoall.py` compares them with the shipped e.
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


def busbw_efficiency(busbw_Bps: float, nodes: int, gpus_per_node: int, nics_per_node: int,
                     nic_bandwidth_Bps: float) -> float:
    """e = busbw x n / (n - 1) x (N - 1) / N / (share x B) (module docstring), N >= 2 nodes."""
    if nodes < 2:
        raise ValueError("the NIC efficiency of all_to_all needs a group across >= 2 nodes")
    n = nodes * gpus_per_node
    algbw_Bps = busbw_Bps * n / (n - 1)
    return algbw_Bps * (nodes - 1) / nodes / (nic_share(nics_per_node, gpus_per_node) * nic_bandwidth_Bps)


def nic_efficiency(row: AlltoallRow) -> float:
    """The e of the module docstring for one row (its NICs must be stated)."""
    if row.nics_per_node is None or row.nic_bandwidth_Bps is None or row.nodes < 2:
        raise ValueError(f"{row.source}: the NICs per node and their rate are needed, across >= 2 nodes")
    return busbw_efficiency(row.busbw_Bps, row.nodes, row.gpus_per_node, row.nics_per_node, row.nic_bandwidth_Bps)


@dataclass(frozen=True)
class NicRateStatement:
    """A multi-node all_to_all rate stated in words (an issue thread), with its NICs: either
    the bus bandwidth nccl-tests showed at `nodes` nodes, or a rate per NIC."""

    source: str
    gpu: str
    nodes: int
    gpus_per_node: int
    nics_per_node: int
    nic_bandwidth_Bps: float
    nccl_version: str  # empty: not stated
    busbw_Bps: float | None
    per_nic_Bps: float | None
    statement: str  # the words, as written

    def efficiency(self) -> float:
        """e: the per-NIC rate over line rate (from the bus bandwidth when that is what was stated)."""
        if self.per_nic_Bps is not None:
            return self.per_nic_Bps / self.nic_bandwidth_Bps
        assert self.busbw_Bps is not None  # the reader requires one of the two
        return busbw_efficiency(self.busbw_Bps, self.nodes, self.gpus_per_node, self.nics_per_node,
                                self.nic_bandwidth_Bps)


def read_nic_statements(path: str | Path) -> tuple[NicRateStatement, ...]:
    """The rows of `nccl_alltoall_nic_statements.csv` (bad values: one `InputFileError`)."""
    rows = []
    with open(path, newline="") as handle:
        for line, record in enumerate(csv.DictReader(handle), start=2):
            try:
                busbw, per_nic = record["busbw_GBps"], record["per_nic_GBps"]
                if bool(busbw) == bool(per_nic):
                    raise ValueError("exactly one of busbw_GBps and per_nic_GBps")
                rows.append(NicRateStatement(
                    source=record["source"], gpu=record["gpu"], nodes=int(record["nodes"]),
                    gpus_per_node=int(record["gpus_per_node"]), nics_per_node=int(record["nics_per_node"]),
                    nic_bandwidth_Bps=float(record["nic_Gbps"]) * 1e9 / 8, nccl_version=record["nccl_version"],
                    busbw_Bps=float(busbw) * 1e9 if busbw else None,
                    per_nic_Bps=float(per_nic) * 1e9 if per_nic else None, statement=record["statement"]))
            except (KeyError, ValueError) as exc:
                raise InputFileError(path, f"expected source, gpu, nodes, gpus_per_node, nics_per_node, nic_Gbps, "
                                           f"nccl_version, busbw_GBps or per_nic_GBps, statement ({exc})",
                                     line=line) from None
    return tuple(rows)
