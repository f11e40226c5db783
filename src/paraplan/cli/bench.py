"""Measure collectives with torch.distributed (gloo on CPU, nccl on CUDA).

Launches WORLD_SIZE local ranks (a free TCP port is picked automatically) and, for
each collective and message size (geometric from --min-bytes to --max-bytes by
--factor, each rounded up to a multiple of the element size times the world size),
runs --warmup untimed calls and --iters timed ones, each after a barrier. An
iteration's time is the slowest rank's; the CSV gives the median (time_us) and the
10th/90th percentiles. Sizes, algbw and busbw follow nccl-tests.

Writes OUTPUT/<collective>_n<world>.csv per collective and world size, prints a
nccl-tests-style table on stderr (with a progress line on a terminal), saves a
latency/bandwidth figure per collective (PLOTS/<collective>_n<world>.png/.pdf; not with
--no-plots: `paraplan bench-figures` draws them from the CSVs) and
logs one MLflow run per collective and world size (experiment paraplan-bench).

all_to_allv measures --a2a-samples uneven DLRM-style exchanges instead of a size
sweep (global batch, tables per rank and embedding dim drawn with --seed; see
paraplan.comm.a2av).

With --kind gemm or attention, times torch.matmul over an m x n x k grid, or
scaled_dot_product_attention forward and backward, on one device (--device cpu|cuda)
and writes OUTPUT/gemm.csv or OUTPUT/attention.csv for `paraplan fit --kind kernels`
(docs/kernels.md); --dtype float8_e4m3fn times FP8 GEMMs (torch._scaled_mm, CUDA).
With --kind gemm-sustained, runs each shape back to back for --sustain-s seconds on a
GPU and writes its burst and sustained rates, SM clock and board power to
OUTPUT/gemm_sustained.csv (the ceiling a GPU holds at its power limit).

Examples:
  paraplan bench --world-size 2 --collectives all_reduce,all_gather --max-bytes 1048576 -o out/
  paraplan bench --kind gemm --device cuda --dtype bfloat16 --m 1024,4096,8192 --n 4096 --k 4096 -o out/
  paraplan bench --kind gemm-sustained --device cuda --dtype bfloat16 --gemm-shapes 8192x8192x8192 -o out/
  paraplan bench --world-size 4 --collectives all_to_allv --a2a-samples 50 --seed 0 -o out/
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from pathlib import Path

from paraplan.cli.common import (
    add_output_argument,
    add_tracking_arguments,
    deprecated,
    int_list,
    name_list,
    require_torch,
    track,
)
from paraplan.core import COLLECTIVES, ConfigError

NAME = "bench"
HELP = "measure collectives (all_reduce, all_gather, ...) with torch.distributed, or GEMM/attention kernels"
ORDER = 10

BENCH_COLLECTIVES: tuple[str, ...] = (*COLLECTIVES, "all_to_allv")
DEFAULT_COLLECTIVES = "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from paraplan.cli._kernel_bench import add_kernel_arguments

    add_output_argument(parser, "folder for the CSVs, one <collective>_n<world>.csv per collective and "
                        "world size (--kind gemm|attention: gemm.csv or attention.csv)", old=["--out-dir"])
    parser.add_argument("--kind", choices=("collectives", "gemm", "attention", "gemm-sustained"), default="collectives",
                        help="what to measure")
    parser.add_argument("--backend", default="gloo",
                        help="torch.distributed backend: gloo (CPU) or nccl (one CUDA device per rank)")
    parser.add_argument("--world-size", default="2",
                        help="ranks to launch; a comma list (2,4) runs one launch per world size")
    parser.add_argument("--collectives", default=DEFAULT_COLLECTIVES,
                        help=f"comma list of collectives among {', '.join(BENCH_COLLECTIVES)}")
    parser.add_argument("--min-bytes", type=int, default=8, help="smallest message size in bytes")
    parser.add_argument("--max-bytes", type=int, default=64 * 2**20, help="largest message size in bytes")
    parser.add_argument("--factor", type=int, default=2, help="geometric step between sizes (integer >= 2)")
    parser.add_argument("--dtype", default="float32",
                        help="element type: float32, float64, float16, bfloat16, int32, int64, uint8")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per size")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per size (each after a barrier)")
    parser.add_argument("--timeout-s", type=float, default=300.0,
                        help="seconds without progress from any rank after which the job is "
                             "declared hung; every rank is then stopped")
    deprecated(parser, "--timeout", "--timeout-s", "timeout_s", convert=float)
    parser.add_argument("--nodes", type=int, default=1,
                        help="number of nodes the ranks span, recorded in the CSV (ranks run locally)")
    parser.add_argument("--plots", type=Path, default=None, metavar="DIR",
                        help="folder for the figures (default: OUTPUT)")
    deprecated(parser, "--figures", "--plots", "plots", convert=Path)
    parser.add_argument("--no-plots", action="store_true",
                        help="write the CSVs only; `paraplan bench-figures` draws the figures later "
                             "(the workflow does, so the measuring job spends no time on figures)")
    parser.add_argument("--a2a-samples", type=int, default=50,
                        help="all_to_allv only: number of random uneven exchanges to measure")
    parser.add_argument("--seed", type=int, default=0,
                        help="all_to_allv only: seed of the random exchanges")
    add_kernel_arguments(parser)
    add_tracking_arguments(parser)


def _check(args: argparse.Namespace) -> tuple[list[int], list[str]]:
    worlds = int_list(args.world_size, "--world-size")
    if any(w < 1 for w in worlds):
        raise ConfigError("--world-size", f"every world size must be >= 1, got {args.world_size}")
    collectives = list(dict.fromkeys(name_list(args.collectives, "--collectives", BENCH_COLLECTIVES)))
    for key, value, low in (("--warmup", args.warmup, 0), ("--iters", args.iters, 1), ("--nodes", args.nodes, 1)):
        if value < low:
            raise ConfigError(key, f"must be >= {low}, got {value}")
    if not args.timeout_s > 0:
        raise ConfigError("--timeout-s", f"must be positive, got {args.timeout_s}")
    if "all_to_allv" in collectives and args.a2a_samples < 1:
        raise ConfigError("--a2a-samples", "all_to_allv needs at least one sample (--a2a-samples N, N >= 1)")
    return worlds, collectives


def run(args: argparse.Namespace) -> int:
    from paraplan.comm.a2av import draw_samples
    from paraplan.comm.bench import BenchJob, check_backend, run_bench
    from paraplan.comm.sizes import element_bytes, message_sizes
    from paraplan.files import check_outputs

    if args.kind != "collectives":
        from paraplan.cli._kernel_bench import run_kernel_bench

        require_torch(f"measuring {args.kind} kernels")
        return run_kernel_bench(args)
    require_torch("measuring collectives")
    worlds, collectives = _check(args)
    check_outputs(folders=[args.output, args.plots])
    elem = element_bytes(args.dtype)
    jobs = []
    for world in worlds:
        check_backend(args.backend, world)
        sweep = [c for c in collectives if c != "all_to_allv"]
        sizes = message_sizes(args.min_bytes, args.max_bytes, args.factor, world, elem) if sweep else []
        samples = draw_samples(args.a2a_samples, world, args.seed) if "all_to_allv" in collectives else []
        jobs.append(BenchJob(
            backend=args.backend, world_size=world, collectives=tuple(collectives),
            sizes_bytes=tuple(sizes), dtype=args.dtype, warmup=args.warmup, iters=args.iters,
            timeout_s=args.timeout_s, a2av_samples=tuple(samples),
        ))
    # SIGTERM (Snakemake stopping the job, a batch scheduler) ends the command like
    # Ctrl-C: ranks are stopped and no file is left half-written.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        for job in jobs:
            printer = _TablePrinter(job, args.nodes)
            try:
                outcome = run_bench(job, on_start=printer.start, on_result=printer.row)
            finally:
                printer.close()
            _write_outputs(args, job, outcome)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


class _TablePrinter:
    """Streams the nccl-tests-style table to stderr as results arrive, under a progress
    line (sizes and samples measured, rate, ETA) when stderr is a terminal."""

    def __init__(self, job, nodes: int):
        from paraplan.progress import bar

        self.job = job
        self.nodes = nodes
        self.host = ""
        sweeps = sum(1 for c in job.collectives if c != "all_to_allv")
        total = sweeps * len(job.sizes_bytes) + len(job.a2av_samples)
        self.progress = bar(total, f"bench n={job.world_size}", "size")

    def _print(self, text: str) -> None:
        self.progress.write(text, file=sys.stderr)
        sys.stderr.flush()

    def start(self, collective: str, host: str) -> None:
        from paraplan.comm.results import table_header

        self.host = host
        self.progress.set_description(f"bench {collective} n={self.job.world_size}")
        self._print(table_header(collective, self.job.backend, self.job.world_size, self.nodes, host))

    def row(self, timing) -> None:
        from paraplan.comm.bench import timing_frame
        from paraplan.comm.results import table_row

        frame = timing_frame(self.job, timing, self.host, self.nodes)
        self._print(table_row(frame.iloc[0]))
        self.progress.update(1)

    def close(self) -> None:
        self.progress.close()


def _write_outputs(args: argparse.Namespace, job, outcome) -> None:
    from paraplan.comm.bench import collective_frame
    from paraplan.comm.results import table_footer
    from paraplan.files import write_csv
    from paraplan.plots.bench import bench_figure
    from paraplan.track import RunLog

    figures_dir = args.plots or args.output
    for collective in job.collectives:
        frame = collective_frame(job, collective, outcome, nodes=args.nodes)
        stem = f"{collective}_n{job.world_size}"
        csv_path = args.output / f"{stem}.csv"
        write_csv(csv_path, frame)
        figure_paths = [] if args.no_plots else bench_figure(frame, figures_dir / stem)
        print(f"# {stem}:\n{table_footer(frame)}\n# wrote {csv_path}", file=sys.stderr, flush=True)
        track(args, RunLog(
            stage="bench",
            run_name=stem,
            params=_params(args, job, collective),
            metrics=_metrics(frame),
            step_metrics={"time_us": _time_steps(frame, collective)},
            artifacts=[csv_path, *figure_paths],
            tags={"collective": collective, "world_size": str(job.world_size), "host": outcome.host},
        ))


def _params(args: argparse.Namespace, job, collective: str) -> dict[str, object]:
    params: dict[str, object] = {
        "collective": collective,
        "backend": job.backend,
        "world_size": job.world_size,
        "nodes": args.nodes,
        "warmup": job.warmup,
        "iters": job.iters,
        "timeout_s": job.timeout_s,
    }
    if collective == "all_to_allv":
        params.update(a2a_samples=len(job.a2av_samples), seed=args.seed, dtype="float32")
    else:
        params.update(
            dtype=job.dtype, min_bytes=args.min_bytes, max_bytes=args.max_bytes, factor=args.factor,
            n_sizes=len(job.sizes_bytes), sizes_bytes=list(job.sizes_bytes),
        )
    return params


def _metrics(frame) -> dict[str, float]:
    smallest = frame.loc[frame["size_bytes"].idxmin()]
    return {
        "peak_busbw_GBps": float(frame["busbw_GBps"].max()),
        "latency_min_size_us": float(smallest["time_us"]),
    }


def _time_steps(frame, collective: str) -> list[tuple[int, float]]:
    """time_us stepped by round(log2 size_bytes); all_to_allv (whose samples may share
    a size) is stepped by sample number."""
    if collective == "all_to_allv":
        return [(int(s), float(t)) for s, t in zip(frame["sample"], frame["time_us"], strict=True)]
    return [
        (round(math.log2(int(s))), float(t))
        for s, t in zip(frame["size_bytes"], frame["time_us"], strict=True)
    ]
