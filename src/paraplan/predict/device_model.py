"""How long a device takes for a kernel, and for a pass of kernels issued by a host.

A kernel's device time is a roofline with shape-dependent efficiency plus a fixed
latency:

    t = max(flops / (peak x efficiency), bytes / (bandwidth x memory_efficiency)) + latency

- GEMMs: `efficiency` = gemm_efficiency x wave x k-loop, where the output is cut into
  128 x 128 tiles spread over the device's compute units (the cluster file's
  `compute_units`: SMs or CUs) in waves (a last, partial wave leaves units idle:
  wave = tiles / (waves x units); no such factor when the file states none), and a tile's main loop
  over the inner dimension k runs at k / (k + gemm_k_half) of its speed (the
  prologue and epilogue cost about as much as gemm_k_half steps). Small GEMMs are
  therefore slower per FLOP; large ones reach gemm_efficiency of the peak.
- Fused (flash) attention: attention_fwd_efficiency (forward) or attention_bwd_efficiency
  (backward) of the peak, same roofline, times s / (s + attention_seq_half) for a
  sequence of s tokens (short sequences leave the kernel's pipeline part empty; 0: no
  such factor). The values come from published or measured attention kernels
  (`paraplan fit --kind kernels`, `config/kernels/<device>.json`); a run whose
  `attention_backend` runs another kernel than the calibration's is priced at that
  kernel's (`DeviceSpeed.attention`, `paraplan.kernels.attention_backends`).
- Memory-bound kernels (norms, softmax, dropout, activations, optimizer): bytes at
  memory_efficiency of the bandwidth.
- Every row pays the latency once per device launch (`Kernels.launches`): once, but a
  grouped GEMM once per group (a MoE layer's local experts: their tiles share the
  waves, each expert's GEMM its own launch) and a framework call that launches several
  memory kernels once per kernel (the FP8 casts of a grouped GEMM's splits).

The host (Python and the framework's dispatcher) issues kernels one by one and may
run ahead of the device. One pipeline op (a micro-batch's forward or backward on a
stage) of n kernels with total device time G and host time H = n x host_kernel_s +
collectives x host_collective_s + host_microbatch_s takes the smooth maximum
(G^q + H^q)^(1/q): the device time when it dominates (large models), the host's
when kernels are short (small models), and more than either near the crossover,
where neither side always waits for the other.

The parameters are what `paraplan calibrate` fits (`DeviceEfficiency`); the peaks and
bandwidths come from the cluster file (vendor datasheets).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.core.cluster import Device
from paraplan.core.errors import StrategyError
from paraplan.core.limits import MAX_WIDTH, WIDTH_WHY
from paraplan.predict.layer_factors import NO_FACTORS, LayerTimeFactors
from paraplan.predict.ops import ATTENTION, FP8_GEMM, GEMM, Kernels
from paraplan.predict.parameters import FitRange, Parameter, declared_parameters, parameter

TILE = 128.0
COMM_OVERLAP_CONTENTION = 0.607
"""`DeviceEfficiency.comm_overlap_contention` fitted on Korthikanti et al. 2022, Table 4
(`paraplan.predict.contention_fit`, with the a100-vtrain calibration and dgx-a100): an
overlapped tensor-parallel collective on A100 NVLink hides about two fifths of the
shorter of the two). Refit when a100-vtrain is recalibrated: the fit prices the layer's
kernels with it (0.995 with the calibration of GEMMs fitted to the runs alone; 0.884
since the GEMM and attention ceilings come from kernel micro-benchmarks; 0.862 since
Megatron's loss is priced kernel by kernel, `paraplan.predict.loss_ops`; 0.850 since the
8 GPUs of the layer wait for the slowest one, `paraplan.predict.variability`; 0.656 since
the backward's residual junctions price their bias gradient and the sum of the residual
stream's two gradients, `paraplan.predict.ops._residual_backward`; 0.603 then 0.607 since the A100's
GEMM and attention ceilings are held at its 400 W limit, docs/kernels.md, with the
optimizer step's bytes as counted from Megatron-LM's source)."""
PEAK_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp8": "float8", "fp32": "float32"}


_ISSUE_WHY = "more than a second to run or issue one kernel or collective; wrong unit? (seconds)"


def _fraction(fit: FitRange | None = None, from_profile: bool = False) -> Parameter:
    return Parameter("a fraction of the peak", 0, 1, low_inclusive=False, fit=fit, from_profile=from_profile)


def _width(what: str, fit: FitRange | None = None, from_profile: bool = False) -> Parameter:
    return Parameter(what, 0, plausible_high=MAX_WIDTH, why=WIDTH_WHY, fit=fit, from_profile=from_profile)


def _issue_s(fit: FitRange, from_profile: bool = False) -> Parameter:
    return Parameter("seconds", 0, plausible_high=1.0, why=_ISSUE_WHY, fit=fit, from_profile=from_profile)


@dataclass(frozen=True)
class DeviceEfficiency:
    """The calibrated part of the device model (see the module doc). Each parameter is
    declared here once: its type, default and docstring, and (`paraplan.predict.parameters`)
    its unit, the range a calibration file may hold, the range `paraplan calibrate`
    searches and whether a layer profile fits it by default."""

    gemm_efficiency: float = parameter(0.80, _fraction(FitRange(0.30, 0.95), from_profile=True))
    """Fraction of the dtype's dense peak that large GEMMs reach."""
    gemm_k_half: float = parameter(64.0, _width("a GEMM depth in elements", FitRange(0.0, 1024.0, 100.0),
                                                from_profile=True))
    """Inner dimension at which a GEMM tile's main loop runs at half speed."""
    attention_fwd_efficiency: float = parameter(0.55, _fraction())
    """Fraction of the peak that fused (flash) attention's forward reaches (long sequences)."""
    attention_bwd_efficiency: float = parameter(0.55, _fraction())
    """Fraction of the peak that fused (flash) attention's backward reaches (long sequences)."""
    attention_seq_half: float = parameter(0.0, _width("a sequence length in tokens"))
    """Sequence length at which attention runs at half its long-sequence efficiency (0: none)."""
    memory_efficiency: float = parameter(0.80, _fraction(FitRange(0.30, 0.95), from_profile=True))
    """Fraction of the memory bandwidth that memory-bound kernels reach."""
    kernel_latency_s: float = parameter(4e-6, _issue_s(FitRange(1e-6, 10e-6, 1e-6), from_profile=True))
    """Fixed device time per kernel (launch, ramp-up, tail)."""
    host_kernel_s: float = parameter(0.0, _issue_s(FitRange(0.0, 200e-6, 1e-6), from_profile=True))
    """Host time to issue one kernel (framework dispatch)."""
    host_collective_s: float = parameter(0.0, _issue_s(FitRange(0.0, 500e-6, 1e-6)))
    """Host time to issue one collective."""
    host_microbatch_s: float = parameter(0.0, Parameter(
        "seconds", 0, plausible_high=10.0, why="more than 10 s of host work per pipeline op; wrong unit? (seconds)",
        fit=FitRange(0.0, 20e-3, 1e-3)))
    """Host time per pipeline op (one micro-batch's forward or backward on a stage):
    the framework's schedule step, point-to-point setup, loss and bookkeeping."""
    host_overlap_exponent: float = parameter(4.0, Parameter("an exponent", 1, plausible_high=1000,
                                                            fit=FitRange(1.0, 20.0)))
    """q of the smooth maximum of device and host time (large q: plain maximum)."""
    comm_overlap_contention: float = parameter(COMM_OVERLAP_CONTENTION,
                                               Parameter("a share of the overlapped time", 0, 1))
    """Share of an overlapped collective's time that the kernel beside it loses (NCCL's
    kernels take SMs and memory bandwidth from it): a collective of time c beside a GEMM
    of time g takes max(c, g) + share x min(c, g); 0: free overlap, 1: none. Fitted
    on the per-layer times of Korthikanti et al. 2022, Table 4 (docs/execution-model.md)."""
    layer_time_factors: LayerTimeFactors = NO_FACTORS
    """Measured corrections of a layer's kernel time per layer shape
    (`paraplan.predict.layer_factors`); none: the analytic model alone."""

    def __post_init__(self) -> None:
        for name in EFFICIENCY_PARAMETERS:
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"DeviceEfficiency.{name} must be a finite number >= 0, got {value!r}")
        for name, declared in PARAMETERS.items():
            value = getattr(self, name)
            if declared.outside_domain(value):
                raise ValueError(f"DeviceEfficiency.{name} must be {declared.domain}, got {value!r}")

    def as_dict(self) -> dict[str, float]:
        """The numeric parameters (`EFFICIENCY_PARAMETERS`), without the factor table.

        One attention efficiency for both passes and no sequence factor is written as
        the single `attention_efficiency` of older calibration files, so those files
        (and their digests) stay as they were."""
        values = {k: float(getattr(self, k)) for k in EFFICIENCY_PARAMETERS}
        if self.attention_fwd_efficiency == self.attention_bwd_efficiency and self.attention_seq_half == 0:
            merged: dict[str, float] = {}
            for key, value in values.items():
                if key == "attention_fwd_efficiency":
                    merged[LEGACY_ATTENTION] = value
                elif key not in ATTENTION_PARAMETERS:
                    merged[key] = value
            return merged
        return values


