"""Load `Cluster` descriptions from `config/clusters/<name>.yaml` (units in key names)."""

from __future__ import annotations

from pathlib import Path

import yaml

from paraplan import config_files
from paraplan.core import Cluster, ConfigError, Device, Link

DEFAULT_CLUSTER_DIR = Path("config/clusters")

_DEVICE_KEYS = {
    "name": str,
    "peak_tflops": float,
    "mem_bandwidth_GBps": float,
    "memory_GB": float,
    "launch_overhead_us": float,
    "compute_units": int,
    "peak_tflops_by_dtype": dict,
}
_OPTIONAL_DEVICE_KEYS = {"launch_overhead_us", "peak_tflops_by_dtype", "compute_units"}
_LINK_KEYS = {"bandwidth_GBps": float, "latency_us": float}


def _number(source: str, key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"{source}:{key}", f"expected a number >= 0, got {value!r}")
    return float(value)


def _count(source: str, key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000:
        raise ConfigError(f"{source}:{key}", f"expected an integer in 0..1000000, got {value!r}")
    return value


def _peaks_by_dtype(source: str, data: object) -> tuple[tuple[str, float], ...]:
    """`{float32: 19.5, bfloat16: 312}` (TFLOP/s) -> (("bfloat16", 3.12e14), ("float32", 1.95e13))."""
    key = "device.peak_tflops_by_dtype"
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:{key}", "expected a mapping of dtype name to TFLOP/s")
    return tuple(sorted((str(k), _number(source, f"{key}.{k}", v) * 1e12) for k, v in data.items()))


def _check_keys(source: str, prefix: str, data: dict, allowed: dict) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{source}:{prefix}{unknown[0]}",
            f"unknown key; expected one of {', '.join(sorted(allowed))}",
        )
    missing = sorted(set(allowed) - set(data) - _OPTIONAL_DEVICE_KEYS - {"latency_us"})
    if missing:
        raise ConfigError(f"{source}:{prefix}{missing[0]}", "missing")


def cluster_from_dict(data: dict, source: str = "<cluster>") -> Cluster:
    """Build a `Cluster` from the YAML mapping; errors name `source` and the key."""
    if not isinstance(data, dict):
        raise ConfigError(source, "expected a mapping")
    top = {"name": str, "nodes": int, "devices_per_node": int, "device": dict, "links": dict,
           "description": str}
    unknown = sorted(set(data) - set(top))
    if unknown:
        raise ConfigError(f"{source}:{unknown[0]}", f"unknown key; expected one of {', '.join(sorted(top))}")
    for key in ("name", "nodes", "devices_per_node", "device", "links"):
        if key not in data:
            raise ConfigError(f"{source}:{key}", "missing")
    for key in ("nodes", "devices_per_node"):
        if not isinstance(data[key], int) or data[key] < 1:
            raise ConfigError(f"{source}:{key}", f"expected an integer >= 1, got {data[key]!r}")
    dev = data["device"]
    if not isinstance(dev, dict):
        raise ConfigError(f"{source}:device", "expected a mapping")
    _check_keys(source, "device.", dev, _DEVICE_KEYS)
    device = Device(
        name=str(dev["name"]),
        peak_flops=_number(source, "device.peak_tflops", dev["peak_tflops"]) * 1e12,
        mem_bandwidth_Bps=_number(source, "device.mem_bandwidth_GBps", dev["mem_bandwidth_GBps"]) * 1e9,
        memory_bytes=_number(source, "device.memory_GB", dev["memory_GB"]) * 1e9,
        launch_overhead_s=_number(source, "device.launch_overhead_us", dev.get("launch_overhead_us", 0.0)) * 1e-6,
        compute_units=_count(source, "device.compute_units", dev.get("compute_units", 0)),
        peak_flops_by_dtype=_peaks_by_dtype(source, dev.get("peak_tflops_by_dtype", {})),
    )
    links = data["links"]
    if not isinstance(links, dict) or set(links) != {"intra", "inter"}:
        raise ConfigError(f"{source}:links", "expected a mapping with exactly 'intra' and 'inter'")
    parsed = {}
    for tier in ("intra", "inter"):
        link = links[tier]
        if not isinstance(link, dict):
            raise ConfigError(f"{source}:links.{tier}", "expected a mapping")
        _check_keys(source, f"links.{tier}.", link, _LINK_KEYS)
        bw = _number(source, f"links.{tier}.bandwidth_GBps", link["bandwidth_GBps"])
        if bw <= 0:
            raise ConfigError(f"{source}:links.{tier}.bandwidth_GBps", "must be > 0")
        parsed[tier] = Link(
            bandwidth_Bps=bw * 1e9,
            latency_s=_number(source, f"links.{tier}.latency_us", link.get("latency_us", 0.0)) * 1e-6,
        )
    return Cluster(
        name=str(data["name"]),
        nodes=data["nodes"],
        devices_per_node=data["devices_per_node"],
        device=device,
        intra=parsed["intra"],
        inter=parsed["inter"],
    )


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
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), f"not valid YAML: {exc}") from None
    return cluster_from_dict(data, source=str(path))
