"""The A100's sustained-GEMM rows are what the transcribed data say: each sustained rate is
the 32768^3 BF16 GEMM's FLOPs over the mean per-GPU time of the complete Perlmutter jobs
in `data/published/gpu_variability/`, each burst rate the MAMF table's A100 SXM best; and
the shipped A100 kernel file holds its ceilings at their factor (docs/kernels.md)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from paraplan.kernels.sustained import read_sustained_csvs, sustained_factor
from paraplan.predict.variability import split_jobs

ROOT = Path(__file__).resolve().parents[2]
ROWS = ROOT / "data/published/gemm/a100_perlmutter_gemm_sustained.csv"
VARIABILITY = ROOT / "data/published/gpu_variability"
GEMM_FLOPS = 2 * 32768.0**3


def _mean_time_s(name: str, job_gpus: int, from_end: bool) -> tuple[float, int]:
    with (VARIABILITY / name).open() as f:
        rows = list(csv.DictReader(f))
    jobs = split_jobs([f"{r['Node']}_GPU{r['GPU']}" for r in rows], [float(r["Time"]) for r in rows], job_gpus,
                      from_end)
    times = [t for job in jobs for t in job]
    return float(np.mean(times)), len(times)


def test_sustained_rows_are_the_perlmutter_means_against_the_mamf_burst():
    rows = read_sustained_csvs([ROWS])
    with (ROOT / "data/published/gemm/mamf_best_shapes_bf16.csv").open() as f:
        mamf = next(r for r in csv.DictReader(f) if r["device"] == "A100-SXM4-80GB")
    expected = [_mean_time_s("perlmutter_a100_bf16_gemm_n32768.csv", 64, False),
                _mean_time_s("perlmutter_a100_bf16_gemm_n32768_tail.csv", 256, True)]
    assert [r.runs for r in rows] == [704, 512]
    for row, (mean_s, gpus) in zip(rows, expected, strict=True):
        assert row.runs == gpus
        assert row.sustained_tflops == pytest.approx(GEMM_FLOPS / mean_s / 1e12, abs=0.05)
        assert row.burst_tflops == float(mamf["tflops"]) == 271.2
        assert row.power_limit_w == 400.0
    found = sustained_factor(rows, "A100-SXM4-40GB", "bfloat16")
    assert found is not None and found.factor == pytest.approx((258.8 / 271.2 * 258.2 / 271.2) ** 0.5, rel=1e-12)


def test_shipped_a100_ceilings_are_the_burst_fit_times_the_factor():
    kernels = json.loads((ROOT / "config/kernels/A100-SXM4-80GB.json").read_text())
    factor = kernels["gemm"]["sustained"]["factor"]
    assert kernels["gemm"]["sustained"]["from_device"] == "A100-SXM4-40GB"
    assert factor == pytest.approx(0.9532, abs=1e-4)
    assert kernels["efficiency"]["gemm_efficiency"] == pytest.approx(
        kernels["gemm"]["params"]["gemm_efficiency"] * factor, rel=1e-12)
    for name in ("attention_fwd_efficiency", "attention_bwd_efficiency"):
        assert kernels["efficiency"][name] == pytest.approx(kernels["attention"]["params"][name] * factor, rel=1e-12)
