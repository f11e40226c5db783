"""Schedules against the reference Gantt charts in tests/data/seed001_schedules.json and
the closed forms of docs/pipeline-schedules.md (unit costs, free communication)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from paraplan.core import SCHEDULES, StrategyError
from paraplan.core.timeline import KINDS
from paraplan.sim import PipelineCosts, execute, get_schedule, inflight_peak, simulate_pipeline
from paraplan.sim.schedules import distir_greedy_rounds

SEED001 = json.loads((Path(__file__).parents[1] / "data" / "seed001_schedules.json").read_text())["cases"]


def _case_id(case: dict) -> str:
    return f"{case['schedule']}-b{case['batch_size']}-it{case['iterations']}"


def _blocks(stage_line: str) -> list[tuple[str, int, float]]:
    out = []
    for token in stage_line.split():
        label, start = token.split("@")
        out.append((label[0], int(label[1:]), float(start)))
    return out


def _asap_reference(orders, fwd: float, bwd: float) -> dict[tuple[int, str, int], float]:
    """Independent as-soon-as-possible run of per-stage orders: repeated sweeps until
    every op is placed (slow and obvious, unlike the engine's work list)."""
    p = len(orders)
    labels = [o.labels() for o in orders]
    start: dict[tuple[int, str, int], float] = {}
    end: dict[tuple[int, str, int], float] = {}
    pos, clock = [0] * p, [0.0] * p
    while any(pos[s] < len(labels[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while pos[s] < len(labels[s]):
                kind, mb = labels[s][pos[s]][0], int(labels[s][pos[s]][1:])
                if kind == "F":
                    deps = [(s - 1, "F", mb)] if s > 0 else []
                else:
                    deps = [(s, "F", mb)] + ([(s + 1, "B", mb)] if s < p - 1 else [])
                if any(d not in end for d in deps):
                    break
                t0 = max([clock[s], *[end[d] for d in deps]])
                start[(s, kind, mb)] = t0
                clock[s] = end[(s, kind, mb)] = t0 + (fwd if kind == "F" else bwd)
                pos[s] += 1
                progressed = True
        assert progressed, "reference run deadlocked"
    return start


@pytest.mark.parametrize("case", SEED001, ids=_case_id)
def test_seed001_orders_makespan_and_asap_starts(case):
    """Each reference chart: same per-stage order, same makespan, and block starts
    equal to ASAP execution of that order (never later than the chart's)."""
    p, m, it = case["stages"], case["batch_size"] // case["micro_batch_size"], case["iterations"]
    orders = get_schedule(case["schedule"]).orders(p, m, it)
    seed_blocks = [_blocks(line) for line in case["stage_blocks"]]
    for s in range(p):
        assert orders[s].labels() == [f"{k}{mb}" for k, mb, _ in seed_blocks[s]]
    run = execute(orders, PipelineCosts.uniform(p, 1.0, 2.0), m * it)
    assert run.makespan_s == case["makespan"]
    ref = _asap_reference(orders, 1.0, 2.0)
    letters = np.array(["F", "B"])[run.kind]
    got = {(int(d), str(k), int(mb)): float(t)
           for d, k, mb, t in zip(run.device, letters, run.microbatch, run.start_s, strict=True)}
    assert got == ref
    seed_start = {(s, k, mb): t for s in range(p) for k, mb, t in seed_blocks[s]}
    assert all(got[key] <= seed_start[key] for key in got)


def test_seed001_sometimes_starts_later_than_needed():
    """The 1F1B chart places some forwards late; ASAP moves them earlier, same makespan."""
    case = next(c for c in SEED001 if c["schedule"] == "1f1b" and c["batch_size"] == 64)
    orders = get_schedule("1f1b").orders(4, 8, 2)
    run = execute(orders, PipelineCosts.uniform(4, 1.0, 2.0), 16)
    seed = {(s, k, mb): t for s in range(4) for k, mb, t in _blocks(case["stage_blocks"][s])}
    letters = np.array(["F", "B"])[run.kind]
    earlier = sum(seed[(int(d), str(k), int(mb))] > t
                  for d, k, mb, t in zip(run.device, letters, run.microbatch, run.start_s, strict=True))
    assert earlier == 6


@pytest.mark.parametrize(
    ("schedule", "p", "m", "message"),
    [
        ("2bw", 4, 2, "4 stages > 2 micro-batches"),
        ("2bw", 4, 1, "4 stages > 1 micro-batches"),
        ("eager_1f1b_noflush", 4, 4, "4 stages >= 4 micro-batches"),
        ("eager_1f1b_noflush", 4, 2, "4 stages >= 2 micro-batches"),
    ],
)
def test_seed001_rejected_combinations(schedule, p, m, message):
    """Batch 16/8 with micro-batch 8 is what the reference charts refuse for no-flush."""
    with pytest.raises(StrategyError, match=message):
        get_schedule(schedule).orders(p, m, 2)


def test_other_impossible_requests_say_why():
    with pytest.raises(StrategyError, match="divisible by the pipeline degree: 6 micro-batches over 4"):
        get_schedule("interleaved_1f1b").orders(4, 6, 1, 2)
    with pytest.raises(StrategyError, match="needs schedule 'interleaved_1f1b'"):
        get_schedule("1f1b").orders(4, 8, 1, 2)
    with pytest.raises(StrategyError, match="unknown schedule 'pipedream'"):
        get_schedule("pipedream")


def test_registry_covers_core_names():
    assert tuple(get_schedule(n).name for n in SCHEDULES) == SCHEDULES


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "eager_1f1b", "distir_greedy"])
@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 3), (2, 16), (5, 5)])
def test_flushed_iteration_time_closed_form(schedule, p, m):
    """GPipe and 1F1B (and its variants) with p stages and M micro-batches take
    (M + p - 1)(t_f + t_b); bubble fraction (p - 1) / (M + p - 1)."""
    tf, tb = 0.7, 1.3
    tl = simulate_pipeline(schedule, p, m, tf, tb)
    assert tl.step_time_s == pytest.approx((m + p - 1) * (tf + tb))
    assert tl.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 2), (4, 16, 4), (8, 16, 2), (2, 6, 3)])
