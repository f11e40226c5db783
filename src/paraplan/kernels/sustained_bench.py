"""Measure one GEMM shape's burst and sustained throughput on a CUDA device: a row of
the sustained-GEMM CSV (paraplan.kernels.sustained), as the MAMF finder's MSMF does.

Burst: after `idle_s` seconds idle, `warmup` untimed products, then `iters` products
each timed with CUDA events; the median, the protocol of `paraplan bench --kind gemm`
(so a burst grid and this burst are the same measurement). Sustained: products run
back to back for `seconds`, timed in chunks of `chunk` products; the median rate of the
chunks in the second half (the board at its power limit, the clock settled). The SM
clock and board power are read through NVML while each chunk runs (empty where NVML
is missing); the power limit is NVML's enforced limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from paraplan.core.errors import ConfigError
from paraplan.kernels.bench import GemmShape, gemm_call, times_s
from paraplan.kernels.results import gemm_flops
from paraplan.kernels.sustained import KIND


@dataclass(frozen=True)
class Chunk:
    """One timed chunk of the sustained loop: when it ended (s from the loop's start),
    its rate, and the NVML readings taken while it ran (None where unread)."""

    end_s: float
    tflops: float
    clock_mhz: float | None
    power_w: float | None


def sustained_summary(chunks: Sequence[Chunk]) -> dict[str, float | None]:
    """Sustained rate, clock range and mean power over the chunks of the second half
    of the loop (the last chunk at least)."""
    if not chunks:
        raise ValueError("no chunks measured")
    half = chunks[-1].end_s / 2
    late = [c for c in chunks if c.end_s > half] or [chunks[-1]]
    clocks = [c.clock_mhz for c in late if c.clock_mhz is not None]
    powers = [c.power_w for c in late if c.power_w is not None]
    return {"sustained_tflops": float(np.median([c.tflops for c in late])),
            "sustained_clock_min_mhz": min(clocks) if clocks else None,
            "sustained_clock_max_mhz": max(clocks) if clocks else None,
            "sustained_power_w": float(np.mean(powers)) if powers else None}


class _Nvml:
    """SM clock, board power and enforced power limit of CUDA device `index` (None
    each where pynvml is missing or the device refuses the query)."""

    def __init__(self, index: int):
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            self._nvml = None

    def _read(self, query: Callable[[], float]) -> float | None:
        if self._nvml is None:
            return None
        try:
            return float(query())
        except Exception:
            return None

    def clock_mhz(self) -> float | None:
        return self._read(lambda: self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM))

    def power_w(self) -> float | None:
        return self._read(lambda: self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0)

    def power_limit_w(self) -> float | None:
        return self._read(lambda: self._nvml.nvmlDeviceGetEnforcedPowerLimit(self._handle) / 1000.0)


def measure_sustained(shape: GemmShape, dtype: str, device, *, seconds: float, warmup: int, iters: int,
                      idle_s: float = 2.0, chunk: int = 20, fast_accum: bool = False,
                      on_chunk: Callable[[Chunk], None] | None = None) -> dict[str, object]:
    """One sustained-GEMM row (SUSTAINED_COLUMNS less device/setup/source) of `shape`."""
    import torch

    if device.type != "cuda":
        raise ConfigError("--kind", f"gemm-sustained measures a GPU at its power limit; it needs --device cuda, "
                          f"got {device}")
    if not seconds > 0:
        raise ConfigError("--sustain-s", f"must be positive, got {seconds:g}")
    nvml = _Nvml(device.index or 0)
    flops = gemm_flops(shape.m, shape.n, shape.k, shape.batch)
    call = gemm_call(shape, dtype, device, fast_accum)
    with torch.no_grad():
        torch.cuda.synchronize(device)
        time.sleep(idle_s)
        burst_clock = nvml.clock_mhz()
        burst_s = float(np.median(times_s(call, device, warmup, iters)))
        burst_power = nvml.power_w()
        chunks: list[Chunk] = []
        start_s = time.perf_counter()
        while time.perf_counter() - start_s < seconds:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(chunk):
                call()
            end.record()
            clock, power = nvml.clock_mhz(), nvml.power_w()  # read while the chunk runs
            end.synchronize()
            done = Chunk(time.perf_counter() - start_s, chunk * flops / (begin.elapsed_time(end) * 1e-3) / 1e12,
                         clock, power)
            chunks.append(done)
            if on_chunk:
                on_chunk(done)
    summary = sustained_summary(chunks)
    return {"kind": KIND, "dtype": dtype, "runs": 1, "burst_tflops": flops / burst_s / 1e12,
            "burst_m": shape.m, "burst_n": shape.n, "burst_k": shape.k, "burst_clock_mhz": burst_clock,
            "burst_power_w": burst_power, **summary, "sustained_m": shape.m, "sustained_n": shape.n,
            "sustained_k": shape.k, "power_limit_w": nvml.power_limit_w(), "torch_version": torch.__version__}
