"""Fit the device model's compute ceilings to measured kernels, with held-out errors.

GEMM: `gemm_efficiency` (the fraction of the dtype's dense peak that large GEMMs
reach), `gemm_k_half` (the small-k penalty) and `kernel_latency_s`, with the wave
quantisation of the cluster file's `compute_units`, exactly as
`paraplan.predict.device_model.kernel_times_s` prices a GEMM. The fit minimises the
squared log ratio of predicted to measured time (relative errors: a 3 us and a 3 ms
GEMM count alike). With fewer shapes than parameters plus one, only
`gemm_efficiency` is fitted and the others stay at the model's defaults (said so in
the result). Held-out error: leave one shape out (each shape predicted by a fit that
never saw it). GEMMs below `min_flops` (default of `paraplan fit`: 1e10, about a
2048^3 product) are left out of the fit and their error reported apart: the 128 x 128
tile waves of the device model describe training-sized GEMMs; libraries run small
ones with other tiles (and split k), which the model does not describe.

Attention: `attention_fwd_efficiency`, `attention_bwd_efficiency` and
`attention_seq_half` (efficiency = top x s / (s + s_half)), the GEMM's latency held.
A forward+backward measurement is the sum of the two passes; data that has only
forward+backward measurements cannot tell the passes apart, and the fit then gives
both one efficiency (said so). Held-out error: leave one sequence length out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from paraplan.core.errors import ParaplanError
from paraplan.kernels.results import AttentionTimes, GemmTimes, attention_flops
from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed, kernel_times_s
from paraplan.predict.ops import ATTENTION, GEMM, Kernels

# name: (lower, upper, scale of the optimiser's variable)
GEMM_BOUNDS: dict[str, tuple[float, float, float]] = {
    "gemm_efficiency": (0.05, 1.0, 1.0),
    "gemm_k_half": (0.0, 4096.0, 100.0),
    "kernel_latency_s": (0.0, 20e-6, 1e-6),
}
ATTENTION_BOUNDS: dict[str, tuple[float, float, float]] = {
    "attention_fwd_efficiency": (0.05, 1.0, 1.0),
    "attention_bwd_efficiency": (0.05, 1.0, 1.0),
    "attention_seq_half": (0.0, 16384.0, 100.0),
}


@dataclass(frozen=True)
class FitReport:
    """A fit's parameters and its errors (fractions: 0.05 = 5%)."""

    params: dict[str, float]
    fitted: tuple[str, ...]
    at_bound: tuple[str, ...]
    n_points: int
    mape: float
    heldout_mape: float | None  # None: too few points or groups to hold any out
    heldout_max_ape: float | None
    heldout_scheme: str
    note: str = ""
    small_shape_mape: float | None = None  # GEMMs below the fit's min_flops, predicted by it
    small_shapes: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"params": self.params, "fitted": list(self.fitted), "at_bound": list(self.at_bound),
                "n_points": self.n_points, "mape": self.mape, "heldout_mape": self.heldout_mape,
                "heldout_max_ape": self.heldout_max_ape, "heldout_scheme": self.heldout_scheme, "note": self.note,
                "small_shapes": self.small_shapes, "small_shape_mape": self.small_shape_mape}


def _gemm_kernels(times: GemmTimes) -> Kernels:
    m, n, k, b = times.m, times.n, times.k, times.batch
    size = {"float32": 4, "float64": 8}.get(times.dtype, 2)
    nbytes = size * (m * k + k * n + m * n) * b
    if is_fp8_dtype(times.dtype):  # FP8 inputs, BF16 output (as an FP8 GEMM of paraplan.predict.ops)
        nbytes = (m * k + k * n + 2 * m * n) * b
    return Kernels(np.full(len(times), GEMM, dtype=np.int8), 2.0 * m * n * k * b, nbytes,
                   m, n, k, b, np.zeros(len(times), dtype=bool), np.ones(len(times)))


def is_fp8_dtype(dtype: str) -> bool:
    """An FP8 GEMM's dtype as benchmarks print it (`float8_e4m3fn`, `float8_e5m2`, ...)."""
    return dtype.startswith("float8")


