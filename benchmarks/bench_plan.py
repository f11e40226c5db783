"""Planner speed (issue 6 targets, 2-core machine):

1. the DAPPLE ResNet-50 sweep: 65 global batch sizes (32:4096:64) on 2 x 8 V100 with
   DAPPLE's constants, baselines + exact hybrid search + simulator re-timing of the
   candidates, over all cores (target < 10 s); also the search alone on one core;
2. one plan of a 100-layer model on 1024 GPUs (128 x 8), pipeline copies of at most
   one machine (8 devices; wider data parallelism replicates the pipeline), target < 10 s.

    python benchmarks/bench_plan.py [--profile ../shared/data/pipedream-profiles/resnet50-pbs-32.txt]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from paraplan.clusters import load_cluster
from paraplan.core import LayerProfile, ModelProfile
from paraplan.plan.comm_constants import DappleConstantsModel
from paraplan.plan.problem import MemorySettings, PlanProblem
from paraplan.plan.request import GlobalBatchSizes
from paraplan.plan.search import plan_hybrid
from paraplan.plan.sweep import PlanSettings, plan_sweep
from paraplan.profile.pipedream import read_pipedream

DEFAULT_PROFILE = Path(__file__).resolve().parents[1].parent / "shared/data/pipedream-profiles/resnet50-pbs-32.txt"


def resnet_sweep(profile_path: Path) -> None:
    profile = read_pipedream(profile_path)
    cluster = load_cluster("dgx1-v100")  # 2 x 8
    settings = PlanSettings(profile, cluster, DappleConstantsModel(), MemorySettings(16e9, 2.0, 7e7), 32)
    sizes = list(GlobalBatchSizes.from_range("32:4096:64").values)
    jobs = os.cpu_count() or 1
    start = time.perf_counter()
    rows = plan_sweep(settings, sizes, jobs)
    full = time.perf_counter() - start
    search_only = PlanSettings(profile, cluster, DappleConstantsModel(), MemorySettings(16e9, 2.0, 7e7), 32,
                               verify=False)
    start = time.perf_counter()
    plan_sweep(search_only, sizes, 1)
    serial = time.perf_counter() - start
    print(f"ResNet-50 sweep, {len(rows)} batch sizes on 2x8: {full:.2f} s with {jobs} processes "
          f"(search + baselines + simulation; target < 10 s, {full / 10:.2f} of it); "
          f"search + baselines alone on 1 core: {serial:.2f} s "
          f"({sum(r.planning_time_s for r in rows) / len(rows) * 1e3:.0f} ms per batch size)")


def synthetic_100_layers() -> ModelProfile:
    rng = np.random.default_rng(0)
    layers = tuple(
        LayerProfile(f"block{i}", float(4e-3 * (1 + 0.2 * rng.random())), float(8e-3 * (1 + 0.2 * rng.random())),
                     4e7, 1.2e8)
        for i in range(100)
    )
    return ModelProfile("synthetic100", 8, layers)


def large_cluster(max_pipeline_devices: int = 8) -> None:
    cluster = load_cluster("dgx1-v100").with_shape(128, 8)
    problem = PlanProblem(synthetic_100_layers(), cluster, DappleConstantsModel(), MemorySettings(16e9, 2.0, None),
                          32768, 8, max_pipeline_devices)
    start = time.perf_counter()
    plan = plan_hybrid(problem)[0]
    took = time.perf_counter() - start
    print(f"100 layers on 1024 GPUs (128x8), gbs 32768, pipelines of <= {max_pipeline_devices} devices: "
          f"{took:.2f} s (target < 10 s, {took / 10:.2f} of it); plan: {plan.num_stages} stages, "
          f"{plan.copies} copies, {plan.num_microbatches} micro-batches, speedup {plan.speedup:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    args = parser.parse_args()
    if args.profile.is_file():
        resnet_sweep(args.profile)
    else:
        print(f"skipping the ResNet-50 sweep: {args.profile} is absent")
    large_cluster()


if __name__ == "__main__":
    main()
