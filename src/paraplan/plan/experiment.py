"""Named planning studies (config/experiments/<name>.yaml with `stage: plan`).

Keys (all checked; unknown keys are errors):
  name, description, stage: plan
  profile: path (PipeDream .txt or paraplan .csv), relative to the working directory
  pbs: profile batch size (PipeDream text; default from the file name)
  mbs: smallest micro-batch (default: pbs)
  optimizer_factor, peak_activation_bytes_per_sample, memory_gb (default: the cluster's)
  cluster_file: cluster name or YAML (default dgx1-v100)
  layouts: list of NODESxDEVICES, e.g. [2x8, 16x1]
  gbs_range: "A:B:S" or gbs: [list]
  max_pipeline_devices, candidates
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from paraplan.core import ConfigError
from paraplan.plan.inputs import parse_cluster_shape, parse_gbs_range

_KEYS = {
    "name": str, "description": str, "stage": str, "profile": str, "pbs": int, "mbs": int,
    "optimizer_factor": (int, float), "peak_activation_bytes_per_sample": (int, float),
    "memory_gb": (int, float), "cluster_file": str, "layouts": list, "gbs_range": str,
    "gbs": list, "max_pipeline_devices": int, "candidates": int,
}


@dataclass(frozen=True)
class PlanExperiment:
    name: str
    profile: Path
    pbs: int | None
    mbs: int | None
    optimizer_factor: float
    peak_activation_bytes_per_sample: float | None
    memory_gb: float | None
    cluster_file: str
    layouts: tuple[tuple[int, int], ...]
    batch_sizes: tuple[int, ...]
    max_pipeline_devices: int = 0
    candidates: int = 3


def load_plan_experiment(path: str | Path) -> PlanExperiment:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError("--experiment", f"no such file {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), f"not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), "expected a mapping")
    for key, value in data.items():
        if key not in _KEYS:
            raise ConfigError(f"{path}:{key}", f"unknown key; expected one of {', '.join(sorted(_KEYS))}")
        if isinstance(value, bool) or not isinstance(value, _KEYS[key]):
            raise ConfigError(f"{path}:{key}", f"wrong type {type(value).__name__}")
    if data.get("stage", "plan") != "plan":
        raise ConfigError(f"{path}:stage", f"expected 'plan', got {data['stage']!r}")
    for key in ("name", "profile", "layouts"):
        if key not in data:
            raise ConfigError(f"{path}:{key}", "missing")
    if ("gbs_range" in data) == ("gbs" in data):
        raise ConfigError(f"{path}:gbs_range", "give exactly one of gbs_range and gbs")
    if "gbs_range" in data:
        sizes = parse_gbs_range(data["gbs_range"], f"{path}:gbs_range")
    else:
        sizes = sorted({int(g) for g in data["gbs"]})
        if not sizes or sizes[0] < 1:
            raise ConfigError(f"{path}:gbs", "expected integers >= 1")
    layouts = tuple(parse_cluster_shape(str(s), f"{path}:layouts") for s in data["layouts"])
    if not layouts:
        raise ConfigError(f"{path}:layouts", "expected at least one NODESxDEVICES")
    peak = data.get("peak_activation_bytes_per_sample")
    memory = data.get("memory_gb")
    return PlanExperiment(
        name=data["name"],
        profile=Path(data["profile"]),
        pbs=data.get("pbs"),
        mbs=data.get("mbs"),
        optimizer_factor=float(data.get("optimizer_factor", 2.0)),
        peak_activation_bytes_per_sample=float(peak) if peak is not None else None,
        memory_gb=float(memory) if memory is not None else None,
        cluster_file=data.get("cluster_file", "dgx1-v100"),
        layouts=layouts,
        batch_sizes=tuple(sizes),
        max_pipeline_devices=int(data.get("max_pipeline_devices", 0)),
        candidates=int(data.get("candidates", 3)),
    )