def _least_squares(residuals: Callable[[np.ndarray], np.ndarray], names: Sequence[str],
                   bounds: dict[str, tuple[float, float, float]], start: dict[str, float]) -> tuple[np.ndarray, tuple]:
    from scipy.optimize import least_squares

    scale = np.array([bounds[n][2] for n in names])
    lower = np.array([bounds[n][0] for n in names]) / scale
    upper = np.array([bounds[n][1] for n in names]) / scale
    x0 = np.clip(np.array([start[n] for n in names]) / scale, lower + 1e-9, upper - 1e-9)
    result = least_squares(lambda x: residuals(x * scale), x0, bounds=(lower, upper), x_scale="jac",
                           ftol=1e-10, xtol=1e-10, gtol=1e-10, max_nfev=2000)
    span = upper - lower
    at_bound = tuple(n for n, x, lo, s in zip(names, result.x, lower, span, strict=True)
                     if min(x - lo, lo + s - x) <= 1e-4 * s)
    return result.x * scale, at_bound


def _errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(predicted / measured - 1.0)


def predict_gemm_s(times: GemmTimes, speed: DeviceSpeed, eff: DeviceEfficiency) -> np.ndarray:
    """The device model's time for each measured GEMM."""
    return kernel_times_s(_gemm_kernels(times), speed, eff)


DEFAULTS = DeviceEfficiency()


def fit_gemm(times: GemmTimes, speed: DeviceSpeed, base: DeviceEfficiency = DEFAULTS,
             min_flops: float = 0.0, held: tuple[str, ...] = ()) -> FitReport:
    """The GEMM parameters (see the module doc) fitted to the GEMMs of `times` with at
    least `min_flops` FLOPs, with leave-one-shape-out errors; the smaller ones are
    predicted by that fit and their error reported apart (`small_shape_mape`). The
    parameters named in `held` stay at `base`'s values (said in the report's note)."""
    small = times.flops < min_flops
    if small.all():
        raise ParaplanError(f"no GEMM measurements of {times.device} in {times.dtype} with at least "
                            f"{min_flops:g} FLOPs to fit")
    outside = times.subset(small)
    times = times.subset(~small)
    free = tuple(n for n in GEMM_BOUNDS if n not in held)
    names = free if len(times) > len(free) else ("gemm_efficiency",)
    start = {n: float(getattr(base, n)) for n in GEMM_BOUNDS}
    kernels = _gemm_kernels(times)
    log_measured = np.log(times.time_s)

    def efficiency(x: np.ndarray) -> DeviceEfficiency:
        values: dict[str, Any] = {n: float(v) for n, v in zip(names, x, strict=True)}
        return replace(base, **values)

    def fit(idx: np.ndarray) -> tuple[np.ndarray, tuple]:
        def residuals(x: np.ndarray) -> np.ndarray:
            return np.log(kernel_times_s(kernels, speed, efficiency(x))[idx]) - log_measured[idx]
        return _least_squares(residuals, names, GEMM_BOUNDS, start)

    everything = np.arange(len(times))
    x, at_bound = fit(everything)
    best = efficiency(x)
    insample = _errors(kernel_times_s(kernels, speed, best), times.time_s)
    heldout: np.ndarray | None = None
    if len(times) > len(names) + 1:
        heldout = np.zeros(len(times))
        for i in everything:
            xi, _ = fit(everything[everything != i])
            heldout[i] = _errors(kernel_times_s(kernels, speed, efficiency(xi))[i:i + 1], times.time_s[i:i + 1])[0]
    note = "" if names == tuple(GEMM_BOUNDS) else (
        f"{len(times)} shape(s): only gemm_efficiency fitted; gemm_k_half and kernel_latency_s held at "
        f"{base.gemm_k_half:g} and {base.kernel_latency_s:g} s" if names == ("gemm_efficiency",) else
        f"{', '.join(n for n in GEMM_BOUNDS if n not in names)} held at "
        f"{', '.join(f'{getattr(base, n):g}' for n in GEMM_BOUNDS if n not in names)}")
    small_mape = float(_errors(predict_gemm_s(outside, speed, best), outside.time_s).mean()) if len(outside) else None
    return FitReport({n: float(getattr(best, n)) for n in GEMM_BOUNDS}, names, at_bound, len(times),
                     float(insample.mean()), None if heldout is None else float(heldout.mean()),
                     None if heldout is None else float(heldout.max()), "leave one shape out", note,
                     small_mape, len(outside))


