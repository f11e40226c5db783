"""paraplan's FP8 GEMM prices beside DeepGEMM's published kernel micro-benchmarks
(`data/published/grouped_gemm/deepgemm_h800_fp8_blockwise.csv`, provenance in
data/README.md): normal GEMMs and the grouped GEMMs of a MoE layer (contiguous and
masked layouts, DeepSeek-V3's expert shapes), on H800, the H100 SXM's GH100 with
NVLink cut (same SMs, clocks, HBM3 and FP8 peak).

Each shape is priced as an fp8 run prices a routed expert's GEMM (`moe_ops`: one
`FP8_GEMM` of `groups` batched GEMMs of m x k x n, the tiles of all groups in waves over
the SMs), on dgx-h100 with its shipped calibration (h100-transfer) and FP8 GEMM ceiling
(`config/kernels/H100-SXM5-80GB.json`, fitted on cuBLAS FP8 GEMMs measured held on an H100). It prints
per row the published and the predicted TFLOP/s and their ratio (published / predicted),
and per layout the median ratio. DeepGEMM scales 1 x 128 / 128 x 128 blocks and promotes
on CUDA cores (DeepSeek-V3's FP8 recipe, `fp8_recipe blockwise`); the Megatron-Bridge
rows run Transformer Engine's per-tensor recipes on cuBLAS. Nothing is fitted here.

    PYTHONPATH=src python benchmarks/bench_moe_gemm.py
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from paraplan.clusters import load_cluster
from paraplan.core.run_settings import RunSettings
from paraplan.predict.calibration import calibration_for
from paraplan.predict.device_model import kernel_times_s
from paraplan.predict.fp8_ops import device_speed
from paraplan.predict.ops import FP8_OPERAND_BYTES
from paraplan.predict.work import _Builder

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "data/published/grouped_gemm/deepgemm_h800_fp8_blockwise.csv"


def main() -> None:
    cluster = load_cluster("dgx-h100")
    settings = RunSettings(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, data_parallel_size=1,
                           global_batch_size=1, dtype="fp8", fp8_recipe="blockwise")
    speed = device_speed(cluster.device, settings)
    calibration = calibration_for(cluster)  # paraplan predict's default on this cluster
    with TABLE.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    work = _Builder(FP8_OPERAND_BYTES)
    for r in rows:
        work.gemm(float(r["m_per_group"]), float(r["k"]), float(r["n"]), float(r["groups"]))
    kernels = work.build().kernels
    predicted = kernels.flops / kernel_times_s(kernels, speed, calibration.efficiency) / 1e12
    print(f"DeepGEMM FP8 (blockwise) on H800 vs paraplan's FP8 GEMM price on {cluster.device.name} "
          f"(calibration {calibration.name}); ratio = published / predicted")
    print(f"   {'layout':10s} {'groups':>6s} {'m':>5s} {'n':>6s} {'k':>6s} {'published':>9s} {'predicted':>9s} "
          f"{'ratio':>6s}")
    ratios: dict[str, list[float]] = {}
    for r, tflops in zip(rows, predicted, strict=True):
        ratio = float(r["tflops"]) / tflops
        ratios.setdefault(r["layout"], []).append(ratio)
        print(f"   {r['layout']:10s} {r['groups']:>6s} {r['m_per_group']:>5s} {r['n']:>6s} {r['k']:>6s} "
              f"{float(r['tflops']):9.0f} {tflops:9.0f} {ratio:6.2f}")
    for layout, values in ratios.items():
        print(f"   {layout}: median ratio {np.median(values):.2f} over {len(values)} shapes "
              f"(range {min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
