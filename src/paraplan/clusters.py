"""Cluster files (`config/clusters/<name>.yaml`): their typed form, with units in the key
names, and how they become a core `Cluster` (SI units)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from paraplan import config_files
from paraplan.core import Cluster, ConfigError, Device, InputFileError, Link, Network, RailFit
from paraplan.core import limits as lim
from paraplan.core.cluster import nvlink_multicast
from paraplan.core.names import name_problem
from paraplan.typed import AtLeast, AtMost, Source, load, read_yaml

DEFAULT_CLUSTER_DIR = Path("config/clusters")
_TERA, _GIGA, _MICRO, _MEBI = 1e12, 1e9, 1e-6, 2.0**20

_SMALLEST = AtLeast(lim.MIN_POSITIVE, lim.TINY_WHY)
Tflops = Annotated[float, _SMALLEST, AtMost(lim.MAX_PEAK_TFLOPS, lim.PEAK_WHY)]
GBps = Annotated[float, _SMALLEST, AtMost(lim.MAX_BANDWIDTH_GBPS, lim.BANDWIDTH_WHY)]
GB = Annotated[float, _SMALLEST, AtMost(lim.MAX_MEMORY_GB, lim.MEMORY_WHY)]
MiB = Annotated[float, _SMALLEST, AtMost(lim.MAX_MEMORY_MIB, lim.MEMORY_MIB_WHY)]
ReservedMiB = Annotated[float, AtLeast(0), AtMost(lim.MAX_MEMORY_MIB, lim.MEMORY_MIB_WHY)]
Microseconds = Annotated[float, AtLeast(0), AtMost(lim.MAX_LATENCY_US, lim.LATENCY_WHY)]
Devices = Annotated[int, AtLeast(1), AtMost(lim.MAX_DEVICES, lim.DEVICES_WHY)]
Watts = Annotated[float, _SMALLEST, AtMost(lim.MAX_POWER_LIMIT_W, lim.POWER_LIMIT_WHY)]
_SPEED_CV_WHY = "GPUs of one SKU more than 50% apart in speed; wrong unit? (a fraction: 0.01 = 1%)"


@dataclass(frozen=True, kw_only=True)
class LinkFile:
    """One tier of links: what a device sees when it talks to another."""

    bandwidth_GBps: GBps
    """Bandwidth per device in GB/s (1e9 bytes per second); bus bandwidth as nccl-tests reports it."""
    latency_us: Microseconds = 0.0
    """Per-message latency in microseconds."""

    def to_link(self) -> Link:
        return Link(bandwidth_Bps=self.bandwidth_GBps * _GIGA, latency_s=self.latency_us * _MICRO)


@dataclass(frozen=True, kw_only=True)
class LinksFile:
    intra: LinkFile
    """Between devices of one node (NVLink / NVSwitch, shared memory)."""
    inter: LinkFile
    """Between nodes (InfiniBand, Ethernet)."""


@dataclass(frozen=True, kw_only=True)
class RailFitFile:
    """A fitted per-NIC curve (`paraplan fit --cluster` prints these lines)."""

    nodes: Annotated[int, AtLeast(2), AtMost(lim.MAX_DEVICES, lim.DEVICES_WHY)]
    """Nodes the fitted logs spanned; a group uses the fit of the nearest node count."""
    latency_us: Microseconds
    """Latency of one inter-node step in microseconds (alpha)."""
    bandwidth_GBps: GBps
    """Effective bandwidth of one NIC in GB/s (1e9 bytes per second) for large messages (1/beta)."""

    def to_rail_fit(self) -> RailFit:
        return RailFit(self.nodes, self.latency_us * _MICRO, self.bandwidth_GBps * _GIGA)


@dataclass(frozen=True, kw_only=True)
class NetworkFile:
    """A node's network, for topology-aware collectives (`paraplan.comm.topology`)."""

    nics_per_node: Devices
    """Inter-node NICs per node (8 on a DGX A100/H100: one per GPU, rail-optimised)."""
    nic_Gbps: Annotated[float, _SMALLEST, AtMost(lim.MAX_BANDWIDTH_GBPS * 8, lim.BANDWIDTH_WHY)]
    """Line rate of one NIC in Gb/s (1e9 bits per second), e.g. 400 for NDR InfiniBand."""
    nvlink_domain_size: Annotated[int, AtLeast(1), AtMost(lim.MAX_DEVICES, lim.DEVICES_WHY)] | None = None
    """Devices that share one NVLink domain (default: devices_per_node; 72 for a GB200 NVL72 rack)."""
    rail_fits: tuple[RailFitFile, ...] = ()
    """Fitted per-NIC curves by node count (none: line rate x the efficiency fitted on published logs)."""
    nvls: bool | None = None
    """Whether NCCL can run its NVLink SHARP algorithms (NVLS, NVLS-Tree: the hierarchical
    all-reduce across nodes), which need NVSwitch multicast; default: a Hopper or newer
    device (H100, H200, H800, GH200, B200, ...) in an NVLink domain of several GPUs. Set
    false for nodes whose GPUs are linked without an NVSwitch (e.g. 4 GH200 per node)."""

    def to_network(self, devices_per_node: int, device_name: str) -> Network:
        domain = self.nvlink_domain_size if self.nvlink_domain_size is not None else devices_per_node
        fits = tuple(sorted((f.to_rail_fit() for f in self.rail_fits), key=lambda f: f.nodes))
        nvls = self.nvls if self.nvls is not None else (nvlink_multicast(device_name) and domain > 1)
        return Network(self.nics_per_node, self.nic_Gbps * _GIGA / 8, domain, fits, nvls)


