"""How much of a large-scale prediction the single-node vTrain data (data/published/) actually pins down.

The 1,440 measured runs use hidden sizes 1024 and 2048 on 8 A100s, so every GEMM in
them is small or mid-sized. This script fixes the large-GEMM ceiling
(`gemm_efficiency`) at several values, refits every other device parameter on the
vTrain data, and prints for each: the in-sample MAPE, the efficiency a large GEMM
(8192^3) and a typical vTrain GEMM (4096 x 6144 x 2048) then reach, and the predicted
iteration time of every run in a run table (default: config/runs/llm_a100.csv, runs
at 64-1,024 GPUs). Fits whose MAPE differ by a few tenths of a percent are equally
consistent with the data; the spread of their large-run predictions is what the
single-node data leaves open. No large-scale measurement is used.

    python benchmarks/calibration_sensitivity.py [--ceilings 0.75,0.85,0.95] [--runs FILE]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from paraplan.clusters import load_cluster
from paraplan.predict import calibrate as cal
from paraplan.predict.build import run_structure
from paraplan.predict.calibration import load_calibration
from paraplan.predict.device_model import DeviceSpeed, gemm_efficiency
from paraplan.predict.predictor import predict_rows
from paraplan.predict.runtable import read_run_table

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT / "data/published/vtrain_a100_single_node_measured.csv"


def main() -> None:
    from bench_predict import _run_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--runs", type=Path, default=ROOT / "config/runs/llm_a100.csv")
    parser.add_argument("--cluster", default="dgx-a100")
    parser.add_argument("--ceilings", default="0.75,0.80,0.85,0.90,0.95",
                        help="gemm_efficiency values to fix (comma-separated)")
    args = parser.parse_args()
    calibration = load_calibration()
    cluster = load_cluster("dgx-a100")
    comm = calibration.comm_model(cluster)
    _, rows = read_run_table(_run_table(args.data))
    measured = np.array([r.measured_iteration_s for r in rows])
    structures = [run_structure(r.model, r.settings, cluster, comm) for r in rows]
    target = load_cluster(args.cluster)
    target_comm = calibration.comm_model(target)
    _, table = read_run_table(args.runs)
    speed = DeviceSpeed.of(cluster.device, "bf16")
    shapes = {"8192^3": (8192, 8192, 8192), "4096x6144x2048": (4096, 6144, 2048)}
    rest = tuple(n for n in cal.DEFAULT_FIT if n != "gemm_efficiency")

    names = [r.name for r in table]
    print(f"{len(rows)} measured runs; predictions of {args.runs} on {args.cluster} (iteration s)")
    print(f"{'ceiling':>8} {'MAPE':>7} " + " ".join(f"{k:>15}" for k in shapes) + " " +
          " ".join(f"{n[:22]:>22}" for n in names))
    for ceiling in [float(x) for x in args.ceilings.split(",")]:
        started = time.perf_counter()
        fit = cal.fit_efficiency(structures, measured, rest, replace(calibration.efficiency, gemm_efficiency=ceiling))
        eff = fit.efficiency
        e = cal.ErrorSummary.of(cal.predict_iteration_s(structures, eff), measured)
        reach = [float(gemm_efficiency(*(np.array([float(x)]) for x in (*mnk, 1)), speed, eff)[0])
                 for mnk in shapes.values()]
        predicted = [p.iteration_s for p in predict_rows(table, target, target_comm, eff)]
        print(f"{ceiling:8.2f} {e.mape:7.2%} " + " ".join(f"{x:15.3f}" for x in reach) + " " +
              " ".join(f"{x:22.3f}" for x in predicted) + f"   ({time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
