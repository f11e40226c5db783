"""Profile planner (`paraplan plan --profile` / `--study`): is the best plan never slower
than a data-parallel baseline, and how fast is the search (a script, not a test).

1. The DAPPLE ResNet-50 study (config/studies/plan/dapple_resnet50.yaml on 2x8: 65 global
   batch sizes 32:4096:64, DAPPLE's constants) run as the command a user types, start-up
   and MLflow tracking (a temporary store) included:
       paraplan plan --study dapple_resnet50 --shapes 2x8 -o DIR
   prints the rows whose simulated best >= every simulated baseline (target 65 of 65)
   and the wall time (target < 10 s on 2 cores). "Before": DAPPLE's own space (pipelines
   and data parallelism synchronising at the end, `gradient_syncs=("end",)`, which is
   what the planner searched before the baselines were candidates), its best candidates
   simulated beside the same baselines.
2. One plan of a 100-layer model on 1024 GPUs (128 x 8), gbs 32768: pipeline copies of at
   most 8 devices, and uncapped (any divisor of 1024) in a child process with a time limit.

    PYTHONPATH=src python benchmarks/bench_plan.py [--profile FILE] [--uncapped-limit-s 200] [--large-only]
"""

from __future__ import annotations

import argparse
import csv
import math
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from paraplan.clusters import load_cluster
from paraplan.core import LayerProfile, ModelProfile
from paraplan.plan.hybrid.baselines import BASELINES
from paraplan.plan.hybrid.comm_constants import DappleConstantsModel
from paraplan.plan.hybrid.problem import MemorySettings, PlanProblem
from paraplan.plan.hybrid.request import GlobalBatchSizes
from paraplan.plan.hybrid.search import NoFeasiblePlanError, plan_hybrid
from paraplan.plan.hybrid.verify import simulate_data_parallel, simulate_plan
from paraplan.profile.pipedream import read_pipedream

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROFILE = REPO / "data/pipedream-profiles/resnet50-pbs-32.txt"
STUDY_SIZES = "32:4096:64"


def _rows_never_slower(path: Path) -> tuple[int, int]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    ok = sum(float(r["best_hybrid"]) >= max(float(r[c]) for c, _ in BASELINES) * (1 - 1e-12) for r in rows)
    return ok, len(rows)


def study_command(profile: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plans"
        cmd = [sys.executable, "-m", "paraplan", "plan", "--study", "dapple_resnet50", "--shapes", "2x8",
               "--profile", str(profile), "-o", str(out)]
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        took = time.perf_counter() - start
        if done.returncode:
            print(done.stdout[-2000:], done.stderr[-2000:])
            raise SystemExit(f"the study command failed ({done.returncode})")
        ok, n = _rows_never_slower(out / "dapple_resnet50__2x8.csv")
    print(f"after:  ResNet-50 DAPPLE study, 2x8: best >= every baseline (simulated) in {ok} of {n} rows; "
          f"whole command {took:.2f} s on {os.cpu_count()} cores (start-up, search, simulation, tracking; "
          f"target < 10 s)\n        {' '.join(cmd[1:])}")


def dapple_space_before(profile_path: Path) -> None:
    """DAPPLE's own space (what the search covered before): its best simulated candidate
    against the simulated baselines, per batch size."""
    profile = read_pipedream(profile_path)
    cluster = load_cluster("dgx1-v100").with_shape(2, 8)
    sizes = list(GlobalBatchSizes.from_range(STUDY_SIZES).values)
    ok = 0
    start = time.perf_counter()
    for gbs in sizes:
        problem = PlanProblem(profile, cluster, DappleConstantsModel(), MemorySettings(16e9, 2.0, 7e7), gbs, 32)
        try:
            plans = plan_hybrid(problem, gradient_syncs=("end",))
        except NoFeasiblePlanError:
            continue
        best = max((s.speedup for p in plans if (s := simulate_plan(problem, p)) is not None), default=math.nan)
        dp = [s.speedup for _, sync in BASELINES if (s := simulate_data_parallel(problem, sync)) is not None]
        ok += bool(dp) and best >= max(dp) * (1 - 1e-12)
    took = time.perf_counter() - start
    print(f"before: DAPPLE's space alone (no gradient overlap, baselines not candidates): best >= every "
          f"baseline in {ok} of {len(sizes)} rows ({took:.2f} s in-process, one core)")


def synthetic_100_layers() -> ModelProfile:
    rng = np.random.default_rng(0)
    layers = tuple(
        LayerProfile(f"block{i}", float(4e-3 * (1 + 0.2 * rng.random())), float(8e-3 * (1 + 0.2 * rng.random())),
                     4e7, 1.2e8)
        for i in range(100)
    )
    return ModelProfile("synthetic100", 8, layers)


def _large_problem(max_pipeline_devices: int) -> PlanProblem:
    cluster = load_cluster("dgx1-v100").with_shape(128, 8)
    return PlanProblem(synthetic_100_layers(), cluster, DappleConstantsModel(), MemorySettings(16e9, 2.0, None),
                       32768, 8, max_pipeline_devices)


def _large_plan(max_pipeline_devices: int, queue) -> None:
    start = time.perf_counter()
    plan = plan_hybrid(_large_problem(max_pipeline_devices))[0]
    queue.put((time.perf_counter() - start, plan.describe(), plan.copies, plan.num_microbatches, plan.speedup))


def large_cluster(max_pipeline_devices: int, limit_s: float) -> None:
    what = f"pipelines of <= {max_pipeline_devices} devices" if max_pipeline_devices else "uncapped"
    queue: mp.Queue = mp.Queue()
    child = mp.Process(target=_large_plan, args=(max_pipeline_devices, queue))
    child.start()
    child.join(limit_s)
    if child.is_alive():
        child.terminate()
        child.join()
        print(f"100 layers on 1024 GPUs (128x8), gbs 32768, {what}: not finished in {limit_s:.0f} s (target < 10 s)")
        return
    took, stages, copies, microbatches, speedup = queue.get()
    print(f"100 layers on 1024 GPUs (128x8), gbs 32768, {what}: {took:.2f} s (target < 10 s); plan {stages} "
          f"x {copies} copies, {microbatches} micro-batches, estimated speedup {speedup:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--uncapped-limit-s", type=float, default=200.0,
                        help="stop the uncapped 100 x 1024 search after this many seconds")
    parser.add_argument("--large-only", action="store_true",
                        help="run only the 100 layers x 1024 GPUs plans (skip the ResNet-50 study)")
    args = parser.parse_args()
    if args.large_only:
        pass
    elif args.profile.is_file():
        study_command(args.profile)
        dapple_space_before(args.profile)
    else:
        print(f"skipping the ResNet-50 study: {args.profile} is absent")
    large_cluster(8, args.uncapped_limit_s)
    large_cluster(0, args.uncapped_limit_s)


if __name__ == "__main__":
    main()
