"""Time a mixture-of-experts layer's expert GEMMs on one GPU, the ways a framework can run
them, beside the one dense GEMM of the same FLOPs.

A rank holding G local experts, each sent m tokens, runs per projection G GEMMs of
(m x k) @ (k x n): fc1 (k = hidden, n = 2 x expert FFN, gated), fc2 (k = expert FFN,
n = hidden), each forward, input gradient (dgrad) and weight gradient (wgrad, whose inner
dimension is the expert's m tokens). Modes, each timed with CUDA events on the main stream:

- `dense`: one GEMM of (G m x k) @ (k x n) (wgrad: inner dimension G m), the same FLOPs;
- `streams1`: the G GEMMs one after another on the main stream;
- `streams4`: the G GEMMs round-robin over 4 side streams joined to the main stream by
  events, as Transformer Engine's grouped linear layer runs them
  (`general_grouped_gemm`, `nvte_multi_stream_cublas_gemm`, 4 compute streams);
- `grouped_mm`: `torch._grouped_mm`, one CUTLASS grouped kernel (BF16 forward and dgrad);
- `graph1`, `graph4`, `graph_dense`: `streams1`, `streams4` and `dense` captured once in a
  CUDA graph and replayed, the device's time without Python's launch cost (Transformer
  Engine launches the G GEMMs from one C++ loop; an eager call timed between two events
  holds the host's launch of it, tens of microseconds, which small cases cannot hide).

`--dtype bfloat16` runs `torch.matmul`; `--dtype float8_e4m3fn` runs `torch._scaled_mm` with
per-tensor scales and BF16 output, fast accumulation for the forward only (Transformer
Engine's per-tensor recipes: split accumulation for dgrad and wgrad), both operands
pre-quantised and pre-transposed (Transformer Engine keeps row- and column-wise copies).
Operands are random, drawn once per shape; each case runs `--warmup` untimed calls, then
`--reps` timed calls (the median and the 10th/90th percentiles are written).

    python benchmarks/gpu/grouped_gemm.py --dtype bfloat16 --out grouped_bf16.csv

One CSV row per (model shape, pass, G, m, mode). `benchmarks/bench_grouped_gemm.py` sets
paraplan's grouped-GEMM price beside these rows.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

MODELS = {  # hidden, expert FFN (each expert gated: fc1 is hidden x 2 FFN)
    "qwen3-30b-a3b": (2048, 768),
    "gpt-oss-120b": (2880, 2880),
    "qwen3-235b-a22b": (4096, 1536),
    "deepseek-v3": (7168, 2048),
}
GROUPS = (4, 8, 16, 32)
TOKENS = (256, 512, 1024, 2048, 4096)
SIDE_STREAMS = 4
GRAPHED = {"graph1": "streams1", "graph4": "streams4", "graph_dense": "dense"}  # mode -> the mode it captures
FIELDS = ("model", "dtype", "pass", "projection", "groups", "m", "k", "n", "mode", "flops", "time_us",
          "time_p10_us", "time_p90_us", "tflops", "device")


def gemm_shapes(hidden: int, ffn: int, m: int) -> list[tuple[str, str, int, int, int]]:
    """(pass, projection, m, k, n) of one expert's six GEMMs."""
    return [("forward", "fc1", m, hidden, 2 * ffn), ("forward", "fc2", m, ffn, hidden),
            ("dgrad", "fc1", m, 2 * ffn, hidden), ("dgrad", "fc2", m, hidden, ffn),
            ("wgrad", "fc1", hidden, m, 2 * ffn), ("wgrad", "fc2", ffn, m, hidden)]


