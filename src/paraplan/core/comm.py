"""Collective conventions (nccl-tests) and the `CommModel` interface.

`nbytes` always follows nccl-tests: the larger per-rank buffer (all_gather: the
gathered output; reduce_scatter: the input; all_to_all: the per-rank total).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
)


def busbw_factor(collective: str, world_size: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw x factor."""
    n = world_size
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all", "all_to_allv"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown collective '{collective}'; known: {', '.join(COLLECTIVES)}")


def ring_time_s(
    collective: str, nbytes: float, world_size: int, latency_s: float, bandwidth_Bps: float
) -> float:
    """Hockney alpha-beta cost of the standard algorithms for one link type:
    ring all_reduce 2(p-1) a + 2(p-1)/p m/B; ring all_gather / reduce_scatter /
    pairwise all_to_all (p-1) a + (p-1)/p m/B; binomial broadcast/reduce
    ceil(log2 p)(a + m/B). One rank costs nothing."""
    p = world_size
    if p <= 1:
        return 0.0
    if collective == "all_reduce":
        return 2 * (p - 1) * latency_s + 2 * (p - 1) / p * nbytes / bandwidth_Bps
    if collective in ("all_gather", "reduce_scatter", "all_to_all", "all_to_allv"):
        return (p - 1) * latency_s + (p - 1) / p * nbytes / bandwidth_Bps
    if collective in ("broadcast", "reduce"):
        return math.ceil(math.log2(p)) * (latency_s + nbytes / bandwidth_Bps)
    if collective == "send_recv":
        return latency_s + nbytes / bandwidth_Bps
    raise ValueError(f"unknown collective '{collective}'; known: {', '.join(COLLECTIVES)}")


@dataclass(frozen=True)
class Group:
    """A communicator: how many ranks, and how many nodes they span (spread evenly:
    size / nodes ranks on each, as Megatron's rank order places them)."""

    size: int
    nodes: int = 1

    @property
    def tier(self) -> str:
        """`intra` when the group sits inside one node, else `inter`."""
        return "intra" if self.nodes <= 1 else "inter"


@runtime_checkable
class CommModel(Protocol):
    """Predicts the time of one collective (or a point-to-point `send_recv`)."""

    def time_s(self, collective: str, nbytes: float, group: Group) -> float: ...


@dataclass(frozen=True)
class ConstantBandwidthModel:
    """Studies that state a bandwidth ("200 Gbps", "NCCL at 3 GB/s across nodes"):
    ring formulas over a fixed link per tier. Written `constant_bw` in files."""

    intra_bandwidth_Bps: float
    inter_bandwidth_Bps: float
    intra_latency_s: float = 0.0
    inter_latency_s: float = 0.0

    def time_s(self, collective: str, nbytes: float, group: Group) -> float:
        if group.tier == "intra":
            lat, bw = self.intra_latency_s, self.intra_bandwidth_Bps
        else:
            lat, bw = self.inter_latency_s, self.inter_bandwidth_Bps
        return ring_time_s(collective, nbytes, group.size, lat, bw)


@dataclass(frozen=True)
class TieredCommModel:
    """One model for groups inside a node and another for groups across nodes (e.g. a
    fit of nccl-tests inside a DGX node, and the InfiniBand links of the cluster file
    across nodes)."""

    intra: CommModel
    inter: CommModel

    def time_s(self, collective: str, nbytes: float, group: Group) -> float:
        model = self.intra if group.tier == "intra" else self.inter
        return float(model.time_s(collective, nbytes, group))
