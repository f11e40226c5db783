"""Peak memory (RSS) of `paraplan predict` against the run table's rows and of
`paraplan plan` (a transformer) against the model's layers and the GPUs, each size
in a fresh process (the child's own ru_maxrss from wait4), so the bound stated in
docs/limits.md can be checked on any machine:

- predict: flat in the rows (the table is streamed; 2,048 candidate settings are
  priced at a time), plus 40 bytes per row with a measured_iteration_s;
- plan: flat in the layers and GPUs, except the exact engine's one re-timed candidate
  at a time, at most `MAX_SIMULATED_OPS` pipeline operations (60-110 bytes each);
- one run-table row at the largest pipeline the engine takes (128 stages x 16,384
  micro-batches: 6.3 million operations), the most one candidate costs.

    python benchmarks/bench_memory.py                 # a few minutes on 2 cores
    python benchmarks/bench_memory.py --rows 1000,10000 --layers 1024,4096,16384
    python benchmarks/bench_memory.py --huge          # + 65,536 layers on 16,384 GPUs (8+ min)
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADER = ["name", "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
          "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size", "global_batch_size",
          "micro_batch_size", "recompute_granularity", "dtype"]
SHAPES = [  # a fixed row, a row whose micro-batch size is searched (6 candidates), a large model
    (24, 2048, 16, 2048, 50257, 2, 2, 2, 64, 2, "full", "bf16"),
    (32, 4096, 32, 2048, 32000, 4, 4, 4, 256, "", "none", "bf16"),
    (96, 12288, 96, 2048, 50257, 8, 16, 8, 1536, 1, "selective", "bf16"),
]
LONGEST = (1024, 1024, 16, 1024, 32000, 1, 128, 1, 16384, 1, "full", "bf16")


def peak_rss(argv: list[str]) -> tuple[float, float]:
    """(peak RSS in MB, wall seconds) of `argv` run to completion; a failure stops the benchmark."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.exit(f"{' '.join(argv)} failed ({proc.returncode}):\n{err.decode(errors='replace')[-2000:]}")
    return usage.ru_maxrss / 1024, time.perf_counter() - started  # Linux: KiB


def paraplan(*args: str) -> list[str]:
    return [sys.executable, "-m", "paraplan", *args, "--no-track"]


def table(path: Path, rows: int) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER)
        for i in range(rows):
            writer.writerow([f"run{i}", *SHAPES[i % len(SHAPES)]])
    return path


def model(path: Path, layers: int) -> Path:
    path.write_text(f"num_layers: {layers}\nhidden_size: 1024\nnum_attention_heads: 16\nseq_length: 1024\n"
                    "vocab_size: 32000\n")
    return path


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=ints, default=[300, 3000], help="run-table sizes for predict")
    parser.add_argument("--layers", type=ints, default=[1024, 4096, 16384], help="model depths for plan")
    parser.add_argument("--gpus", type=int, default=1024, help="GPUs for plan (global batch: the same)")
    parser.add_argument("--huge", action="store_true", help="also plan 65,536 layers on 16,384 GPUs (long)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_memory."))
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}: peak RSS of each command in a fresh process")
    print(f"{'command':<9}{'rows':>8}{'layers':>8}{'GPUs':>7}{'peak RSS (MB)':>15}{'wall (s)':>10}")
    for rows in args.rows:
        runs = table(work / f"runs{rows}.csv", rows)
        mb, wall = peak_rss(paraplan("predict", str(runs), "--cluster", "dgx-a100", "-o", str(work / "out.csv")))
        print(f"{'predict':<9}{rows:>8}{'':>8}{'':>7}{mb:>15.0f}{wall:>10.1f}", flush=True)
    longest = work / "longest.csv"
    with longest.open("w", newline="") as handle:
        csv.writer(handle).writerows([HEADER, ["longest", *LONGEST]])
    mb, wall = peak_rss(paraplan("predict", str(longest), "--cluster", "dgx-a100", "-o", str(work / "out.csv")))
    print(f"{'predict':<9}{'1':>8}{LONGEST[0]:>8}{LONGEST[7]:>7}{mb:>15.0f}{wall:>10.1f}"
          "   one row of 3 x 128 x 16,384 pipeline operations", flush=True)
    sizes = [(layers, args.gpus, args.gpus) for layers in args.layers]
    if args.huge:
        sizes.append((65536, 16384, 4096))
    for layers, gpus, batch in sizes:
        path = model(work / f"deep{layers}.yaml", layers)
        mb, wall = peak_rss(paraplan("plan", "--model", str(path), "--cluster", "dgx-a100", "--gpus", str(gpus),
                                     "--global-batch-size", str(batch), "-o", str(work / "plan.csv")))
        print(f"{'plan':<9}{'':>8}{layers:>8}{gpus:>7}{mb:>15.0f}{wall:>10.1f}", flush=True)
    print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
