"""Speed of the pipeline engine (target: a 1F1B timeline of 64 stages x 1024
micro-batches under 1 s). Prints best-of-5 wall times; run on a quiet machine.

    python benchmarks/bench_sim_engine.py
"""

from __future__ import annotations

import time

from paraplan.core import (
    Cluster,
    ConstantBandwidthModel,
    Device,
    LayerProfile,
    Link,
    ModelProfile,
    Strategy,
)
from paraplan.sim import PipelineCosts, execute, get_schedule, simulate, simulate_pipeline

TARGET_S = 1.0


def best_of(fn, repeats: int = 5) -> tuple[float, float]:
    """Best wall time and best CPU time (process_time: less sensitive to a loaded machine)."""
    best_wall = best_cpu = float("inf")
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        best_wall = min(best_wall, time.perf_counter() - w0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    return best_wall, best_cpu


def main() -> None:
    p, m = 64, 1024
    rows = []
    orders = get_schedule("1f1b").orders(p, m)
    costs = PipelineCosts.uniform(p, 1.0, 2.0, send_s=0.1)
    rows.append(("1f1b orders only, 64 x 1024", best_of(lambda: get_schedule("1f1b").orders(p, m))))
    rows.append(("1f1b engine only, 64 x 1024", best_of(lambda: execute(orders, costs, m))))
    t_full = best_of(lambda: simulate_pipeline("1f1b", p, m, 1.0, 2.0, send_s=0.1))
    rows.append(("1f1b Timeline (orders+engine+columns), 64 x 1024", t_full))
    for name, v in (("gpipe", 1), ("zb_h1", 1), ("interleaved_1f1b", 2), ("distir_greedy", 1)):
        rows.append((f"{name} Timeline, 64 x 1024" + (f", v={v}" if v > 1 else ""),
                     best_of(lambda n=name, v=v: simulate_pipeline(n, p, m, 1.0 / v, 2.0 / v, virtual_stages=v))))
    layers = tuple(LayerProfile(f"l{i}", 1e-3, 2e-3, 8e6, 32e6) for i in range(128))
    profile = ModelProfile("bench", 1024, layers)
    cluster = Cluster("bench", 64, 8, Device("acc", 1e14, 1e12, 80e9), Link(100e9, 5e-6), Link(25e9, 10e-6))
    comm = ConstantBandwidthModel(100e9, 25e9, 5e-6, 10e-6)
    strategy = Strategy(data_parallel_size=4, tensor_model_parallel_size=2, pipeline_model_parallel_size=64,
                        num_microbatches=1024,
                        gradient_sync="overlap")
    rows.append(("simulate() D4 x T2 x P64, M=1024 (512 devices)",
                 best_of(lambda: simulate(profile, cluster, comm, strategy, 1024 * 16))))
    width = max(len(r[0]) for r in rows)
    print(f"{'best of 5':<{width}}  {'wall':>9}     {'cpu':>9}")
    for label, (wall, cpu) in rows:
        print(f"{label:<{width}}  {wall * 1e3:9.1f} ms  {cpu * 1e3:9.1f} ms")
    wall = t_full[0]
    print(f"target: 1f1b Timeline 64 x 1024 < {TARGET_S:.1f} s -> {wall:.3f} s wall "
          f"({TARGET_S / wall:.1f}x under target)")


if __name__ == "__main__":
    main()
