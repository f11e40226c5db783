"""paraplan's price of memory-bound kernels beside the H100 measurement
(`data/measured/h100-sxm5/memory_kernels.csv`, `benchmarks/gpu/memory_kernels.py`).

Each single-launch kernel is priced as paraplan prices a memory-bound kernel, bytes /
(HBM bandwidth x `memory_efficiency`) + `kernel_latency_s`, with the shipped H100
calibration (h100-transfer: `memory_efficiency` carried from the A100 fit, 0.847 of
3.35 TB/s). Printed per kernel: measured and priced time and their ratio, and, for the
streaming kernels (copy, add, scale), the efficiency and latency a free fit gives
(a check, not used). Kernels of several launches in eager PyTorch (SwiGLU, dropout-add,
the FP8 cast), the atomics-bound `index_add` and the `index_select` whose repeated rows
stay in L2 are listed apart: their bytes are not what one fused kernel moves.

    PYTHONPATH=src python benchmarks/bench_memory_kernels.py
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from paraplan.clusters import load_cluster
from paraplan.predict.calibration import calibration_for

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "data" / "measured" / "h100-sxm5" / "memory_kernels.csv"
SINGLE = ("copy", "add", "mul_scalar", "layer_norm_fwd", "rms_norm_fwd", "layer_norm_bwd", "rms_norm_bwd",
          "adam_fused")
STREAMING = ("copy", "add", "mul_scalar")


def main() -> None:
    cluster = load_cluster("dgx-h100")
    calibration = calibration_for(cluster)
    eff = calibration.efficiency
    bandwidth = cluster.device.mem_bandwidth_Bps
    with TABLE.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    print(f"memory-bound kernels on {cluster.device.name} ({bandwidth / 1e12:.2f} TB/s): measured vs priced "
          f"(calibration {calibration.name}: memory_efficiency {eff.memory_efficiency:.3f}, kernel latency "
          f"{eff.kernel_latency_s * 1e6:.1f} us)")
    print(f"   {'kernel':16s} {'tokens':>6s} {'width':>10s} {'MB':>7s} {'measured us':>11s} {'priced us':>9s} "
          f"{'priced/meas':>11s} {'of peak':>7s}")
    ratios: dict[str, list[float]] = {}
    for r in rows:
        nbytes, measured = float(r["bytes"]), float(r["time_us"])
        priced = (nbytes / (bandwidth * eff.memory_efficiency) + eff.kernel_latency_s) * 1e6
        if r["kernel"] in SINGLE:
            ratios.setdefault(r["kernel"], []).append(priced / measured)
            print(f"   {r['kernel']:16s} {r['tokens']:>6s} {r['width']:>10s} {nbytes / 1e6:7.0f} {measured:11.1f} "
                  f"{priced:9.1f} {priced / measured:11.2f} {nbytes / measured / 1e6 / bandwidth * 1e12:7.1%}")
    print("   median priced / measured: " + ", ".join(f"{k} {np.median(v):.2f}" for k, v in ratios.items()))
    stream = [r for r in rows if r["kernel"] in STREAMING]
    nbytes = np.array([float(r["bytes"]) for r in stream])
    measured = np.array([float(r["time_us"]) for r in stream]) * 1e-6
    fit = least_squares(lambda p: np.log((nbytes / (bandwidth * p[0]) + p[1] * 1e-6) / measured), x0=[0.85, 4.0],
                        bounds=([0.3, 0.0], [1.0, 50.0]))
    print(f"   streaming kernels ({len(stream)} rows), free fit: efficiency {fit.x[0]:.3f}, latency {fit.x[1]:.1f} us "
          f"(not used)")
    print("   not comparable (several launches, atomics, or L2-resident rows): "
          + ", ".join(sorted({r["kernel"] for r in rows} - set(SINGLE))))


if __name__ == "__main__":
    main()