PARAMETERS: dict[str, Parameter] = declared_parameters(DeviceEfficiency)
"""The declarations of `DeviceEfficiency`'s calibrated parameters, in field order."""
EFFICIENCY_PARAMETERS: tuple[str, ...] = tuple(PARAMETERS)
"""The numeric parameters of `DeviceEfficiency`."""
ATTENTION_PARAMETERS: tuple[str, ...] = ("attention_fwd_efficiency", "attention_bwd_efficiency", "attention_seq_half")
LEGACY_ATTENTION = "attention_efficiency"
"""One efficiency for both attention passes (older calibration files): both of them."""


@dataclass(frozen=True)
class Fp8GemmCeiling:
    """A device's FP8 GEMMs: the datasheet's FP8 dense peak and the ceiling measured by
    FP8 GEMM micro-benchmarks (`config/kernels/<device>.json`, section `fp8`); an FP8
    GEMM is priced as a GEMM at these instead of the calibration's (`paraplan.predict.fp8_ops`)."""

    peak_flops: float
    gemm_efficiency: float
    gemm_k_half: float


@dataclass(frozen=True)
class AttentionCeiling:
    """One attention kernel's ceilings on a device (`config/kernels/<device>.json`), for a
    run whose kernel is not the one the calibration's attention parameters describe
    (`paraplan.kernels.attention_backends`): its attention passes are priced with these."""

    kernel: str
    attention_fwd_efficiency: float
    attention_bwd_efficiency: float
    attention_seq_half: float


