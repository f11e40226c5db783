"""A calibration: the device model's fitted parameters for one kind of device, the
data they were fitted on and their cross-validated error, as a small versioned JSON
file. Predictions name the calibration they used (`Calibration.label`).

    {"schema_version": 1, "name": "a100-vtrain", "device": "A100-SXM4-80GB",
     "efficiency": {...DeviceEfficiency...}, "fitted": [...], "at_bound": [...],
     "intra_node_comm": {...paraplan fit's comm_model.json...} or null,
     "data": {...what it was fitted on...}, "errors": {...}, "assumptions": {...}}

`intra_node_comm`, when present, prices collectives inside a node of the same
device (e.g. fitted on nccl-tests of that node); collectives across nodes always
use the cluster file's links.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel, ConstantBandwidthModel, TieredCommModel
from paraplan.core.errors import InputFileError
from paraplan.predict.device_model import DeviceEfficiency

SCHEMA_VERSION = 1
DEFAULT_CALIBRATION = "a100-vtrain"
_EFFICIENCY_KEYS = {f.name for f in fields(DeviceEfficiency)}


@dataclass(frozen=True)
class Calibration:
    name: str
    device: str
    efficiency: DeviceEfficiency
    fitted: tuple[str, ...] = ()
    at_bound: tuple[str, ...] = ()
    intra_node_comm: Mapping | None = None
    data: Mapping = field(default_factory=dict)
    errors: Mapping = field(default_factory=dict)
    assumptions: Mapping = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION, "name": self.name, "device": self.device,
            "efficiency": self.efficiency.as_dict(), "fitted": list(self.fitted), "at_bound": list(self.at_bound),
            "intra_node_comm": self.intra_node_comm, "data": dict(self.data), "errors": dict(self.errors),
            "assumptions": dict(self.assumptions),
        }

    @property
    def digest(self) -> str:
        text = json.dumps({"device": self.device, "efficiency": self.efficiency.as_dict(),
                           "intra_node_comm": self.intra_node_comm}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    @property
    def label(self) -> str:
        """What a prediction records: name and a digest of what it predicts with."""
        return f"{self.name}@{self.digest}"

    @staticmethod
    def from_dict(data: object, source: str) -> Calibration:
        if not isinstance(data, dict):
            raise InputFileError(source, "expected a JSON object (a paraplan calibration)")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise InputFileError(source, f"schema_version {data.get('schema_version')!r}; expected {SCHEMA_VERSION}")
        for key in ("name", "device", "efficiency"):
            if key not in data:
                raise InputFileError(source, f"missing key '{key}'")
        eff = data["efficiency"]
        if not isinstance(eff, dict) or set(eff) - _EFFICIENCY_KEYS:
            unknown = sorted(set(eff) - _EFFICIENCY_KEYS) if isinstance(eff, dict) else []
            raise InputFileError(source, f"efficiency: expected a mapping of {', '.join(sorted(_EFFICIENCY_KEYS))}"
                                 + (f"; unknown key '{unknown[0]}'" if unknown else ""))
        try:
            efficiency = DeviceEfficiency(**{k: float(v) for k, v in eff.items()})
        except (TypeError, ValueError) as exc:
            raise InputFileError(source, f"efficiency: {exc}") from None
        comm = data.get("intra_node_comm")
        if comm is not None and not isinstance(comm, dict):
            raise InputFileError(source, "intra_node_comm: expected a comm_model.json object or null")
        return Calibration(
            name=str(data["name"]), device=str(data["device"]), efficiency=efficiency,
            fitted=tuple(data.get("fitted", ())), at_bound=tuple(data.get("at_bound", ())),
            intra_node_comm=comm, data=data.get("data", {}), errors=data.get("errors", {}),
            assumptions=data.get("assumptions", {}),
        )

    def comm_model(self, cluster: Cluster) -> CommModel:
        """Collectives inside a node: the calibration's fit when it is for this device,
        else the cluster's intra-node link; across nodes: the cluster's inter-node link."""
        inter = ConstantBandwidthModel(cluster.inter.bandwidth_Bps, cluster.inter.bandwidth_Bps,
                                       cluster.inter.latency_s, cluster.inter.latency_s)
        intra: CommModel = ConstantBandwidthModel(cluster.intra.bandwidth_Bps, cluster.intra.bandwidth_Bps,
                                                  cluster.intra.latency_s, cluster.intra.latency_s)
        if self.intra_node_comm and self.device == cluster.device.name:
            from paraplan.comm.model import FittedCommModel

            intra = FittedCommModel.from_dict(self.intra_node_comm, f"calibration {self.name}: intra_node_comm")
        return TieredCommModel(intra, inter)


def load_calibration(name_or_path: str | Path = DEFAULT_CALIBRATION) -> Calibration:
    """A calibration by name (config/calibrations/<name>.json, see
    `paraplan.config_files`) or by path."""
    from paraplan import config_files

    path = config_files.find("calibrations", name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(path, "no such calibration file (make one with `paraplan calibrate`)") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise InputFileError(path, f"cannot read: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(path, f"not JSON: {exc.msg}", line=exc.lineno) from None
    return Calibration.from_dict(data, str(path))
