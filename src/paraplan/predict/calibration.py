"""A calibration: the device model's fitted parameters for one kind of device, the
data they were fitted on and their cross-validated error, as a small versioned JSON
file. Predictions name the calibration they used (`Calibration.label`).

    {"schema_version": 1, "name": "a100-vtrain", "device": "A100-SXM4-80GB",
     "efficiency": {...DeviceEfficiency...}, "fitted": [...], "at_bound": [...],
     "intra_node_comm": {...paraplan fit's comm_model.json...} or null,
     "layer_time_factors": [{"shape": "device=...,hidden=...,mbs=...,tp=...", "factor": 0.93, "runs": 48}, ...],
     "data": {...what it was fitted on...}, "errors": {...}, "assumptions": {...}}

`layer_time_factors` (optional; `paraplan.predict.layer_factors`) corrects the kernel
time of the layer shapes the calibration data measured; every other shape is priced
by the fitted parameters alone.

`intra_node_comm`, when present, prices collectives inside a node of the same
device (e.g. fitted on nccl-tests of that node). Collectives across nodes use the
cluster file's `network` (NICs per node and their line rate) through
`paraplan.comm.topology.TopologyCommModel` when it has one, else a flat ring at the
cluster file's `links.inter`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel, ConstantBandwidthModel, TieredCommModel
from paraplan.core.errors import ConfigError, InputFileError
from paraplan.inputs import NumberRule, check_number, read_json_object
from paraplan.predict.device_model import EFFICIENCY_PARAMETERS, LEGACY_ATTENTION, PARAMETERS, DeviceEfficiency
from paraplan.predict.layer_factors import NO_FACTORS, LayerTimeFactors

SCHEMA_VERSION = 1
DEFAULT_CALIBRATION = "a100-vtrain"
_EFFICIENCY_KEYS = {*EFFICIENCY_PARAMETERS, LEGACY_ATTENTION}
EFFICIENCY_RULES: dict[str, NumberRule] = {
    **{name: declared.valid for name, declared in PARAMETERS.items()},
    LEGACY_ATTENTION: PARAMETERS["attention_fwd_efficiency"].valid,
}
"""What each parameter in a calibration or kernel file may hold: the valid range of its declaration
(`DeviceEfficiency`; `paraplan calibrate` searches well inside it)."""


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
            "intra_node_comm": self.intra_node_comm,
            "layer_time_factors": self.efficiency.layer_time_factors.to_list(),
            "data": dict(self.data), "errors": dict(self.errors), "assumptions": dict(self.assumptions),
        }

    @property
    def digest(self) -> str:
        described: dict[str, object] = {"device": self.device, "efficiency": self.efficiency.as_dict(),
                     "intra_node_comm": self.intra_node_comm}
        if len(self.efficiency.layer_time_factors):  # (files without factors keep their digest)
            described["layer_time_factors"] = self.efficiency.layer_time_factors.to_list()
        text = json.dumps(described, sort_keys=True)
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
        values = {}
        for key, value in eff.items():
            rule = EFFICIENCY_RULES[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InputFileError(source, f"expected {rule.expected}, got {value!r}", field=f"efficiency.{key}")
            values[key] = float(check_number(source, None, f"efficiency.{key}", value, rule))
        if LEGACY_ATTENTION in values:  # older files: one efficiency for both passes
            both = [k for k in ("attention_fwd_efficiency", "attention_bwd_efficiency") if k in values]
            if both:
                raise InputFileError(source, f"give either {LEGACY_ATTENTION} (both passes) or {both[0]}, not both",
                                     field=f"efficiency.{LEGACY_ATTENTION}")
            legacy = values.pop(LEGACY_ATTENTION)
            values.update(attention_fwd_efficiency=legacy, attention_bwd_efficiency=legacy)
        factors = LayerTimeFactors.from_list(data.get("layer_time_factors", []), source)
        try:
            efficiency = DeviceEfficiency(**values, layer_time_factors=factors)
        except ValueError as exc:
            raise InputFileError(source, f"efficiency: {exc}") from None
        comm = data.get("intra_node_comm")
        if comm is not None:
            if not isinstance(comm, dict):
                raise InputFileError(source, "intra_node_comm: expected a comm_model.json object or null")
            from paraplan.comm.model import FittedCommModel

            FittedCommModel.from_dict(comm, f"{source}: intra_node_comm")  # checked here, used later
        for key in ("name", "device"):
            if not isinstance(data[key], str) or not data[key].strip():
                raise InputFileError(source, f"expected a non-empty string, got {data[key]!r}", field=key)
        for key in ("fitted", "at_bound"):
            listed = data.get(key, [])
            if not isinstance(listed, list) or not all(isinstance(v, str) for v in listed):
                raise InputFileError(source, f"expected a list of parameter names, got {listed!r}", field=key)
        for key in ("data", "errors", "assumptions"):
            if not isinstance(data.get(key, {}), dict):
                raise InputFileError(source, f"expected a JSON object, got {data[key]!r}", field=key)
        return Calibration(
            name=str(data["name"]), device=str(data["device"]), efficiency=efficiency,
            fitted=tuple(data.get("fitted", ())), at_bound=tuple(data.get("at_bound", ())),
            intra_node_comm=comm, data=data.get("data", {}), errors=data.get("errors", {}),
            assumptions=data.get("assumptions", {}),
        )

    def comm_model(self, cluster: Cluster) -> CommModel:
        """Collectives inside a node: the calibration's fit when it is for this device,
        else the cluster's intra-node link. Across nodes: NCCL's algorithms over the
        cluster's NICs (`TopologyCommModel`, the same intra-node model for the NVLink
        stages) when the cluster file has a `network`, else a flat ring at its
        inter-node link."""
        intra: CommModel = ConstantBandwidthModel(cluster.intra.bandwidth_Bps, cluster.intra.bandwidth_Bps,
                                                  cluster.intra.latency_s, cluster.intra.latency_s)
        if self.intra_node_comm and self.device == cluster.device.name:
            from paraplan.comm.model import FittedCommModel

            intra = FittedCommModel.from_dict(self.intra_node_comm, f"calibration {self.name}: intra_node_comm")
        if cluster.network is not None:
            from paraplan.comm.topology import TopologyCommModel

            return TopologyCommModel(intra, cluster.network, cluster.devices_per_node)
        inter = ConstantBandwidthModel(cluster.inter.bandwidth_Bps, cluster.inter.bandwidth_Bps,
                                       cluster.inter.latency_s, cluster.inter.latency_s)
        return TieredCommModel(intra, inter)


def load_calibration(name_or_path: str | Path = DEFAULT_CALIBRATION) -> Calibration:
    """A calibration by name (config/calibrations/<name>.json, see
    `paraplan.config_files`) or by path."""
    from paraplan import config_files

    path = config_files.find("calibrations", name_or_path)
    if not path.is_file() and not config_files.is_path(name_or_path, "calibrations"):
        # q6-moefirst: a mistyped name now lists the known ones, as --cluster does
        known = config_files.known_names("calibrations")
        raise ConfigError("calibration", f"no calibration named '{name_or_path}' ({path} not found)"
                          + (f"; known calibrations: {', '.join(known)}" if known else "")
                          + "; or a path to a `paraplan calibrate` JSON")
    data = read_json_object(path, "a calibration (make one with `paraplan calibrate`)")
    return Calibration.from_dict(data, str(path))


def shipped_calibration_for(device: str) -> str | None:
    """The name of a calibration for `device` in the calibration folders
    (`paraplan.config_files.search_dirs`), first folder first, names in order; none: None."""
    from paraplan import config_files

    for folder in config_files.search_dirs("calibrations"):
        for path in sorted(folder.glob("*.json")):
            try:
                listed = json.loads(path.read_text(encoding="utf-8")).get("device")
            except (OSError, UnicodeDecodeError, ValueError, AttributeError):
                continue  # an unreadable file is reported when it is asked for by name
            if listed == device:
                return path.stem
    return None


def calibration_for(cluster: Cluster, name_or_path: str | Path | None = None,
                    warn: Callable[[str], None] | None = None) -> Calibration:
    """The calibration a prediction on `cluster` uses: `name_or_path` when given, else
    the shipped one made for the cluster's device (with a warning where its attention
    efficiencies were carried from another device), else `DEFAULT_CALIBRATION` with a
    warning that its efficiencies are taken as fractions of another device's peaks."""
    if name_or_path is not None:
        return load_calibration(name_or_path)
    name = shipped_calibration_for(cluster.device.compute_name)
    if name is not None:
        shipped = load_calibration(name)
        carried = shipped.assumptions.get("carried_from_source", ())
        if warn is not None and "attention_fwd_efficiency" in carried:
            source = shipped.data.get("source_device", "another device")
            warn(f"{shipped.name}: no attention kernel of {cluster.device.name} is measured; its attention "
                 f"efficiencies are {source}'s taken as fractions of this device's peaks (docs/kernels.md)")
        return shipped
    calibration = load_calibration(DEFAULT_CALIBRATION)
    if warn is not None:
        warn(f"no calibration for {cluster.device.name}: {calibration.name}'s (fitted on {calibration.device}) "
             "efficiencies are taken as fractions of this device's peaks; make one with `paraplan calibrate` "
             "(or `--transfer` with this device's kernel fit)")
    return calibration


def transferred_calibration(source: Calibration, device: str, held: Mapping[str, float], held_from: str,
                            name: str) -> Calibration:
    """A calibration for `device` that has no measured training runs: its GEMM and
    attention parameters (`held`) from that device's kernel micro-benchmarks, every
    other parameter (host overheads, memory-bound efficiency, contention) from
    `source`, fitted on another device's runs. No layer-time factors (those are the
    source device's kernels) and no intra-node fit (that was the source's node)."""
    efficiency = replace(source.efficiency, layer_time_factors=NO_FACTORS, **held)
    carried = sorted(k for k in efficiency.as_dict() if k not in held)
    return Calibration(
        name=name, device=device, efficiency=efficiency, fitted=(), at_bound=(), intra_node_comm=None,
        data={"transferred_from": source.label, "source_device": source.device, "source_data": dict(source.data),
              "kernel_ceilings": held_from},
        errors={"note": "no training runs of this device were fitted: the source's cross-validated errors are on "
                        f"{source.device}", "source_errors": dict(source.errors)},
        assumptions={"held_at_kernel_fit": dict(held), "carried_from_source": carried},
    )
