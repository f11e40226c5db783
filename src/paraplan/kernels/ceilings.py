"""A device's measured compute ceilings: the device model's GEMM and attention
parameters fitted to kernel micro-benchmarks (`paraplan fit --kind kernels`), as a
small versioned JSON file, `config/kernels/<device>.json`:

    {"schema_version": 1, "device": "H100-SXM5-80GB", "cluster": "dgx-h100",
     "efficiency": {"gemm_efficiency": ..., "gemm_k_half": ..., "kernel_latency_s": ...,
                    "attention_fwd_efficiency": ...,
                    "attention_bwd_efficiency": ..., "attention_seq_half": ...},
     "gemm": {...fit report: dtype, data, errors...}, "attention": {...} or null,
     "attention_kernels": {"flash-attention-2": {...fit report of another kernel...,
                                                  "efficiency": {...its three parameters...}}},
     "fp8": {"dtype": "float8_e4m3fn", "peak_flops": ...,
             "efficiency": {"gemm_efficiency": ..., "gemm_k_half": ...}, ...fit report...},
     "power_limit_w": 700.0}

`attention` is the device's first attention kernel (its `kernel` key): the one
Transformer Engine picks on the device (`attention_backend auto`), whose parameters
`efficiency` holds. `attention_kernels` (present only when more kernels were fitted:
`paraplan fit --kind kernels --attention-kernel cudnn,flash-attention-2`) holds the fit
report of each further kernel by name; a run whose `attention_backend` runs one of them
is priced with its `params` (`paraplan.kernels.attention_backends`). An entry named
`<kernel>@hdim<d>` (`--attention-head-dim 128,64`) is that kernel fitted at head
dimension d instead of the main fit's: it prices the runs of that kernel whose
query/key head width is d.

Each attention fit report keeps its burst fit in `params` (its errors are against burst
data); where the device's sustained factor is known, the report also has `sustained` (the
factor, its rows and why it applies) and `efficiency`: the two efficiencies times it, what
a training step runs at and what prices the kernel (the first kernel's are `efficiency`'s
at the top). A report without `efficiency` is priced at its `params`.

`fp8` (present only for a device whose FP8 GEMMs were measured) is the FP8 GEMM
ceiling dtype fp8 runs are priced with (`paraplan.predict.fp8_ops`, docs/fp8.md): its
`gemm_efficiency` is fitted on the FP8 rows; `gemm_k_half` is fitted too with enough
shapes, else held at the BF16 fit's value (the same tile machinery).

`power_limit_w` (present only where the fit's cluster file states its device's
`power_limit_w`) is the power limit the kernels were measured at. A device priced by
these ceilings at another limit (`same_compute_as`) gets a note from `predict` and
`plan` (`power_limit_note`): a power cap sets the clock compute-bound kernels hold.

`efficiency` holds the parameters the kernel data determined, which `paraplan
calibrate --kernel-ceilings` keeps at these values (`held_parameters`): the GEMM
parameters the fit could identify (all three with enough shapes; only
`gemm_efficiency` from a single published shape) and the attention ones. The fit
reports say which data each came from and their held-out errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from paraplan.core import limits as lim
from paraplan.core.errors import InputFileError
from paraplan.inputs import NumberRule, check_number, read_json_object
from paraplan.predict.calibration import EFFICIENCY_RULES
from paraplan.predict.device_model import Fp8GemmCeiling

SCHEMA_VERSION = 1
HELD: tuple[str, ...] = ("gemm_efficiency", "gemm_k_half", "kernel_latency_s", "attention_fwd_efficiency",
                         "attention_bwd_efficiency", "attention_seq_half")
"""The parameters a kernel file may fix for a calibration (those its data determined)."""
POWER_LIMIT_RULE = NumberRule("the measured device's power limit in W", 0.0, lim.MAX_POWER_LIMIT_W,
                              low_inclusive=False, why="a device's power limit is above 0 and at most 10 kW; "
                              "wrong unit? (power_limit_w is in watts)")


@dataclass(frozen=True)
class KernelCeilings:
    device: str
    efficiency: Mapping[str, float]
    cluster: str = ""
    gemm: Mapping = field(default_factory=dict)
    attention: Mapping | None = None
    fp8: Mapping | None = None
    attention_kernels: Mapping[str, Mapping] = field(default_factory=dict)
    power_limit_w: float | None = None
    """The power limit (W) of the device the kernels were measured on, as the fit's cluster
    file states it (`device.power_limit_w`); None: not stated."""

    def attention_ceilings(self) -> dict[str, dict[str, float]]:
        """Every attention kernel of the file by name: its three attention parameters
        (the first kernel's as `efficiency` holds them)."""
        out: dict[str, dict[str, float]] = {}
        if self.attention is not None:
            out[str(self.attention.get("kernel", ""))] = {k: float(self.efficiency[k]) for k in ATTENTION_HELD}
        for name, report in self.attention_kernels.items():
            out[name] = {k: float(priced_attention(report)[k]) for k in ATTENTION_HELD}
        return out

    def to_dict(self) -> dict:
        out = {"schema_version": SCHEMA_VERSION, "device": self.device, "cluster": self.cluster,
               "efficiency": dict(self.efficiency), "gemm": dict(self.gemm),
               "attention": None if self.attention is None else dict(self.attention)}
        if self.attention_kernels:
            out["attention_kernels"] = {k: dict(v) for k, v in self.attention_kernels.items()}
        if self.fp8 is not None:
            out["fp8"] = dict(self.fp8)
        if self.power_limit_w is not None:
            out["power_limit_w"] = self.power_limit_w
        return out

    @staticmethod
    def from_dict(data: object, source: str) -> KernelCeilings:
        if not isinstance(data, dict):
            raise InputFileError(source, "expected a JSON object (paraplan fit --kind kernels)")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise InputFileError(source, f"schema_version {data.get('schema_version')!r}; expected {SCHEMA_VERSION}")
        device = data.get("device")
        if not isinstance(device, str) or not device.strip():
            raise InputFileError(source, f"expected a device name, got {device!r}", field="device")
        eff = data.get("efficiency")
        if not isinstance(eff, dict):
            raise InputFileError(source, "expected a mapping of parameters", field="efficiency")
        unknown = sorted(set(eff) - set(HELD))
        if unknown:
            raise InputFileError(source, f"unknown parameter '{unknown[0]}'; expected some of {', '.join(HELD)}",
                                 field="efficiency")
        values = {}
        for key, value in eff.items():
            rule = EFFICIENCY_RULES[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InputFileError(source, f"expected {rule.expected}, got {value!r}", field=f"efficiency.{key}")
            values[key] = float(check_number(source, None, f"efficiency.{key}", value, rule))
        for key in ("gemm", "attention", "fp8"):
            if data.get(key) is not None and not isinstance(data[key], dict):
                raise InputFileError(source, f"expected a JSON object, got {data[key]!r}", field=key)
        fp8 = data.get("fp8")
        if fp8 is not None:
            _check_fp8(fp8, source)
        for key in ("gemm", "attention", "fp8"):
            _check_sustained((data.get(key) or {}).get("sustained"), source, f"{key}.sustained")
        attention = data.get("attention")
        more = _attention_kernels(data.get("attention_kernels"), source)
        if attention is not None or more:
            _check_attention(attention, values, more, source)
        power = data.get("power_limit_w")
        if power is not None:
            if isinstance(power, bool) or not isinstance(power, int | float):
                raise InputFileError(source, f"expected {POWER_LIMIT_RULE.expected}, got {power!r}",
                                     field="power_limit_w")
            power = float(check_number(source, None, "power_limit_w", power, POWER_LIMIT_RULE))
        return KernelCeilings(device, values, str(data.get("cluster", "")), data.get("gemm") or {},
                              attention, fp8, more, power)


def head_dim_kernel(kernel: str, head_dim: int) -> str:
    """The `attention_kernels` name of `kernel`'s ceilings at another head dimension than
    the file's main fit (`paraplan fit --kind kernels --attention-head-dim 128,64`)."""
    return f"{kernel}@hdim{head_dim}"


ATTENTION_HELD: tuple[str, ...] = HELD[3:]
"""An attention kernel's parameters (forward and backward efficiency, seq_half)."""


def priced_attention(report: Mapping) -> Mapping:
    """An attention fit report's parameters as runs are priced: its `efficiency` (the
    burst fit held at the power limit) where it has one, else its `params`."""
    return report.get("efficiency") or report["params"]


def _check_attention(attention: dict | None, values: dict[str, float], more: dict[str, dict], source: str) -> None:
    """The first kernel named and its parameters in `efficiency`; no kernel twice."""
    if attention is None:
        raise InputFileError(source, "expected the first attention kernel's fit beside attention_kernels",
                             field="attention")
    kernel = attention.get("kernel")
    if not isinstance(kernel, str) or not kernel.strip():
        raise InputFileError(source, f"expected the kernel's name, got {kernel!r}", field="attention.kernel")
    missing = [k for k in ATTENTION_HELD if k not in values]
    if missing:
        raise InputFileError(source, f"missing {missing[0]} (the attention kernel {kernel}'s)", field="efficiency")
    if kernel in more:
        raise InputFileError(source, f"kernel {kernel} is the first attention kernel; expected other kernels",
                             field=f"attention_kernels.{kernel}")
    own = attention.get("efficiency")
    if own is not None:
        for key in ATTENTION_HELD:
            if not isinstance(own, dict) or own.get(key) != values[key]:
                got = own.get(key) if isinstance(own, dict) else own
                raise InputFileError(source, f"expected efficiency.{key}'s {values[key]!r} (the first kernel's), "
                                     f"got {got!r}", field=f"attention.efficiency.{key}")


def _attention_kernels(section: object, source: str) -> dict[str, dict]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise InputFileError(source, f"expected a JSON object of fits by kernel name, got {section!r}",
                             field="attention_kernels")
    for name, report in section.items():
        where = f"attention_kernels.{name}"
        if not name.strip():
            raise InputFileError(source, f"expected a kernel name, got {name!r}", field="attention_kernels")
        if isinstance(report, dict):
            _check_sustained(report.get("sustained"), source, f"{where}.sustained")
        params = report.get("params") if isinstance(report, dict) else None
        if not isinstance(params, dict):
            raise InputFileError(source, "expected a fit report with params", field=where)
        for part in ("params", "efficiency"):
            values = report.get(part)
            if values is None and part == "efficiency":
                continue
            if not isinstance(values, dict):
                raise InputFileError(source, f"expected a JSON object of parameters, got {values!r}",
                                     field=f"{where}.{part}")
            for key in ATTENTION_HELD:
                value = values.get(key)
                rule = EFFICIENCY_RULES[key]
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise InputFileError(source, f"expected {rule.expected}, got {value!r}",
                                         field=f"{where}.{part}.{key}")
                check_number(source, None, f"{where}.{part}.{key}", value, rule)
    return section


def _check_sustained(section: object, source: str, where: str) -> None:
    """A fit's `sustained` section (`paraplan fit --kind kernels`, its sustained/burst
    factor at the power limit), where it has one."""
    if section is None:
        return
    factor = section.get("factor") if isinstance(section, dict) else None
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
        got = f"factor {factor!r}" if isinstance(section, dict) else repr(section)
        raise InputFileError(source, "expected a JSON object whose factor (sustained / burst throughput) is a number "
                             f"> 0 and <= 1, got {got}", field=where)


FP8_HELD: tuple[str, ...] = ("gemm_efficiency", "gemm_k_half")
"""The parameters of a kernel file's `fp8` section (its FP8 GEMM ceiling)."""


def _check_fp8(section: dict, source: str) -> None:
    eff = section.get("efficiency")
    if not isinstance(eff, dict) or set(eff) != set(FP8_HELD):
        raise InputFileError(source, f"expected {{{', '.join(FP8_HELD)}}}, got {eff!r}", field="fp8.efficiency")
    for key, value in eff.items():
        rule = EFFICIENCY_RULES[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputFileError(source, f"expected {rule.expected}, got {value!r}", field=f"fp8.efficiency.{key}")
        check_number(source, None, f"fp8.efficiency.{key}", value, rule)


def load_kernel_ceilings(name_or_path: str | Path) -> KernelCeilings:
    """A kernel file by device name (config/kernels/<device>.json) or path."""
    from paraplan import config_files

    path = config_files.find("kernels", name_or_path)
    data = read_json_object(path, "a kernel fit (make one with `paraplan fit --kind kernels`)")
    return KernelCeilings.from_dict(data, str(path))


def shipped_kernel_ceilings(device: str) -> KernelCeilings | None:
    """`config/kernels/<device>.json` (a cluster file's device name), checked to be that
    device's; None when no kernel file ships for it."""
    from paraplan import config_files

    path = config_files.find("kernels", device)
    if not path.is_file():
        return None
    ceilings = load_kernel_ceilings(path)
    if ceilings.device != device:
        raise InputFileError(path, f"is for device {ceilings.device!r}, not {device!r}", field="device")
    return ceilings


def held_parameters(device: str) -> dict[str, float]:
    """The device model's parameters measured by kernel micro-benchmarks for `device`
    (a cluster file's device name): what `paraplan calibrate` holds instead of
    fitting. Empty when no kernel file ships for the device."""
    ceilings = shipped_kernel_ceilings(device)
    return {} if ceilings is None else dict(ceilings.efficiency)


def fp8_ceiling(device: str) -> Fp8GemmCeiling | None:
    """The FP8 GEMM ceiling of `config/kernels/<device>.json` (its `fp8` section; the
    peak is the file's, which `paraplan.predict.fp8_ops` replaces by the cluster
    file's); None when no file or no such section ships for the device."""
    ceilings = shipped_kernel_ceilings(device)
    if ceilings is None or ceilings.fp8 is None:
        return None
    eff = ceilings.fp8["efficiency"]
    return Fp8GemmCeiling(float(ceilings.fp8.get("peak_flops", 0.0)), float(eff["gemm_efficiency"]),
                          float(eff["gemm_k_half"]))


def power_limit_note(device_name: str, compute_name: str, power_limit_w: float | None) -> str:
    """A note where a device at `power_limit_w` is priced by kernel ceilings measured at
    another power limit (its `same_compute_as` device's, or its own file refitted
    elsewhere); "" where either limit is not stated or they agree. A power cap lowers the
    SM clock a compute-bound kernel holds, which paraplan does not model: GEMM and
    attention time is then a lower bound below the measured limit (docs/kernels.md)."""
    if power_limit_w is None:
        return ""
    ceilings = shipped_kernel_ceilings(compute_name)
    if ceilings is None or ceilings.power_limit_w is None or ceilings.power_limit_w == power_limit_w:
        return ""
    bound = "a lower bound" if power_limit_w < ceilings.power_limit_w else "an upper bound"
    return (f"{device_name} runs at a {power_limit_w:g} W power limit, but its GEMM and attention ceilings "
            f"(config/kernels/{compute_name}.json) were measured at {ceilings.power_limit_w:g} W; a power limit "
            f"sets the clock compute-bound kernels hold, which paraplan does not model, so their time here is "
            f"{bound} (docs/kernels.md#power-limits)")
