"""`paraplan bench --kind gemm|attention|gemm-sustained`: time torch.matmul over an
m x n x k grid (or listed shapes), scaled_dot_product_attention forward and backward
over sequence lengths and head dims, on one device (paraplan.kernels.bench), or one
GEMM shape's burst and sustained rate on a GPU (paraplan.kernels.sustained_bench);
writes OUTPUT/gemm.csv, attention.csv (paraplan.kernels.results) or
gemm_sustained.csv (paraplan.kernels.sustained) and one MLflow run. Not a command of
its own."""

from __future__ import annotations

import argparse
import itertools
import sys

from paraplan.cli.common import int_list, track
from paraplan.core import ConfigError

DEFAULT_GEMM_SIZES = "256,512,1024"
DEFAULT_SEQ_LENGTHS = "256,512,1024"


def add_kernel_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("kernels (--kind gemm|attention|gemm-sustained)")
    group.add_argument("--device", default="auto", help="cpu, cuda, or auto (CUDA when present)")
    group.add_argument("--threads", type=int, default=1,
                       help="cpu: torch threads (default 1: one core, the local-cpu cluster's device)")
    group.add_argument("--device-name", default=None,
                       help="the device column of the CSV (default: torch's name for it; use the cluster "
                            "file's device name to fit it with `paraplan fit --kind kernels --cluster`)")
    group.add_argument("--m", default=DEFAULT_GEMM_SIZES, help="gemm: comma list of m")
    group.add_argument("--n", default=DEFAULT_GEMM_SIZES, help="gemm: comma list of n")
    group.add_argument("--k", default=DEFAULT_GEMM_SIZES, help="gemm: comma list of k")
    group.add_argument("--gemm-batch", default="1",
                       help="gemm: comma list of batch counts (independent products per batched matmul)")
    group.add_argument("--gemm-shapes", default=None, metavar="MxNxK[xB],...",
                       help="gemm, gemm-sustained: listed shapes instead of the --m x --n x --k x --gemm-batch grid")
    group.add_argument("--sustain-s", type=float, default=30.0,
                       help="gemm-sustained: seconds of back-to-back products (the sustained rate is the median "
                            "of the second half)")
    group.add_argument("--hold-s", type=float, default=0.0,
                       help="gemm, attention: run each shape back to back this many seconds before timing it, so "
                            "a GPU is timed at the clock it holds at its power limit, as in a training step (the "
                            "CSV's source then reads paraplan-bench:cuda:held...; `fit` applies no sustained factor to "
                            "such rows)")
    group.add_argument("--min-time-s", type=float, default=0.0,
                       help="gemm, attention: after --iters timed calls, keep timing until they add up to this many "
                            "seconds (a window spanning a GPU's power-limited clock swings; 0.5 s on an H100)")
    group.add_argument("--fp8-fast-accum", action="store_true",
                       help="gemm, gemm-sustained with an FP8 --dtype: cuBLASLt's fast accumulation, what Transformer "
                            "Engine's FP8 recipes run for the forward GEMM (the source ends with :fast-accum)")
    group.add_argument("--setup", default="one GPU (paraplan bench)",
                       help="gemm-sustained: the CSV's setup column (what else ran, how the GPU was cooled)")
    group.add_argument("--seq-lengths", default=DEFAULT_SEQ_LENGTHS, help="attention: comma list of sequence lengths")
    group.add_argument("--head-dims", default="64,128", help="attention: comma list of head dimensions")
    group.add_argument("--heads", type=int, default=16, help="attention: heads")
    group.add_argument("--tokens", type=int, default=4096,
                       help="attention: tokens per call; batch = tokens // seq_length (at least 1)")
    group.add_argument("--non-causal", action="store_true", help="attention: no causal mask")
    group.add_argument("--sdpa-backend", default="auto", choices=("auto", "flash", "cudnn", "efficient", "math"),
                       help="attention: scaled_dot_product_attention's kernel (default: torch's choice); the CSV's "
                            "source ends with its kernel name, e.g. paraplan-bench:cuda:cudnn, "
                            "paraplan-bench:cuda:flash-attention-2 (torch's built-in flash kernel), for "
                            "`fit --attention-kernel`")