@dataclass(frozen=True, kw_only=True)
class ReservedFile:
    """What a training process holds on the device before its first tensor, in MiB (2**20
    bytes); each term from a published source (docs/clusters.md), absent where none is."""

    cuda_context_MiB: ReservedMiB = 0.0
    """The CUDA (or ROCm) context with its lazily loaded kernels."""
    blas_workspace_MiB: ReservedMiB = 0.0
    """The BLAS library workspaces the framework allocates for its compute stream (PyTorch's cuBLAS /
    cuBLASLt workspace, Transformer Engine's)."""

    @property
    def total_bytes(self) -> float:
        return (self.cuda_context_MiB + self.blas_workspace_MiB) * _MEBI


@dataclass(frozen=True, kw_only=True)
class DeviceFile:
    """One accelerator (or one CPU rank)."""

    name: str
    """The device model, e.g. A100-SXM4-80GB."""
    peak_tflops: Tflops
    """Peak TFLOP/s at the profile dtype (dense)."""
    mem_bandwidth_GBps: GBps
    """Memory bandwidth in GB/s."""
    memory_MiB: MiB | None = None
    """The device's memory as the runtime reports its total to a process (deviceQuery's "Total amount of
    global memory", torch.cuda.mem_get_info's total, hipDeviceProp totalGlobalMem), in MiB (2**20 bytes).
    Give this or memory_GB."""
    memory_GB: GB | None = None
    """The device's memory in GB, exactly 1e9 bytes each (not GiB: an "80 GB" A100 reports 81,251 MiB =
    85.2e9 bytes); for devices without a published runtime total. Give this or memory_MiB."""
    reserved: ReservedFile = field(default_factory=ReservedFile)
    """What the framework holds before the first tensor (CUDA context, BLAS workspaces), subtracted from
    the memory a plan may fill; none when absent."""
    launch_overhead_us: Microseconds = 0.0
    """Fixed time per kernel launch in microseconds."""
    compute_units: Annotated[int, AtLeast(0), AtMost(1_000_000)] = 0
    """Streaming multiprocessors / compute units (0: not stated)."""
    peak_tflops_by_dtype: dict[str, Tflops] = field(default_factory=dict)
    """Peak TFLOP/s per dtype (float32, tf32, bfloat16, float16, ...) from the datasheet."""
    gpu_speed_cv: Annotated[float, AtLeast(0), AtMost(0.5, _SPEED_CV_WHY)] = 0.0
    """Coefficient of variation of a compute-bound GEMM's time across GPUs of this SKU running at the same
    time (a fraction: 0.01 = 1%), measured by GEMM micro-benchmarks on many GPUs of one cluster; a synchronous
    job of N GPUs waits for its slowest one (docs/accuracy-at-scale.md). 0: every GPU as fast as the others."""
    power_limit_w: Watts | None = None
    """The power limit the devices run at, in W (nvidia-smi's enforced limit; the SXM parts' default is their
    TDP). A kernel fit made on this cluster records it; a device priced by ceilings measured at another limit
    (`same_compute_as`) gets a note, since a power limit sets the clock compute-bound kernels hold and paraplan
    does not model that (docs/kernels.md#power-limits). Absent: not stated, nothing compared."""
    same_compute_as: str = ""
    """Another device's name whose measured kernel ceilings (config/kernels/<it>.json) and shipped calibration
    price this device's GEMMs and attention: only for the same die at the same clocks and power limit (the H200
    SXM and the H800 SXM5 are the H100 SXM5's GH100 at 700 W); memory, bandwidth and links stay this file's.
    Empty: the device's own (docs/clusters.md)."""

    def __post_init__(self) -> None:
        if (self.memory_MiB is None) == (self.memory_GB is None):
            raise ValueError("give exactly one of memory_MiB (the runtime's total, 2**20 bytes each) and memory_GB "
                             f"(1e9 bytes each), got {'both' if self.memory_MiB is not None else 'neither'}")
        if self.reserved.total_bytes >= self.memory_bytes:
            raise ValueError(f"reserved ({self.reserved.total_bytes / _MEBI:g} MiB) leaves nothing of the device's "
                             f"{self.memory_bytes / _MEBI:g} MiB")

    @property
    def memory_bytes(self) -> float:
        return self.memory_MiB * _MEBI if self.memory_MiB is not None else float(self.memory_GB or 0) * _GIGA

    def to_device(self) -> Device:
        return Device(
            name=self.name,
            peak_flops=self.peak_tflops * _TERA,
            mem_bandwidth_Bps=self.mem_bandwidth_GBps * _GIGA,
            memory_bytes=self.memory_bytes,
            launch_overhead_s=self.launch_overhead_us * _MICRO,
            compute_units=self.compute_units,
            peak_flops_by_dtype=tuple(sorted((k, v * _TERA) for k, v in self.peak_tflops_by_dtype.items())),
            reserved_bytes=self.reserved.total_bytes,
            gpu_speed_cv=self.gpu_speed_cv,
            same_compute_as=self.same_compute_as,
            power_limit_w=self.power_limit_w,
        )


