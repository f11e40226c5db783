"""Time `torch.matmul` and `torch.nn.functional.scaled_dot_product_attention` on one
device (CPU, or CUDA when asked for and present).

Each shape runs `warmup` untimed calls, then `iters` timed ones. On CUDA a call is
timed with CUDA events around it (device time, no host launch gaps); on CPU with the
wall clock around the call. The rows give the median (`time_us`) and the 10th/90th
percentiles (paraplan.kernels.results). Attention's backward is timed alone: each
iteration runs an untimed forward, then times `backward` of its output.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from paraplan.core.errors import ConfigError
from paraplan.kernels.results import attention_flops, gemm_flops

DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float8_e4m3fn")
FP8_DTYPES: tuple[str, ...] = ("float8_e4m3fn",)
"""GEMM only, CUDA only: `torch._scaled_mm` with per-tensor scales (FP8 operands, BF16
output), what Transformer Engine's tensorwise ("current scaling") recipe runs."""


@dataclass(frozen=True)
class GemmShape:
    m: int
    n: int
    k: int
    batch: int = 1


@dataclass(frozen=True)
class AttentionShape:
    batch: int
    heads: int
    seq_length: int
    head_dim: int
    causal: bool


def torch_device(name: str):
    """`auto` (CUDA when present, else CPU), `cpu` or `cuda`; asking for CUDA where
    there is none is a ConfigError."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda"):
        raise ConfigError("--device", f"expected auto, cpu or cuda, got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", "cuda asked for, but torch sees no CUDA device")
    return torch.device(name)


def device_name(device) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _hold(call: Callable[[], object], device, seconds: float, before: Callable[[], object] | None) -> None:
    """Run `call` back to back for `seconds` (checked every 8 calls): the device then
    runs at the clock it holds for this kernel at its power limit, as in a training step."""
    import torch

    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(8):
            if before is not None:
                before()
            call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)


MAX_TIMED_CALLS = 100_000
"""The most timed calls `min_time_s` may add for one shape."""


def times_s(call: Callable[[], object], device, warmup: int, iters: int,
            before: Callable[[], object] | None = None, hold_s: float = 0.0,
            min_time_s: float = 0.0) -> np.ndarray:
    """`iters` timed calls after `warmup` untimed ones (and `hold_s` seconds of calls
    back to back before those, when positive), and more until the timed calls add up to
    `min_time_s` (at most MAX_TIMED_CALLS): a window long enough to span the power
    controller's clock swings, which a few short calls sample at one phase."""
    import torch

    if hold_s > 0:
        _hold(call, device, hold_s, before)
    for _ in range(warmup):
        if before is not None:
            before()
        call()
    times: list[float] = []
    cuda = device.type == "cuda"
    while len(times) < iters or (sum(times) < min_time_s and len(times) < MAX_TIMED_CALLS):
        if before is not None:
            before()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        else:
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
    return np.array(times)


def _row(times_s: np.ndarray, flops: float) -> dict[str, float]:
    median = float(np.median(times_s))
    return {"time_us": median * 1e6, "time_p10_us": float(np.percentile(times_s, 10)) * 1e6,
            "time_p90_us": float(np.percentile(times_s, 90)) * 1e6, "tflops": flops / median / 1e12}


def gemm_call(shape: GemmShape, dtype: str, device, fast_accum: bool = False) -> Callable[[], object]:
    """One product of `shape` on fresh random operands: torch.matmul, or for an FP8 dtype
    torch._scaled_mm (B column-major, as cuBLASLt's FP8 kernels require; batch 1 only),
    with cuBLASLt's fast accumulation when `fast_accum` (what Transformer Engine's FP8
    recipes use for the forward GEMM; their dgrad and wgrad GEMMs accumulate split)."""
    import torch

    if dtype in FP8_DTYPES:
        if device.type != "cuda":
            raise ConfigError("--dtype", f"{dtype}: FP8 GEMMs run on CUDA only (torch._scaled_mm), not on {device}")
        if shape.batch != 1 or shape.k % 16 or shape.n % 16:
            raise ConfigError("--dtype", f"{dtype}: torch._scaled_mm takes batch 1 and k, n multiples of 16, got "
                              f"{shape.m}x{shape.n}x{shape.k} batch {shape.batch}")
        fp8 = getattr(torch, dtype)
        a = torch.randn(shape.m, shape.k, device=device).to(fp8)
        b = torch.randn(shape.n, shape.k, device=device).to(fp8).t()
        one = torch.ones((), device=device)
        return partial(torch._scaled_mm, a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                       use_fast_accum=fast_accum)
    torch_dtype = getattr(torch, dtype)
    size_a = (shape.batch, shape.m, shape.k) if shape.batch > 1 else (shape.m, shape.k)
    size_b = (shape.batch, shape.k, shape.n) if shape.batch > 1 else (shape.k, shape.n)
    return partial(torch.matmul, torch.randn(size_a, dtype=torch_dtype, device=device),
                   torch.randn(size_b, dtype=torch_dtype, device=device))