def _positive_list(text: str, key: str) -> list[int]:
    values = int_list(text, key)
    if any(v < 1 for v in values):
        raise ConfigError(key, f"every value must be >= 1, got {text}")
    return values


def _gemm_shapes(args: argparse.Namespace):
    from paraplan.kernels import bench

    if args.gemm_shapes is None:
        return [bench.GemmShape(m, n, k, b) for m, n, k, b in itertools.product(
            _positive_list(args.m, "--m"), _positive_list(args.n, "--n"), _positive_list(args.k, "--k"),
            _positive_list(args.gemm_batch, "--gemm-batch"))]
    shapes = []
    for item in (part.strip() for part in args.gemm_shapes.split(",")):
        dims = item.lower().split("x")
        if len(dims) not in (3, 4) or not all(d.isdigit() and int(d) >= 1 for d in dims):
            raise ConfigError("--gemm-shapes", f"expected MxNxK or MxNxKxBATCH of positive integers, got {item!r}")
        shapes.append(bench.GemmShape(*(int(d) for d in dims)))
    return shapes


def run_kernel_bench(args: argparse.Namespace) -> int:
    import pandas as pd

    from paraplan.files import check_outputs, write_csv
    from paraplan.kernels import bench
    from paraplan.kernels.results import ATTENTION_COLUMNS, GEMM_COLUMNS
    from paraplan.track import RunLog

    if args.dtype not in bench.DTYPES:
        raise ConfigError("--dtype", f"kernels: expected one of {', '.join(bench.DTYPES)}, got {args.dtype!r}")
    for key, value in (("--warmup", args.warmup), ("--iters", args.iters)):
        if value < (0 if key == "--warmup" else 1):
            raise ConfigError(key, f"must be >= {0 if key == '--warmup' else 1}, got {value}")
    check_outputs(folders=[args.output])
    device = bench.torch_device(args.device)
    name = args.device_name or bench.device_name(device)
    if device.type == "cpu":
        import torch

        if args.threads < 1:
            raise ConfigError("--threads", f"must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)

    def show(row: dict) -> None:
        shape = (f"{row['m']}x{row['n']}x{row['k']} batch {row['batch']}" if "m" in row else
                 f"{row['pass']} s={row['seq_length']} d={row['head_dim']} batch {row['batch']}")
        print(f"{args.kind} {shape}: {row['time_us']:.1f} us, {row['tflops']:.3f} TFLOP/s", file=sys.stderr, flush=True)

    for key, value in (("--hold-s", args.hold_s), ("--min-time-s", args.min_time_s)):
        if not value >= 0:
            raise ConfigError(key, f"must be >= 0, got {value}")
    if args.fp8_fast_accum and (args.kind == "attention" or args.dtype not in bench.FP8_DTYPES):
        raise ConfigError("--fp8-fast-accum", f"applies to FP8 GEMMs (--dtype {', '.join(bench.FP8_DTYPES)}), got "
                          f"--kind {args.kind} --dtype {args.dtype}")
    if args.kind == "gemm-sustained":
        if not args.sustain_s > 0:
            raise ConfigError("--sustain-s", f"must be positive, got {args.sustain_s:g}")
        return _run_sustained(args, device, name)
    if args.kind == "gemm":
        rows = bench.time_gemms(_gemm_shapes(args), args.dtype, device, args.warmup, args.iters, on_row=show,
                                hold_s=args.hold_s, fast_accum=args.fp8_fast_accum, min_time_s=args.min_time_s)
        columns = GEMM_COLUMNS
    else:
        if args.dtype in bench.FP8_DTYPES:
            raise ConfigError("--dtype", f"attention: {args.dtype} is a GEMM dtype here; expected one of "
                              f"{', '.join(d for d in bench.DTYPES if d not in bench.FP8_DTYPES)}")
        if args.heads < 1 or args.tokens < 1:
            raise ConfigError("--heads" if args.heads < 1 else "--tokens", "must be >= 1")
        attention_shapes = [bench.AttentionShape(max(args.tokens // s, 1), args.heads, s, d, not args.non_causal)
                            for s in _positive_list(args.seq_lengths, "--seq-lengths")
                            for d in _positive_list(args.head_dims, "--head-dims")]
        rows = bench.time_attention(attention_shapes, args.dtype, device, args.warmup, args.iters, on_row=show,
                                    backend=args.sdpa_backend, hold_s=args.hold_s, min_time_s=args.min_time_s)
        columns = ATTENTION_COLUMNS
    source = f"paraplan-bench:{device.type}" + (":held" if args.hold_s > 0 else "")
    if args.kind == "attention" and args.sdpa_backend != "auto":
        source += f":{bench.SDPA_KERNEL_NAMES.get(args.sdpa_backend, args.sdpa_backend)}"
    if args.fp8_fast_accum:
        source += ":fast-accum"
    frame = pd.DataFrame([{**r, "kind": args.kind, "device": name, "source": source}
                          for r in rows])[list(columns)]
    path = args.output / f"{args.kind}.csv"
    write_csv(path, frame)
    best = frame.loc[frame["tflops"].idxmax()]
    print(f"paraplan bench: {len(frame)} {args.kind} row(s) on {name}, best {best['tflops']:.3f} TFLOP/s -> {path}",
          file=sys.stderr)
    track(args, RunLog(
        stage="kernels", run_name=f"bench-{args.kind}:{name}",
        params={"kind": args.kind, "device": name, "dtype": args.dtype, "warmup": args.warmup, "iters": args.iters,
                "shapes": len(frame), "threads": args.threads if device.type == "cpu" else None},
        metrics={"max_tflops": float(frame["tflops"].max()), "median_tflops": float(frame["tflops"].median())},
        artifacts=[path], tags={"kind": args.kind, "device": name},
    ))
    return 0


def _run_sustained(args: argparse.Namespace, device, name: str) -> int:
    """One row per listed shape (--gemm-shapes, else the grid's shapes) of the
    sustained-GEMM CSV."""
    import pandas as pd

    from paraplan.files import write_csv
    from paraplan.kernels.sustained import SUSTAINED_COLUMNS
    from paraplan.kernels.sustained_bench import measure_sustained
    from paraplan.track import RunLog

    rows = []
    def chunk(c) -> None:
        print(f"gemm-sustained: {c.end_s:6.1f} s {c.tflops:7.1f} TFLOP/s clock {c.clock_mhz} MHz power "
              f"{c.power_w} W", file=sys.stderr, flush=True)

    for shape in _gemm_shapes(args):
        print(f"gemm-sustained {shape.m}x{shape.n}x{shape.k} batch {shape.batch}, {args.dtype}, {args.sustain_s:g} s",
              file=sys.stderr, flush=True)
        row = measure_sustained(shape, args.dtype, device, seconds=args.sustain_s, warmup=args.warmup,
                                iters=args.iters, fast_accum=args.fp8_fast_accum, on_chunk=chunk)
        if row["power_limit_w"] is None:
            raise ConfigError("--kind", "gemm-sustained: NVML gave no power limit for the device (pynvml missing "
                              "or refused); the sustained CSV needs one")
        rows.append({**row, "device": name, "setup": args.setup,
                     "source": f"paraplan-bench:{device.type}" + (":fast-accum" if args.fp8_fast_accum else "")})
    frame = pd.DataFrame(rows)[list(SUSTAINED_COLUMNS)]
    path = args.output / "gemm_sustained.csv"
    write_csv(path, frame)
    ratios = frame["sustained_tflops"] / frame["burst_tflops"]
    print(f"paraplan bench: {len(frame)} sustained GEMM row(s) on {name}, sustained/burst "
          f"{ratios.min():.3f}-{ratios.max():.3f} -> {path}", file=sys.stderr)
    track(args, RunLog(
        stage="kernels", run_name=f"bench-gemm-sustained:{name}",
        params={"kind": args.kind, "device": name, "dtype": args.dtype, "sustain_s": args.sustain_s,
                "shapes": len(frame), "setup": args.setup},
        metrics={"burst_tflops": float(frame["burst_tflops"].max()),
                 "sustained_tflops": float(frame["sustained_tflops"].max()),
                 "sustained_ratio": float(ratios.min())},
        artifacts=[path], tags={"kind": args.kind, "device": name},
    ))
    return 0
