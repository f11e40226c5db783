"""GPU-to-GPU speed variability: where the A100's `gpu_speed_cv` comes from, and how
well 1 + cv x E[max of N standard normals] predicts each measured job's slowest GPU.

Reads the per-GPU BF16 GEMM times (cuBLAS, m = n = k = 32768, the mean of 75 calls after
25 warm-ups) that Pradeep, Bhatele et al. measured on Perlmutter's A100s at the start of
their jobs (data/published/gpu_variability/, data/README.md): jobs of 64 GPUs (16 nodes)
from the head of their file, jobs of 256 (64 nodes) from its tail. Prints the pooled
within-job coefficient of variation (what the A100 cluster files state), and per job the
measured slowest GPU over the job's mean against the model. docs/accuracy-at-scale.md
(GPU-to-GPU speed) discusses the figures.

    python benchmarks/bench_gpu_variability.py
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from paraplan.predict.variability import (
    MEASURED_A100_CV,
    expected_max_std_normal,
    split_jobs,
    straggler_time_factor,
    within_job_cv,
)

DATA = Path(__file__).resolve().parents[1] / "data/published/gpu_variability"
FILES = (("perlmutter_a100_bf16_gemm_n32768.csv", 64, False), ("perlmutter_a100_bf16_gemm_n32768_tail.csv", 256, True))


def jobs(name: str, job_gpus: int, from_end: bool) -> list[list[float]]:
    with (DATA / name).open() as f:
        rows = list(csv.DictReader(f))
    return split_jobs([f"{r['Node']}_GPU{r['GPU']}" for r in rows], [float(r["Time"]) for r in rows], job_gpus,
                      from_end)


def main() -> int:
    by_size = {size: jobs(name, size, from_end) for name, size, from_end in FILES}
    every = [job for found in by_size.values() for job in found]
    cv = within_job_cv(every)
    per_job = [float(np.std(job) / np.mean(job)) for job in every]
    deviations = np.concatenate([np.asarray(job) / np.mean(job) - 1 for job in every])
    skew = float(np.mean(deviations ** 3) / np.mean(deviations ** 2) ** 1.5)
    print(f"Perlmutter A100, BF16 GEMM 32768^3: {sum(len(j) for j in every)} GPU measurements in {len(every)} jobs")
    print(f"  pooled within-job cv {cv:.4%} (per job {min(per_job):.2%} to {max(per_job):.2%}); skewness {skew:+.2f}")
    print(f"  mean GEMM time {np.mean([np.mean(j) for j in every]):.4f} s = "
          f"{2 * 32768.0**3 / np.mean([np.mean(j) for j in every]) / 1e12:.0f} TFLOP/s")
    print("  slowest GPU / job mean: measured vs 1 + cv x E[max of N]")
    for size, found in by_size.items():
        measured = [max(job) / float(np.mean(job)) for job in found]
        model = straggler_time_factor(cv, size)
        print(f"    N = {size:4d} (E[max] {expected_max_std_normal(size):.3f}): {len(found):2d} jobs, measured mean "
              f"{np.mean(measured):.4f} (range {min(measured):.4f}-{max(measured):.4f}), model {model:.4f}")
    print(f"  the factor at the test sets' scales (cv as shipped, {MEASURED_A100_CV:.3f}):")
    for n in (8, 64, 512, 3072, 16384):
        print(f"    N = {n:5d}: x {straggler_time_factor(MEASURED_A100_CV, n):.4f} on compute-bound kernel time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
