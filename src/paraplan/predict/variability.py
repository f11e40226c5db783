"""Identical GPUs that run at different speeds, and a synchronous job that waits for the slowest.

GPUs of one SKU do not all run a compute-bound kernel equally fast (manufacturing
variability of the silicon, and the power management that sets each one's clock under
load). Training is synchronous: every step's tensor-, pipeline- and data-parallel
collectives wait for the last rank to arrive, so a job of N GPUs computes at the pace of
its slowest one. If a GPU's compute-bound kernel time is t x (1 + cv Z), Z standard
normal and independent across GPUs, the job's expected compute time is

    t x (1 + cv x e_N),    e_N = E[max of N independent standard normals],

e_1 = 0 (a lone GPU is an average one), e_2 = 1/sqrt(pi), growing like sqrt(2 ln N)
(e_N <= sqrt(2 ln N) for every N >= 2). `expected_max_std_normal` computes e_N
exactly (numerical integration of the maximum's density), not with the asymptote.

cv is the device's `gpu_speed_cv` (`config/clusters/<name>.yaml`, the device section):
the coefficient of variation, across the GPUs of one job measured at the same time, of
a compute-bound GEMM's time. It is measured, never fitted to training runs:
`within_job_cv` derives it from published per-GPU GEMM times
(`data/published/gpu_variability/`, docs/accuracy-at-scale.md). The factor applies to
the compute-bound part of GEMM and attention kernels only (the roofline's FLOP term,
`device_model.kernel_times_s`): memory-bound kernels and collectives are left as they
are. N is the run's GPU count (`RunSettings.num_gpus`), in `predict` and in `calibrate`
alike, so a calibration fitted on 8-GPU runs has seen the factor of N = 8.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache

import numpy as np

from paraplan.core.cluster import Device
from paraplan.predict.device_model import DeviceSpeed

_UPPER = np.linspace(0.0, 12.0, 12_001)  # the integrand is below 1e-20 past |x| = 12 for N <= 1e9
_LOWER = -_UPPER[::-1]
_STEP = float(_UPPER[1] - _UPPER[0])


def _log_ndtr(x: float) -> float:
    """log Phi(x), the standard normal's log CDF, from math.erfc: log1p of the upper tail
    where Phi is near 1, the log of the lower tail elsewhere (scipy.special.log_ndtr to
    4e-14 relative on [-12, 12], `tests/unit/test_variability.py`; scipy.special is not
    imported, which takes a tenth of a second of every predict and plan)."""
    if x >= 0:
        return math.log1p(-0.5 * math.erfc(x / math.sqrt(2.0)))
    return math.log(0.5 * math.erfc(-x / math.sqrt(2.0)))


@lru_cache(maxsize=1)
def _log_phi_grids() -> tuple[np.ndarray, np.ndarray]:
    """log Phi on the integration grids above and below 0, computed once."""
    return (np.array([_log_ndtr(x) for x in _UPPER.tolist()]),
            np.array([_log_ndtr(x) for x in _LOWER.tolist()]))


@lru_cache(maxsize=256)
def expected_max_std_normal(n: int) -> float:
    """E[max of n independent standard normal variables], by the identity
    E[M] = int_0^inf (1 - Phi(x)^n) dx - int_-inf^0 Phi(x)^n dx (trapezoid rule on
    a grid of 0.001 on each side of 0; within 1e-7)."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"the number of GPUs must be an integer >= 1, got {n!r}")
    if n == 1:
        return 0.0
    log_upper, log_lower = _log_phi_grids()
    above = -np.expm1(int(n) * log_upper)  # 1 - Phi^n, accurate where Phi^n is near 1
    below = np.exp(int(n) * log_lower)
    return float(np.trapezoid(above, dx=_STEP) - np.trapezoid(below, dx=_STEP))


def straggler_time_factor(cv: float, gpus: int) -> float:
    """Expected compute-bound time of a synchronous job of `gpus` GPUs over that of
    one average GPU: 1 + cv x e_N (see the module doc)."""
    if not math.isfinite(cv) or cv < 0:
        raise ValueError(f"gpu_speed_cv must be a finite number >= 0, got {cv!r}")
    if cv == 0:
        return 1.0
    return 1.0 + cv * expected_max_std_normal(gpus)


def straggled(speed: DeviceSpeed, device: Device, gpus: int) -> DeviceSpeed:
    """`speed` with the compute-bound time factor of a job of `gpus` such devices."""
    return replace(speed, compute_time_factor=straggler_time_factor(device.gpu_speed_cv, gpus))


MEASURED_A100_CV = 0.010
"""The A100's within-job spread (`within_job_cv` of `data/published/gpu_variability/`, 1.0015%):
the one device it is measured for, quoted for scale where a device has none."""


def unpriced_spread_note(device: Device, gpus: int, devices_per_node: int) -> str:
    """A note for a job of `gpus` devices across nodes on a device whose cluster file states no
    `gpu_speed_cv`: the slowest GPU's drag is then not priced, and the note says how much it
    would be at the A100's measured spread; "" where it is priced or the job is one node."""
    if device.gpu_speed_cv > 0 or gpus <= devices_per_node:
        return ""
    factor = straggler_time_factor(MEASURED_A100_CV, gpus)
    return (f"{device.name} has no measured GPU-to-GPU speed spread (its cluster file states no gpu_speed_cv), "
            f"so the wait for the slowest of {gpus:,} GPUs is not priced; at the A100's measured "
            f"{100 * MEASURED_A100_CV:.1f}% it would lengthen GEMM and attention time by {100 * (factor - 1):.1f}% "
            "(docs/accuracy-at-scale.md#gpu-to-gpu-speed)")


def within_job_cv(jobs: Sequence[Sequence[float]]) -> float:
    """The pooled coefficient of variation of per-GPU kernel times inside jobs: each
    time over its own job's mean, the root mean square of its deviation from 1 over all
    GPUs of all jobs. Jobs measured at different times (other clocks, other
    temperatures) do not add their differences to it."""
    deviations = [np.asarray(job, dtype=float) / float(np.mean(job)) - 1.0 for job in jobs if len(job) > 1]
    if not deviations:
        raise ValueError("within_job_cv needs at least one job of two or more GPUs")
    pooled = np.concatenate(deviations)
    return float(np.sqrt(np.mean(pooled ** 2)))


def split_jobs(gpus: Sequence[str], times: Sequence[float], job_gpus: int, from_end: bool = False) -> list[list[float]]:
    """Per-GPU times listed job after job (`job_gpus` rows each, every GPU once) as one
    list per job; `from_end`: the blocks are counted from the last row (a listing that
    starts inside a job). Rows left over at the other end are dropped; a block that
    holds some GPU twice is an error (the listing is not job after job)."""
    if len(gpus) != len(times) or job_gpus < 2:
        raise ValueError("split_jobs needs one GPU name per time and jobs of at least 2 GPUs")
    count = len(times) // job_gpus
    start = len(times) - count * job_gpus if from_end else 0
    jobs = []
    for j in range(count):
        lo, hi = start + j * job_gpus, start + (j + 1) * job_gpus
        if len(set(gpus[lo:hi])) != job_gpus:
            raise ValueError(f"rows {lo + 1}-{hi}: not {job_gpus} distinct GPUs; not one job's listing")
        jobs.append([float(t) for t in times[lo:hi]])
    return jobs


def no_straggling_speed(speed: DeviceSpeed) -> DeviceSpeed:
    """`speed` as one average GPU runs (no slowest-GPU factor): what `--explain` compares with."""
    return replace(speed, compute_time_factor=1.0)

