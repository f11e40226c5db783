"""Hardware: devices grouped into nodes, with one link type per tier."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    """One accelerator (or one CPU rank)."""

    name: str
    peak_flops: float  # FLOP/s at the profile dtype
    mem_bandwidth_Bps: float
    memory_bytes: float
    launch_overhead_s: float = 0.0
    compute_units: int = 0  # streaming multiprocessors / compute units (0: not stated)
    # optional per-dtype peaks, e.g. (("float32", 19.5e12), ("bfloat16", 312e12))
    peak_flops_by_dtype: tuple[tuple[str, float], ...] = ()

    def peak_flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for `dtype` (e.g. "float32", "bfloat16"); `peak_flops` when the
        device lists no peak for it."""
        return dict(self.peak_flops_by_dtype).get(dtype, self.peak_flops)


@dataclass(frozen=True)
class Link:
    """Point-to-point link of one tier: latency (alpha) and bandwidth (1/beta)."""

    bandwidth_Bps: float
    latency_s: float = 0.0

    def transfer_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_Bps


@dataclass(frozen=True)
class Cluster:
    """`nodes` x `devices_per_node` identical devices; device ids are 0-based and
    node-major (device d sits on node d // devices_per_node)."""

    name: str
    nodes: int
    devices_per_node: int
    device: Device
    intra: Link  # inside one node
    inter: Link  # across nodes

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.devices_per_node < 1:
            raise ValueError(
                f"cluster '{self.name}': nodes and devices_per_node must be >= 1, "
                f"got {self.nodes} x {self.devices_per_node}"
            )

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    def node_of(self, device_id: int) -> int:
        return device_id // self.devices_per_node

    def nodes_spanned(self, device_ids: Iterable[int]) -> int:
        return len({self.node_of(d) for d in device_ids})

    def link_between(self, a: int, b: int) -> Link:
        return self.intra if self.node_of(a) == self.node_of(b) else self.inter

    def with_shape(self, nodes: int, devices_per_node: int) -> Cluster:
        """The same hardware with another node count / node size (e.g. `--cluster 2x8`)."""
        return Cluster(self.name, nodes, devices_per_node, self.device, self.intra, self.inter)