@dataclass(frozen=True, kw_only=True)
class ClusterFile:
    """A cluster: `nodes` x `devices_per_node` identical devices and one link type per tier."""

    name: str
    """The cluster's name (results go under results/<stage>/<name>/)."""
    description: str = ""
    """One line for people."""
    nodes: Devices
    """Nodes (machines)."""
    devices_per_node: Devices
    """Devices (GPUs, or CPU ranks) per node."""
    device: DeviceFile
    """The device every node holds."""
    links: LinksFile
    """Link bandwidth and latency inside a node and across nodes."""
    network: NetworkFile | None = None
    """NICs per node, their line rate and the NVLink domain (optional). With it, collectives across nodes
    are priced by NCCL's algorithms over the NICs (`paraplan.comm.topology`); without it, by a flat ring at
    `links.inter`."""

    def __post_init__(self) -> None:
        problem = name_problem(self.name)
        if problem:  # results/<stage>/<name>/
            raise ValueError(f"key 'name': {problem}")
        if self.nodes * self.devices_per_node > lim.MAX_DEVICES:
            raise ValueError(f"nodes x devices_per_node = {self.nodes} x {self.devices_per_node} is above "
                             f"{lim.MAX_DEVICES:,} devices: {lim.DEVICES_WHY}")
        domain = self.network.nvlink_domain_size if self.network is not None else None
        if domain is not None and domain % self.devices_per_node:
            raise ValueError(f"network.nvlink_domain_size {domain} is not a multiple of devices_per_node "
                             f"{self.devices_per_node} (an NVLink domain holds whole nodes)")
        fits = [f.nodes for f in self.network.rail_fits] if self.network is not None else []
        if len(set(fits)) != len(fits):
            raise ValueError(f"network.rail_fits: two fits for the same node count ({sorted(fits)})")

    def to_cluster(self) -> Cluster:
        network = (self.network.to_network(self.devices_per_node, self.device.name) if self.network is not None
                   else None)
        return Cluster(self.name, self.nodes, self.devices_per_node, self.device.to_device(),
                       self.links.intra.to_link(), self.links.inter.to_link(), network)


def cluster_from_dict(data: object, source: str = "<cluster>") -> Cluster:
    """A `Cluster` from a parsed cluster file; errors name `source`, the key and the value."""
    return load(ClusterFile, data, Source.file(source)).to_cluster()


def cluster_path(name_or_path: str | Path, cluster_dir: Path = DEFAULT_CLUSTER_DIR) -> Path:
    """A cluster given by path (`my/cluster.yaml`) or by name (`dgx1-v100`): the name is
    looked up in `cluster_dir` when one is given, else in `config/clusters` of the
    working directory, the checkout paraplan was installed from and the wheel's copies
    (`paraplan.config_files`)."""
    return config_files.find("clusters", name_or_path, _explicit(cluster_dir))


def _explicit(cluster_dir: Path) -> Path | None:
    return None if cluster_dir == DEFAULT_CLUSTER_DIR else cluster_dir


def load_cluster(name_or_path: str | Path, cluster_dir: Path = DEFAULT_CLUSTER_DIR) -> Cluster:
    path = cluster_path(name_or_path, cluster_dir)
    if not path.is_file():
        known = config_files.known_names("clusters", _explicit(cluster_dir))
        raise ConfigError(
            "cluster", f"no cluster file {path}" + (f"; known clusters: {', '.join(known)}" if known else "")
        )
    cluster = cluster_from_dict(read_yaml(path, "a cluster file (config/clusters/*.yaml)"), source=str(path))
    same = cluster.device.same_compute_as
    if same and not config_files.find("kernels", same).is_file():
        known = config_files.known_names("kernels")
        raise InputFileError(path, f"names {same!r}, which has no kernel ceilings (config/kernels/{same}.json); "
                             f"expected one of: {', '.join(known) or 'none'}", field="device.same_compute_as")
    return cluster