def test_interleaved_bubble_closed_form(p, m, v):
    """Interleaved 1F1B: bubble / ideal = (p - 1) / (v M) with per-chunk costs t / v."""
    tf, tb = 1.0, 2.0
    tl = simulate_pipeline("interleaved_1f1b", p, m, tf / v, tb / v, virtual_stages=v)
    ideal = m * (tf + tb)
    assert (tl.step_time_s - ideal) / ideal == pytest.approx((p - 1) / (v * m))


@pytest.mark.parametrize(("p", "m", "v"), [(4, 4, 2), (4, 8, 2), (4, 8, 4), (8, 16, 2), (16, 16, 8)])
@pytest.mark.parametrize("c", [0.25, 1.0])
def test_interleaved_transfers_cross_every_virtual_stage(p, m, v, c):
    """Interleaved 1F1B with a transfer c <= min(t_f, t_b) per boundary takes
    (v M + p - 1)(t_f + t_b) + 2 (p v - 1) c: Megatron's groups of p micro-batches per
    chunk give a rank exactly the work of one trip round the p ranks, so the first
    micro-batch's forward waits for every one of the p v - 1 transfers, and the last
    one's backward likewise (docs/pipeline-schedules.md#where-the-interleaved-bubble-goes);
    1F1B's fill and drain wait for 2 (p - 1)."""
    tf, tb = 1.0, 2.0
    tl = simulate_pipeline("interleaved_1f1b", p, m, tf, tb, virtual_stages=v, send_s=c)
    assert tl.step_time_s == pytest.approx((v * m + p - 1) * (tf + tb) + 2 * (p * v - 1) * c)