@dataclass(frozen=True)
class DeviceSpeed:
    """The datasheet numbers the model needs for one dtype."""

    peak_flops: float
    mem_bandwidth_Bps: float
    compute_units: int = 0  # 0: not stated, no wave quantisation
    fp8_gemm: Fp8GemmCeiling | None = None  # an fp8 run's FP8 GEMMs (`fp8_ops.device_speed`)
    attention: AttentionCeiling | None = None  # a run's attention kernel other than the calibration's
    compute_time_factor: float = 1.0  # the job's slowest GPU on compute-bound time (`predict.variability`)

    @staticmethod
    def of(device: Device, dtype: str) -> DeviceSpeed:
        name = PEAK_DTYPE_NAMES.get(dtype, dtype)
        listed = dict(device.peak_flops_by_dtype)
        if listed and name not in listed:
            raise StrategyError(
                f"dtype {dtype}: device {device.name} lists no {name} peak in its cluster file "
                f"(it has {', '.join(sorted(listed))}); it cannot run this precision on its tensor cores")
        peak = device.peak_flops_for(name)
        return DeviceSpeed(peak, device.mem_bandwidth_Bps, device.compute_units)


def gemm_efficiency(m: np.ndarray, n: np.ndarray, k: np.ndarray, batch: np.ndarray,
                    speed: DeviceSpeed, eff: DeviceEfficiency) -> np.ndarray:
    """Fraction of the peak a GEMM of this shape reaches (wave x k-loop x top)."""
    kloop = k / (k + eff.gemm_k_half)
    if speed.compute_units < 1:
        return eff.gemm_efficiency * kloop
    tiles = np.ceil(m / TILE) * np.ceil(n / TILE) * batch
    units = float(speed.compute_units)
    waves = np.ceil(tiles / units)
    wave = tiles / np.maximum(waves * units, 1.0)
    return eff.gemm_efficiency * wave * kloop


