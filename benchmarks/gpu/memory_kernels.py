"""Time the memory-bound kernels of a training step on one GPU and write the bytes each
moves (read + written, as paraplan's device model counts a memory-bound kernel).

Kernels (BF16 activations unless named; T tokens x h hidden):
- `copy` (y = x), `add` (y = a + b), `mul_scalar` (y = 0.5 x);
- `layer_norm_fwd`, `rms_norm_fwd` (weights h; bytes 2 T h e), and their backward
  (`*_bwd`: reads x and dy, writes dx; bytes 3 T h e), through torch.nn.functional;
- `swiglu_fwd` (silu(a) * b, two eager kernels; reads 2 T f e, writes T f e);
- `dropout_add_fwd` (y = dropout(x) + r, p 0.1: eager, a mask and two kernels);
- `permute` (index_select of T k rows of h, k 8: reads and writes T k h e),
  `unpermute` (index_add of T k rows into T: reads T k h e, writes T h e);
- `cast_fp8` (BF16 -> e4m3 with a per-tensor scale: amax, then scale and cast);
- `adam_fused` (torch.optim.AdamW fused, fp32 params, grads, two moments: 16 bytes
  read and 12 written a parameter).

Each kernel is timed with CUDA events, `--warmup` untimed calls then `--reps` timed;
the median is written with the bytes and the achieved bandwidth.

    python benchmarks/gpu/memory_kernels.py --out memory_kernels.csv
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

FIELDS = ("kernel", "tokens", "width", "bytes", "time_us", "time_p10_us", "time_p90_us", "GBps", "device")


def cases(torch, tokens: int, h: int, device: str):
    """(name, width, bytes, callable) for one size."""
    bf16 = torch.bfloat16
    e = 2
    x = torch.randn(tokens, h, device=device, dtype=bf16)
    r = torch.randn(tokens, h, device=device, dtype=bf16)
    w = torch.ones(h, device=device, dtype=bf16)
    b = torch.zeros(h, device=device, dtype=bf16)
    out = []
    out.append(("copy", h, 2 * tokens * h * e, lambda: x.clone()))
    out.append(("add", h, 3 * tokens * h * e, lambda: x + r))
    out.append(("mul_scalar", h, 2 * tokens * h * e, lambda: x * 0.5))
    F = torch.nn.functional
    out.append(("layer_norm_fwd", h, 2 * tokens * h * e, lambda: F.layer_norm(x, (h,), w, b)))
    out.append(("rms_norm_fwd", h, 2 * tokens * h * e, lambda: F.rms_norm(x, (h,), w)))
    for name, fn in (("layer_norm_bwd", lambda t: F.layer_norm(t, (h,), w.requires_grad_(), b.requires_grad_())),
                     ("rms_norm_bwd", lambda t: F.rms_norm(t, (h,), w.requires_grad_()))):
        xg = x.detach().clone().requires_grad_()
        y = fn(xg)
        dy = torch.randn_like(y)

        def backward(y=y, dy=dy, xg=xg):
            return torch.autograd.grad(y, (xg,), dy, retain_graph=True)

        out.append((name, h, 3 * tokens * h * e, backward))
    f = 2 * h + h // 2  # an FFN width about 2.5 h (fc1 output halves)
    a = torch.randn(tokens, f, device=device, dtype=bf16)
    g = torch.randn(tokens, f, device=device, dtype=bf16)
    out.append(("swiglu_fwd", f, 3 * tokens * f * e, lambda: F.silu(a) * g))
    out.append(("dropout_add_fwd", h, 3 * tokens * h * e + tokens * h,
                lambda: F.dropout(x, 0.1, training=True) + r))
    k = 8
    if tokens * k * h * e <= 4 << 30:
        rows = torch.randint(0, tokens, (tokens * k,), device=device)
        y = torch.randn(tokens * k, h, device=device, dtype=bf16)
        target = torch.zeros(tokens, h, device=device, dtype=bf16)
        out.append(("permute", h, 2 * tokens * k * h * e, lambda: x.index_select(0, rows)))
        out.append(("unpermute", h, tokens * k * h * e + 2 * tokens * h * e,
                    lambda: target.index_add(0, rows, y)))
    if hasattr(torch, "float8_e4m3fn"):
        def cast():
            scale = 448.0 / x.abs().amax().float().clamp(min=1e-12)
            return (x.float() * scale).to(torch.float8_e4m3fn)

        out.append(("cast_fp8", h, tokens * h * (e + e + 1), cast))
    return out


def adam_case(torch, params: int, device: str):
    p = torch.nn.Parameter(torch.randn(params, device=device))
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p], lr=1e-4, fused=device == "cuda")
    opt.step()  # the moments allocated
    return ("adam_fused", params, 28 * params, opt.step)  # reads p, g, m, v (16 B); writes p, m, v (12 B)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--hidden", default="4096,8192")
    parser.add_argument("--adam-params", default="268435456,1073741824")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("memory_kernels.py: needs a CUDA GPU (or --device cpu for a dry run)", file=sys.stderr)
        return 2
    cuda = args.device == "cuda"
    name = torch.cuda.get_device_name() if cuda else "cpu"

    def timed(fn) -> list[float]:
        for _ in range(args.warmup):
            fn()
        if not cuda:
            import time
            times = []
            for _ in range(args.reps):
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e6)
            return times
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(args.reps)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(t) * 1e3 for s, t in events]

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()

        def write(kernel: str, tokens: int, width: int, nbytes: float, times: list[float]) -> None:
            median = statistics.median(times)
            deciles = statistics.quantiles(times, n=10)
            writer.writerow({"kernel": kernel, "tokens": tokens, "width": width, "bytes": f"{nbytes:.0f}",
                             "time_us": f"{median:.2f}", "time_p10_us": f"{deciles[0]:.2f}",
                             "time_p90_us": f"{deciles[-1]:.2f}", "GBps": f"{nbytes / median / 1e3:.1f}",
                             "device": name})
            handle.flush()

        for tokens in map(int, args.tokens.split(",")):
            for h in map(int, args.hidden.split(",")):
                for kernel, width, nbytes, fn in cases(torch, tokens, h, args.device):
                    try:
                        write(kernel, tokens, width, nbytes, timed(fn))
                    except (RuntimeError, TypeError, AttributeError) as error:
                        print(f"{kernel} T{tokens} h{h}: {error}", file=sys.stderr)
                if cuda:
                    torch.cuda.empty_cache()
                print(f"T {tokens} h {h} done", file=sys.stderr)
        for params in map(int, args.adam_params.split(",")):
            try:
                kernel, width, nbytes, fn = adam_case(torch, params, args.device)
                write(kernel, 0, width, nbytes, timed(fn))
            except (RuntimeError, TypeError) as error:
                print(f"adam {params}: {error}", file=sys.stderr)
            if cuda:
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