class Case:
    """Operands of one shape: G expert GEMMs of (m x k) @ (k x n), and the dense GEMM of
    the same FLOPs; the inner dimension is split by expert for wgrad."""

    def __init__(self, torch, dtype: str, groups: int, m: int, k: int, n: int, wgrad: bool, fast_accum: bool):
        self.torch, self.groups, self.fast_accum = torch, groups, fast_accum
        self.fp8 = dtype != "bfloat16"
        dev = "cuda"
        if wgrad:  # out_e = a_e (m x k_e) @ b_e (k_e x n): a is (m x G k), b is (G k x n)
            a = torch.randn(m, groups * k, device=dev, dtype=torch.bfloat16)
            b = torch.randn(groups * k, n, device=dev, dtype=torch.bfloat16)
            self.a_parts = [a[:, e * k:(e + 1) * k].contiguous() for e in range(groups)]
            self.b_parts = [b[e * k:(e + 1) * k] for e in range(groups)]
        else:  # out_e = a_e (m x k) @ w_e (k x n): a is (G m x k)
            a = torch.randn(groups * m, k, device=dev, dtype=torch.bfloat16)
            b = torch.randn(groups, k, n, device=dev, dtype=torch.bfloat16)
            self.a_parts = [a[e * m:(e + 1) * m] for e in range(groups)]
            self.b_parts = [b[e] for e in range(groups)]
            self.grouped = (a, b.transpose(1, 2).contiguous().transpose(1, 2),
                            torch.arange(1, groups + 1, device=dev, dtype=torch.int32) * m)
        # the dense GEMM of the same FLOPs: all G m tokens through one expert's weight (wgrad: inner G k)
        self.dense = (a, b) if wgrad else (a, b[0])
        if self.fp8:
            f8 = getattr(torch, dtype)
            one = torch.ones((), device=dev, dtype=torch.float32)
            self.scale = one
            # _scaled_mm: a row-major, b column-major (Transformer Engine's column-wise copy)
            self.a_parts = [x.to(f8).contiguous() for x in self.a_parts]
            self.b_parts = [x.t().contiguous().to(f8).t() for x in self.b_parts]
            da, db = self.dense
            self.dense = (da.to(f8).contiguous(), db.t().contiguous().to(f8).t())
        self.streams = [torch.cuda.Stream() for _ in range(SIDE_STREAMS)]
        self.out_parts: list = [None] * groups
        self.graphs: dict = {}

    def mm(self, a, b):
        if self.fp8:
            return self.torch._scaled_mm(a, b, scale_a=self.scale, scale_b=self.scale, out_dtype=self.torch.bfloat16,
                                         use_fast_accum=self.fast_accum)
        return self.torch.matmul(a, b)

    def capture(self, mode: str):
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture, as CUDA graphs require
            for _ in range(2):
                self.run(mode)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.run(mode)
        return graph

    def run(self, mode: str) -> None:
        torch = self.torch
        if mode == "dense":
            self.mm(*self.dense)
        elif mode == "streams1":
            for e in range(self.groups):
                self.out_parts[e] = self.mm(self.a_parts[e], self.b_parts[e])
        elif mode == "streams4":
            main = torch.cuda.current_stream()
            for s in self.streams:
                s.wait_stream(main)
            for e in range(self.groups):
                with torch.cuda.stream(self.streams[e % SIDE_STREAMS]):
                    self.out_parts[e] = self.mm(self.a_parts[e], self.b_parts[e])
            for s in self.streams:
                main.wait_stream(s)
        elif mode in GRAPHED:
            if mode not in self.graphs:
                self.graphs[mode] = self.capture(GRAPHED[mode])
            self.graphs[mode].replay()
        elif mode == "grouped_mm":
            a, b, offs = self.grouped
            torch._grouped_mm(a, b, offs=offs)
        else:
            raise ValueError(mode)


def time_case(torch, case: Case, mode: str, warmup: int, reps: int) -> list[float]:
    for _ in range(warmup):
        case.run(mode)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        case.run(mode)
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e3 for start, end in events]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=("bfloat16", "float8_e4m3fn"), default="bfloat16")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--groups", default=",".join(map(str, GROUPS)))
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="m, tokens per expert")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--modes", default=None, help="comma-separated modes (default: dense, streams1, streams4, "
                        "graph_dense, graph1, graph4 and, BF16 only, grouped_mm)")
    parser.add_argument("--max-s", type=float, default=1e9, help="stop (CSV kept) after this many seconds")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("grouped_gemm.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    fp8 = args.dtype != "bfloat16"
    modes = ("dense", "streams1", "streams4", "graph_dense", "graph1", "graph4") + (() if fp8 else ("grouped_mm",))
    if args.modes:
        modes = tuple(args.modes.split(","))
    began = time.perf_counter()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        for model in args.models.split(","):
            hidden, ffn = MODELS[model]
            for groups in map(int, args.groups.split(",")):
                for tokens in map(int, args.tokens.split(",")):
                    for pass_, projection, m, k, n in gemm_shapes(hidden, ffn, tokens):
                        if time.perf_counter() - began > args.max_s:
                            print(f"grouped_gemm.py: stopped at --max-s {args.max_s}", file=sys.stderr)
                            return 0
                        wgrad = pass_ == "wgrad"
                        try:
                            case = Case(torch, args.dtype, groups, m, k, n, wgrad, fast_accum=pass_ == "forward")
                        except (RuntimeError, TypeError) as error:
                            print(f"{model} {pass_} {projection} G{groups} m{tokens}: {error}", file=sys.stderr)
                            continue
                        for mode in modes:
                            if mode == "grouped_mm" and wgrad:
                                continue
                            try:
                                times = time_case(torch, case, mode, args.warmup, args.reps)
                            except (RuntimeError, TypeError) as error:
                                print(f"{model} {pass_} {projection} G{groups} m{tokens} {mode}: {error}",
                                      file=sys.stderr)
                                continue
                            deciles = statistics.quantiles(times, n=10)
                            flops = 2.0 * groups * m * k * n
                            median = statistics.median(times)
                            writer.writerow({
                                "model": model, "dtype": args.dtype, "pass": pass_, "projection": projection,
                                "groups": groups, "m": m, "k": k, "n": n, "mode": mode, "flops": f"{flops:.6g}",
                                "time_us": f"{median:.2f}", "time_p10_us": f"{deciles[0]:.2f}",
                                "time_p90_us": f"{deciles[-1]:.2f}", "tflops": f"{flops / median / 1e6:.1f}",
                                "device": device})
                        handle.flush()
                        del case
                        torch.cuda.empty_cache()
                print(f"{model} G{groups}: {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