def attention_efficiency(seq_length: np.ndarray, backward: np.ndarray, eff: DeviceEfficiency) -> np.ndarray:
    """Fraction of the peak a fused attention kernel reaches (see the module doc);
    `seq_length` 0 (not stated) applies no sequence factor."""
    top = np.where(backward, eff.attention_bwd_efficiency, eff.attention_fwd_efficiency)
    if eff.attention_seq_half <= 0:
        return top
    s = np.asarray(seq_length, dtype=float)
    return np.where(s > 0, top * s / np.maximum(s + eff.attention_seq_half, 1e-300), top)


def kernel_times_s(kernels: Kernels, speed: DeviceSpeed, eff: DeviceEfficiency) -> np.ndarray:
    """Device time of every kernel (see the module doc)."""
    if len(kernels) == 0:
        return np.zeros(0)
    efficiency = np.full(len(kernels), 1.0)
    is_gemm = kernels.kind == GEMM
    if is_gemm.any():
        efficiency[is_gemm] = gemm_efficiency(kernels.m[is_gemm], kernels.n[is_gemm], kernels.k[is_gemm],
                                              kernels.batch[is_gemm], speed, eff)
    is_attention = kernels.kind == ATTENTION
    if is_attention.any():
        kernel = speed.attention
        attention_eff = eff if kernel is None else replace(
            eff, attention_fwd_efficiency=kernel.attention_fwd_efficiency,
            attention_bwd_efficiency=kernel.attention_bwd_efficiency, attention_seq_half=kernel.attention_seq_half)
        efficiency[is_attention] = attention_efficiency(kernels.m[is_attention], kernels.n[is_attention] > 0,
                                                       attention_eff)
    peak = np.full(len(kernels), speed.peak_flops)
    is_fp8 = kernels.kind == FP8_GEMM
    if is_fp8.any():
        fp8 = speed.fp8_gemm
        if fp8 is None:
            raise StrategyError("FP8 GEMMs need the device's measured FP8 GEMM ceiling (paraplan.predict.fp8_ops)")
        ceiling = replace(eff, gemm_efficiency=fp8.gemm_efficiency, gemm_k_half=fp8.gemm_k_half)
        efficiency[is_fp8] = gemm_efficiency(kernels.m[is_fp8], kernels.n[is_fp8], kernels.k[is_fp8],
                                             kernels.batch[is_fp8], speed, ceiling)
        peak[is_fp8] = fp8.peak_flops
    compute = kernels.flops / (peak * np.maximum(efficiency, 1e-9)) * speed.compute_time_factor
    memory = kernels.bytes / (speed.mem_bandwidth_Bps * eff.memory_efficiency)
    return np.maximum(compute, memory) + kernels.launches * eff.kernel_latency_s


def memory_time_s(nbytes: float, speed: DeviceSpeed, eff: DeviceEfficiency, kernels: int = 1) -> float:
    """A memory-bound piece of work moving `nbytes` in `kernels` kernels."""
    return nbytes / (speed.mem_bandwidth_Bps * eff.memory_efficiency) + kernels * eff.kernel_latency_s


def host_bound_s(device_s: np.ndarray, host_s: np.ndarray, eff: DeviceEfficiency) -> np.ndarray:
    """Smooth maximum of device and host time, elementwise (see the module doc)."""
    device = np.asarray(device_s, dtype=float)
    host = np.asarray(host_s, dtype=float)
    top = np.maximum(np.maximum(device, host), 1e-300)
    q = eff.host_overlap_exponent
    return top * ((device / top) ** q + (host / top) ** q) ** (1.0 / q)
