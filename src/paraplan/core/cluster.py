"""Hardware: devices grouped into nodes, with one link type per tier."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from paraplan.core.limits import DEVICES_WHY, MAX_DEVICES


def _positive(where: str, key: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value < math.inf):
        raise ValueError(f"{where}: {key} must be a finite number > 0, got {value!r}")


def _finite_at_least_zero(where: str, key: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 <= value < math.inf):
        raise ValueError(f"{where}: {key} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class Device:
    """One accelerator (or one CPU rank)."""

    name: str
    peak_flops: float  # FLOP/s at the profile dtype
    mem_bandwidth_Bps: float
    memory_bytes: float  # what the runtime reports as the device's total (cudaMemGetInfo), docs/clusters.md
    launch_overhead_s: float = 0.0
    compute_units: int = 0  # streaming multiprocessors / compute units (0: not stated)
    # optional per-dtype peaks, e.g. (("float32", 19.5e12), ("bfloat16", 312e12))
    peak_flops_by_dtype: tuple[tuple[str, float], ...] = ()
    # what a training process holds before its first tensor (CUDA context, BLAS workspaces):
    # never available to weights, gradients, optimizer state or activations
    reserved_bytes: float = 0.0
    # coefficient of variation of a compute-bound kernel's time across GPUs of this SKU
    # (`paraplan.predict.variability`); 0: every GPU as fast as the others
    gpu_speed_cv: float = 0.0
    # another device whose measured kernel ceilings and calibration price this one's
    # compute (the same die at the same clocks and power limit); empty: its own
    same_compute_as: str = ""
    # the power limit the devices run at (W); None: not stated
    power_limit_w: float | None = None

    def __post_init__(self) -> None:
        where = f"device '{self.name}'"
        if self.power_limit_w is not None:
            _positive(where, "power_limit_w", self.power_limit_w)
        _finite_at_least_zero(where, "gpu_speed_cv", self.gpu_speed_cv)
        _positive(where, "peak_flops", self.peak_flops)
        _positive(where, "mem_bandwidth_Bps", self.mem_bandwidth_Bps)
        _finite_at_least_zero(where, "memory_bytes", self.memory_bytes)
        _finite_at_least_zero(where, "launch_overhead_s", self.launch_overhead_s)
        _finite_at_least_zero(where, "reserved_bytes", self.reserved_bytes)
        if self.memory_bytes and self.reserved_bytes >= self.memory_bytes:
            raise ValueError(f"{where}: reserved_bytes {self.reserved_bytes:.0f} leaves nothing of memory_bytes "
                             f"{self.memory_bytes:.0f}")
        if isinstance(self.compute_units, bool) or not isinstance(self.compute_units, int) or self.compute_units < 0:
            raise ValueError(f"{where}: compute_units must be an integer >= 0, got {self.compute_units!r}")
        for dtype, peak in self.peak_flops_by_dtype:
            _positive(where, f"peak_flops_by_dtype[{dtype}]", peak)

    @property
    def compute_name(self) -> str:
        """The device whose kernel ceilings (config/kernels/<it>.json) and shipped
        calibration price this one's GEMMs and attention: `same_compute_as`, else itself."""
        return self.same_compute_as or self.name

    @property
    def usable_memory_bytes(self) -> float:
        """Bytes a training process can hold in tensors: the device's total less what the
        framework reserves (`reserved_bytes`); what a plan must fit in."""
        return self.memory_bytes - self.reserved_bytes

    def capacity_text(self) -> str:
        """The memory a plan may fill, for messages: "76.2 GB usable of 85.2 GB" (1e9 bytes)."""
        if not self.reserved_bytes:
            return f"{self.memory_bytes / 1e9:,.1f} GB"
        return f"{self.usable_memory_bytes / 1e9:,.1f} GB usable of {self.memory_bytes / 1e9:,.1f} GB"

    def peak_flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for `dtype` (e.g. "float32", "bfloat16"); `peak_flops` when the
        device lists no peak for it."""
        return dict(self.peak_flops_by_dtype).get(dtype, self.peak_flops)


@dataclass(frozen=True)
class Link:
    """Point-to-point link of one tier: latency (alpha) and bandwidth (1/beta)."""

    bandwidth_Bps: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        # an infinite bandwidth is a free link (studies whose model moves no bytes)
        if not (self.bandwidth_Bps > 0):  # NaN too: a NaN bandwidth would make every transfer free
            raise ValueError(f"link: bandwidth_Bps must be > 0, got {self.bandwidth_Bps!r}")
        _finite_at_least_zero("link", "latency_s", self.latency_s)

    def transfer_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_Bps


@dataclass(frozen=True)
class RailFit:
    """A fitted inter-node curve for one NIC (one rail): moving m bytes over it takes
    latency_s + m / bandwidth_Bps (alpha-beta), fitted on multi-node nccl-tests logs
    spanning `nodes` nodes (`paraplan fit --cluster`)."""

    nodes: int
    latency_s: float
    bandwidth_Bps: float

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 2:
            raise ValueError(f"rail fit: nodes must be an integer >= 2, got {self.nodes!r}")
        _positive("rail fit", "bandwidth_Bps", self.bandwidth_Bps)
        _finite_at_least_zero("rail fit", "latency_s", self.latency_s)


MULTICAST_DEVICES: tuple[str, ...] = ("H100", "H200", "H800", "H20", "GH200", "B100", "B200", "GB200", "B300", "GB300")
"""Device name prefixes of compute capability 9.0 and newer (Hopper, Blackwell): the GPUs
whose NVSwitch nodes offer CUDA multicast (NVLink SHARP), which NCCL's NVLS algorithms
and Transformer Engine's userbuffers use. An A100's NVSwitch has none."""


def nvlink_multicast(device_name: str) -> bool:
    """The device is a Hopper or Blackwell GPU (`MULTICAST_DEVICES`)."""
    return device_name.startswith(MULTICAST_DEVICES)


@dataclass(frozen=True)
class Network:
    """What a node has for talking to other nodes: `nics_per_node` NICs of
    `nic_bandwidth_Bps` line rate each (one per GPU on a rail-optimised DGX), and how
    many devices share one NVLink domain (8 on a DGX, 72 on a GB200 NVL72 rack).
    `rail_fits` are fitted per-NIC curves (none: line rate x a documented efficiency,
    see `paraplan.comm.topology`); `nvls`: NCCL can run its NVLink SHARP algorithms
    (NVLS, NVLS-Tree), which need NVSwitch multicast (Hopper and newer)."""

    nics_per_node: int
    nic_bandwidth_Bps: float
    nvlink_domain_size: int
    rail_fits: tuple[RailFit, ...] = ()
    nvls: bool = False  # NCCL's NVLS algorithms (NVLink SHARP): the hierarchical all-reduce across nodes

    def __post_init__(self) -> None:
        for key in ("nics_per_node", "nvlink_domain_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"network: {key} must be an integer >= 1, got {value!r}")
        _positive("network", "nic_bandwidth_Bps", self.nic_bandwidth_Bps)


@dataclass(frozen=True)
class Cluster:
    """`nodes` x `devices_per_node` identical devices; device ids are 0-based and
    node-major (device d sits on node d // devices_per_node)."""

    name: str
    nodes: int
    devices_per_node: int
    device: Device
    intra: Link  # inside one node
    inter: Link  # across nodes (the flat-ring link of clusters without a `network`)
    network: Network | None = None  # NICs and NVLink domain: topology-aware collectives

    def __post_init__(self) -> None:
        counts = (self.nodes, self.devices_per_node)
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts):
            raise ValueError(
                f"cluster '{self.name}': nodes and devices_per_node must be integers >= 1, "
                f"got {self.nodes!r} x {self.devices_per_node!r}"
            )
        if self.nodes * self.devices_per_node > MAX_DEVICES:
            raise ValueError(f"cluster '{self.name}': {self.nodes} x {self.devices_per_node} devices is above "
                             f"{MAX_DEVICES:,}: {DEVICES_WHY}")
        domain = self.network.nvlink_domain_size if self.network is not None else self.devices_per_node
        if domain % self.devices_per_node:
            raise ValueError(f"cluster '{self.name}': network.nvlink_domain_size {domain} is not a multiple of "
                             f"devices_per_node {self.devices_per_node} (an NVLink domain holds whole nodes)")

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
        """The same hardware with another node count / node size (e.g. `--cluster 2x8`).
        The NVLink domain stays where it holds whole nodes of the new size; otherwise it
        becomes one node (NVLink inside each node only)."""
        network = self.network
        if network is not None and network.nvlink_domain_size % devices_per_node:
            network = replace(network, nvlink_domain_size=devices_per_node)
        return Cluster(self.name, nodes, devices_per_node, self.device, self.intra, self.inter, network)