def test_interleaved_transfers_longer_than_an_op_stall_the_steady_state():
    """Past c = min(t_f, t_b) the transfers no longer fit in the ring's slack: p = 4,
    v = 2, M = 8, t_f = 1, t_b = 2 and c = 1.5 take 80 time units where the closed form
    gives (16 + 3) 3 + 14 x 1.5 = 78."""
    tl = simulate_pipeline("interleaved_1f1b", 4, 8, 1.0, 2.0, virtual_stages=2, send_s=1.5)
    assert tl.step_time_s == pytest.approx(80.0)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 4), (8, 16), (2, 8)])
def test_zb_h1_bubble_is_a_third_of_1f1b(p, m):
    """ZB-H1 with t_F = t_B = t_W = 1: bubble (p - 1)(t_F + t_B - t_W) = p - 1 per stage,
    a third of 1F1B's 3 (p - 1) with the same costs (backward = B + W = 2)."""
    zb = simulate_pipeline("zb_h1", p, m, 1.0, 2.0, weight_grad_fraction=0.5)
    f1b = simulate_pipeline("1f1b", p, m, 1.0, 2.0)
    assert zb.step_time_s - 3 * m == pytest.approx(p - 1)
    assert f1b.step_time_s - 3 * m == pytest.approx(3 * (p - 1))


@pytest.mark.parametrize("schedule", ["2bw", "eager_1f1b_noflush"])
@pytest.mark.parametrize("iterations", [1, 2, 5])
def test_no_flush_steady_state(schedule, iterations):
    """Without flushes only the first fill is paid: K iterations take
    K M (t_f + t_b) + (p - 1)(t_f + t_b); each further iteration adds M (t_f + t_b)."""
    p, m = 4, 8
    tl = simulate_pipeline(schedule, p, m, 1.0, 2.0, iterations=iterations)
    assert tl.step_time_s * iterations == pytest.approx(3 * m * iterations + 3 * (p - 1))


@pytest.mark.parametrize(
    ("schedule", "v", "expected"),
    [
        ("gpipe", 1, [8, 8, 8, 8]),  # M
        ("1f1b", 1, [4, 3, 2, 1]),  # p - s
        ("2bw", 1, [4, 3, 2, 1]),
        ("eager_1f1b", 1, [7, 5, 3, 1]),  # 2 (p - s - 1) + 1
        ("zb_h1", 1, [4, 4, 4, 4]),  # at most p on every stage (W frees)
        ("interleaved_1f1b", 2, [11, 9, 7, 5]),  # chunks: (v + 1) p - 1 at stage 0
    ],
)
def test_peak_inflight_activations(schedule, v, expected):
    sched = get_schedule(schedule)
    orders = sched.orders(4, 8, 1, v)
    assert inflight_peak(orders, sched.split_backward).tolist() == expected


def test_distir_greedy_rounds():
    """docs/distir-cost-model.md: P = M = 4 gives 14 rounds; stage 0 runs all forwards first."""
    assert len(distir_greedy_rounds(4, 4)) == 14
    orders = get_schedule("distir_greedy").orders(4, 4)
    assert orders[0].labels() == ["F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"]
    assert orders[3].labels() == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]


def test_deadlocking_order_is_an_error():
    from paraplan.sim.schedules import OpOrder

    bad = [OpOrder(np.array([1, 0], dtype=np.int8), np.array([0, 0]), np.array([0, 0])),
           OpOrder(np.array([0, 1], dtype=np.int8), np.array([0, 0]), np.array([0, 0]))]
    with pytest.raises(StrategyError, match="deadlocks: device 0"):
        execute(bad, PipelineCosts.uniform(2, 1.0, 2.0), 1)


def test_transfers_delay_consumers():
    """With a transfer cost c, GPipe takes (M + p - 1)(t_f + t_b) + 2 (p - 1) c."""
    p, m, c = 4, 6, 0.25
    tl = simulate_pipeline("gpipe", p, m, 1.0, 2.0, send_s=c)
    assert tl.step_time_s == pytest.approx((m + p - 1) * 3 + 2 * (p - 1) * c)
    assert (tl.kind == KINDS.index("send")).sum() == 2 * (p - 1) * m  # per boundary, both ways
