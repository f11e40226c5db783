"""Chrome trace JSON and Gantt export of timelines."""

from __future__ import annotations

import itertools
import json

import pytest

from paraplan.plots.gantt import save_gantt
from paraplan.sim import simulate_pipeline, to_chrome_trace


def test_chrome_trace_round_trip():
    tl = simulate_pipeline("1f1b", 4, 8, 1e-3, 2e-3, iterations=2, send_s=1.5e-3)
    trace = json.loads(json.dumps(to_chrome_trace(tl)))
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == tl.num_events == 4 * 16 * 2 + 3 * 16 * 2
    names = {e["name"] for e in slices}
    assert {"F1", "F16", "B1", "B16", "send1", "send16"} <= names
    procs = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert procs == {f"device {d}" for d in range(4)}
    # overlapping sends (1.5 ms > 1 ms forward) are split into lanes: nothing overlaps in a thread
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in slices:
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in itertools.pairwise(spans))
    f1 = next(e for e in slices if e["name"] == "F1" and e["pid"] == 1)
    assert (f1["ts"], f1["dur"]) == pytest.approx((2500.0, 1000.0))  # 1 ms forward + 1.5 ms send


def test_gantt_writes_png_and_pdf(tmp_path):
    tl = simulate_pipeline("zb_h1", 4, 4, 1.0, 2.0)
    paths = save_gantt(tl, tmp_path / "zb")
    assert [p.suffix for p in paths] == [".png", ".pdf"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_chrome_trace_of_a_hybrid_step_has_allreduce_lanes():
    from paraplan.core import (
        Cluster,
        ConstantBandwidthModel,
        Device,
        LayerProfile,
        Link,
        ModelProfile,
        Strategy,
    )
    from paraplan.sim import simulate

    profile = ModelProfile("m", 16, tuple(LayerProfile(f"l{i}", 1e-3, 2e-3, 1e6, 4e6) for i in range(4)))
    cluster = Cluster("c", 1, 8, Device("a", 1e12, 1e12, 1e10), Link(1e10), Link(1e9))
    s = Strategy(data_parallel_size=2, pipeline_model_parallel_size=2, num_microbatches=4, gradient_sync="overlap")
    tl = simulate(profile, cluster, ConstantBandwidthModel(1e10, 1e9), s, 64, grad_bucket_bytes=4e6)
    trace = to_chrome_trace(tl)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == tl.num_events
    # 4 devices x 2 layers' buckets each
    assert sum(e["name"] == "allreduce" for e in slices) == 8
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {"compute", "comm"} <= threads
