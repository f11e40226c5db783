"""paraplan's price of a MoE layer's grouped expert GEMMs beside the H100 measurement
(`data/measured/h100-sxm5/grouped_gemm_*_graph.csv`, `*_eager.csv`: `benchmarks/gpu/grouped_gemm.py`).

Each measured case is G experts' GEMMs of (m x k) @ (k x n) (forward, dgrad, wgrad of fc1
and fc2 at the hidden and expert FFN sizes of Qwen3-30B-A3B, GPT-OSS-120B, Qwen3-235B-A22B
and DeepSeek-V3; G 4-32, 256-4,096 tokens per expert), timed four ways on one GPU:
`graph4` (the G cuBLAS GEMMs over 4 streams, as Transformer Engine's grouped linear layer
runs them, captured in a CUDA graph: device time alone), `graph1` (one stream),
`grouped_mm` (one CUTLASS grouped kernel, BF16) and `dense` (one GEMM of the same FLOPs).

The comparison is of ratios to the dense GEMM of the same FLOPs, measured and priced, so
that the clock state of the short measurement (burst, not held at the power limit) drops
out. paraplan prices the grouped GEMM as its experts' tiles sharing the SMs plus the
kernel latency once per expert (`Kernels.launches`); the line "tiles only" is the same
price with one latency for the whole group (paraplan before the measurement). Nothing is
fitted here: the latency is the shipped calibration's; the per-expert cost a free fit
would give is printed beside it. The dense reference was timed eagerly (one call between
two CUDA events): for the smallest cases (a few microseconds of device work) the host's
launch is inside it, so their ratios are the least reliable.

    PYTHONPATH=src python benchmarks/bench_grouped_gemm.py
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from paraplan.clusters import load_cluster
from paraplan.core.cluster import Cluster
from paraplan.core.run_settings import RunSettings
from paraplan.predict.calibration import calibration_for
from paraplan.predict.device_model import DeviceEfficiency, kernel_times_s
from paraplan.predict.fp8_ops import device_speed
from paraplan.predict.work import _Builder

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "data" / "measured" / "h100-sxm5"
KEY = ("model", "pass", "projection", "groups", "m", "k", "n")


def read_cases(dtype: str) -> dict[tuple, dict[str, float]]:
    """Median time (us) per case and mode, from the graph and eager files of one dtype."""
    cases: dict[tuple, dict[str, float]] = defaultdict(dict)
    for run in ("graph", "eager"):
        with (MEASURED / f"grouped_gemm_{dtype}_{run}.csv").open(newline="") as handle:
            for r in csv.DictReader(handle):
                key = tuple(r[f] if f in ("model", "pass", "projection") else int(r[f]) for f in KEY)
                if r["mode"] == "dense" and run == "eager":
                    cases[key]["dense_eager"] = float(r["time_us"])
                else:
                    cases[key][r["mode"]] = float(r["time_us"])
    return cases


def priced_us(cases: list[tuple], dtype: str, cluster: Cluster, efficiency: DeviceEfficiency, grouped: bool,
              dense: bool = False) -> np.ndarray:
    settings = RunSettings(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, data_parallel_size=1,
                           global_batch_size=1, dtype="fp8" if dtype == "fp8" else "bf16",
                           **({"fp8_recipe": "tensorwise"} if dtype == "fp8" else {}))
    speed = device_speed(cluster.device, settings)
    work = _Builder(1 if dtype == "fp8" else 2)
    for _, pass_, _, groups, m, k, n in cases:
        if dense:  # all the groups' rows (wgrad: their inner dimension) in one GEMM
            work.gemm(m if pass_ == "wgrad" else m * groups, k * groups if pass_ == "wgrad" else k, n)
        else:
            work.gemm(m, k, n, groups, grouped=grouped)
    return kernel_times_s(work.build().kernels, speed, efficiency) * 1e6


def gmae(ratio: np.ndarray) -> float:
    return float(np.exp(np.mean(np.abs(np.log(ratio)))) - 1)


def signed(ratio: np.ndarray) -> float:
    return float(np.exp(np.mean(np.log(ratio))) - 1)


def main() -> None:
    cluster = load_cluster("dgx-h100")
    calibration = calibration_for(cluster)
    eff = calibration.efficiency
    latency_us = eff.kernel_latency_s * 1e6
    print(f"grouped expert GEMMs on {cluster.device.name}: priced / measured, each as a ratio to the dense GEMM of "
          f"the same FLOPs (kernel latency {latency_us:.1f} us, calibration {calibration.name})")
    for dtype in ("bf16", "fp8"):
        data = read_cases(dtype)
        cases = sorted(data)
        dense_priced = priced_us(cases, dtype, cluster, eff, grouped=False, dense=True)
        grouped_priced = priced_us(cases, dtype, cluster, eff, grouped=True)
        packed_priced = priced_us(cases, dtype, cluster, eff, grouped=False)
        groups = np.array([c[3] for c in cases], dtype=float)
        scale = dense_priced / np.array([data[c]["dense"] for c in cases])
        print(f"\n{dtype}: {len(cases)} cases; dense GEMMs priced / measured, median {np.median(scale):.3f} "
              "(the measurement ran at burst clocks, the price is held at 700 W)")
        for mode, label in (("graph4", "4 streams (Transformer Engine)"), ("graph1", "1 stream"),
                            ("grouped_mm", "one grouped kernel (torch._grouped_mm)")):
            have = np.array([mode in data[c] for c in cases])
            if not have.any():
                continue
            # the same run's dense GEMM: its clock state per case (graph modes, or the eager run);
            # captured in a graph too where the file has it (no host launch inside the timing)
            dense_key = "dense_eager" if mode == "grouped_mm" else (
                "graph_dense" if all("graph_dense" in data[c] for c in cases) else "dense")
            scale = dense_priced / np.array([data[c].get(dense_key, np.nan) for c in cases])
            grouped, packed = grouped_priced / scale, packed_priced / scale
            measured = np.array([data[c].get(mode, np.nan) for c in cases])[have]
            print(f"  vs {label}, {int(have.sum())} cases:")
            for name, price in (("tiles + latency per expert", grouped), ("tiles only (before)", packed)):
                r = price[have] / measured
                print(f"    {name:28s} GMAE {gmae(r):6.1%}  signed {signed(r):+6.1%}")
            # the per-expert cost that fits best (a check on the calibration's latency, not used)
            base = packed[have] - latency_us
            grid = np.linspace(0.0, 10.0, 1001)
            costs = [np.mean(np.abs(np.log((base + groups[have] * c) / measured))) for c in grid]
            print(f"    best per-expert cost (free, not used): {grid[int(np.argmin(costs))]:.2f} us")
        print("  4 streams, priced / measured by tokens per expert (median over shapes and G):")
        tokens = np.array([c[5] if c[1] == "wgrad" else c[4] for c in cases])
        scale = dense_priced / np.array([data[c]["dense"] for c in cases])
        ratio = grouped_priced / scale / np.array([data[c]["graph4"] for c in cases])
        by_model: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for c, t, r in zip(cases, tokens, ratio, strict=True):
            by_model[c[0]][int(t)].append(float(r))
        columns = sorted({int(t) for t in tokens})
        print("    " + f"{'model':18s}" + "".join(f"{t:>7d}" for t in columns))
        for model, row in by_model.items():
            print("    " + f"{model:18s}" + "".join(f"{statistics.median(row[t]):7.2f}" for t in columns))


if __name__ == "__main__":
    main()