def time_gemms(shapes: Sequence[GemmShape], dtype: str, device, warmup: int, iters: int,
               on_row: Callable[[dict], None] | None = None, hold_s: float = 0.0,
               fast_accum: bool = False, min_time_s: float = 0.0) -> list[dict]:
    """One row per shape (GEMM_COLUMNS less kind/device/source); each shape held
    `hold_s` seconds before it is timed (times_s)."""
    import torch

    rows = []
    for shape in shapes:
        call = gemm_call(shape, dtype, device, fast_accum)
        with torch.no_grad():
            times = times_s(call, device, warmup, iters, hold_s=hold_s, min_time_s=min_time_s)
        del call
        row = {"dtype": dtype, "m": shape.m, "n": shape.n, "k": shape.k, "batch": shape.batch,
               **_row(times, gemm_flops(shape.m, shape.n, shape.k, shape.batch))}
        rows.append(row)
        if on_row:
            on_row(row)
    return rows


SDPA_BACKENDS: dict[str, str | None] = {"auto": None, "flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                                         "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
"""`--sdpa-backend` names and torch's `SDPBackend` members; auto: torch's own choice (on
H100 since PyTorch 2.5.1, FlashAttention-2 unless cuDNN is asked for; Transformer Engine,
hence Megatron-Core, runs cuDNN's there)."""


SDPA_KERNEL_NAMES: dict[str, str] = {"flash": "flash-attention-2"}
"""The kernel a backend runs, where its name differs (the end of the CSV's source, what
`paraplan fit --attention-kernel` selects): torch's built-in flash kernel is
FlashAttention-2."""


def _attention_times_s(shape: AttentionShape, torch_dtype, device, warmup: int,
                       iters: int, hold_s: float = 0.0, min_time_s: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward times of one shape (the backward after an untimed forward)."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    size = (shape.batch, shape.heads, shape.seq_length, shape.head_dim)
    q, k, v = (torch.randn(size, dtype=torch_dtype, device=device, requires_grad=True) for _ in range(3))
    grad = torch.randn(size, dtype=torch_dtype, device=device)
    out: list[torch.Tensor] = []

    def forward() -> None:
        sdpa(q, k, v, is_causal=shape.causal)

    def fresh_forward() -> None:
        q.grad = k.grad = v.grad = None
        out[:] = [sdpa(q, k, v, is_causal=shape.causal)]

    def backward() -> None:
        out[0].backward(grad)

    with torch.no_grad():
        forward_s = times_s(forward, device, warmup, iters, hold_s=hold_s, min_time_s=min_time_s)
    return forward_s, times_s(backward, device, warmup, iters, before=fresh_forward, hold_s=hold_s,
                              min_time_s=min_time_s)


def time_attention(shapes: Sequence[AttentionShape], dtype: str, device, warmup: int, iters: int,
                   on_row: Callable[[dict], None] | None = None, backend: str = "auto",
                   hold_s: float = 0.0, min_time_s: float = 0.0) -> list[dict]:
    """Two rows per shape, forward and backward (ATTENTION_COLUMNS less kind/device/source),
    with scaled_dot_product_attention's `backend` (SDPA_BACKENDS); a backend the device
    cannot run for a shape is an error naming it."""
    import contextlib

    import torch

    member = SDPA_BACKENDS[backend]

    def chosen() -> contextlib.AbstractContextManager:
        if member is None:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(getattr(SDPBackend, member))

    rows = []
    for shape in shapes:
        try:
            with chosen():
                forward, backward = _attention_times_s(shape, getattr(torch, dtype), device, warmup, iters,
                                                       hold_s, min_time_s)
        except RuntimeError as error:
            if member is None:
                raise
            reason = (str(error).strip().splitlines() or ["no reason given"])[0]
            raise ConfigError("sdpa_backend", f"{backend}: torch cannot run it on {device} for seq_length "
                              f"{shape.seq_length}, head_dim {shape.head_dim}, {dtype} ({reason})") from None
        for name, times in (("fwd", forward), ("bwd", backward)):
            flops = attention_flops(shape.batch, shape.heads, shape.seq_length, shape.head_dim, shape.causal, name)
            row = {"dtype": dtype, "pass": name, "batch": shape.batch, "heads": shape.heads,
                   "seq_length": shape.seq_length, "head_dim": shape.head_dim, "causal": int(shape.causal),
                   **_row(times, flops)}
            rows.append(row)
            if on_row:
                on_row(row)
    return rows