def _attention_kernels(times: AttentionTimes, element_bytes: int = 2) -> tuple[Kernels, np.ndarray]:
    """One kernel per pass: forward+backward rows give two (forward, backward); returns
    the kernels and, per kernel, the measurement it belongs to."""
    rows: list[tuple[float, float, float, float]] = []  # flops, bytes, seq, backward
    owner: list[int] = []
    for i in range(len(times)):
        b, h, s, d = times.batch[i], times.heads[i], times.seq_length[i], times.head_dim[i]
        causal = bool(times.causal[i])
        tokens = b * s
        passes = {"fwd": ("fwd",), "bwd": ("bwd",), "fwd_bwd": ("fwd", "bwd")}[str(times.attention_pass[i])]
        for p in passes:
            flops = attention_flops(b, h, s, d, causal, p)
            nbytes = element_bytes * tokens * (4 if p == "fwd" else 8) * h * d
            rows.append((flops, nbytes, s, 1.0 if p == "bwd" else 0.0))
            owner.append(i)
    col = np.array(rows, dtype=float).T
    n = col.shape[1]
    kernels = Kernels(np.full(n, ATTENTION, dtype=np.int8), col[0], col[1], col[2], col[3], np.zeros(n), np.ones(n),
                      np.zeros(n, dtype=bool), np.ones(n))
    return kernels, np.array(owner)


def predict_attention_s(times: AttentionTimes, speed: DeviceSpeed, eff: DeviceEfficiency) -> np.ndarray:
    """The device model's time for each measured attention pass (forward+backward summed)."""
    kernels, owner = _attention_kernels(times)
    return np.bincount(owner, weights=kernel_times_s(kernels, speed, eff), minlength=len(times))


def fit_attention(times: AttentionTimes, speed: DeviceSpeed, base: DeviceEfficiency) -> FitReport:
    """The attention parameters (see the module doc) fitted to `times`, with
    leave-one-sequence-length-out errors; `base` holds the kernel latency."""
    if len(times) == 0:
        raise ParaplanError(f"no attention measurements of {times.device} to fit")
    passes = set(times.attention_pass.tolist())
    separate = bool(passes & {"fwd"}) and bool(passes & {"bwd", "fwd_bwd"})
    names: tuple[str, ...] = ((*ATTENTION_BOUNDS,) if separate
                              else ("attention_fwd_efficiency", "attention_seq_half"))
    bounds = dict(ATTENTION_BOUNDS)
    kernels, owner = _attention_kernels(times)
    log_measured = np.log(times.time_s)
    start = {"attention_fwd_efficiency": 0.6, "attention_bwd_efficiency": 0.6, "attention_seq_half": 256.0}

    def efficiency(x: np.ndarray) -> DeviceEfficiency:
        values: dict[str, Any] = {n: float(v) for n, v in zip(names, x, strict=True)}
        if not separate:
            values["attention_bwd_efficiency"] = values["attention_fwd_efficiency"]
        return replace(base, **values)

    def predict(eff: DeviceEfficiency) -> np.ndarray:
        return np.bincount(owner, weights=kernel_times_s(kernels, speed, eff), minlength=len(times))

    def fit(idx: np.ndarray) -> tuple[np.ndarray, tuple]:
        def residuals(x: np.ndarray) -> np.ndarray:
            return np.log(predict(efficiency(x))[idx]) - log_measured[idx]
        return _least_squares(residuals, names, bounds, start)

    everything = np.arange(len(times))
    x, at_bound = fit(everything)
    best = efficiency(x)
    insample = _errors(predict(best), times.time_s)
    lengths = sorted(set(times.seq_length.tolist()))
    heldout: np.ndarray | None = None
    if len(lengths) > 2:
        heldout = np.zeros(len(times))
        for s in lengths:
            test = times.seq_length == s
            xi, _ = fit(everything[~test])
            heldout[test] = _errors(predict(efficiency(xi))[test], times.time_s[test])
    note = "" if separate else ("only forward+backward measurements: one efficiency for both passes "
                                "(attention_bwd_efficiency = attention_fwd_efficiency)")
    params = {n: float(getattr(best, n)) for n in ATTENTION_BOUNDS}
    fitted = names if separate else (*names, "attention_bwd_efficiency")
    return FitReport(params, fitted, at_bound, len(times), float(insample.mean()),
                     None if heldout is None else float(heldout.mean()),
                     None if heldout is None else float(heldout.max()), "leave one sequence length out", note)
