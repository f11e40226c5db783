"""The exact hybrid search against exhaustive enumeration, memory rules, and the
objective's closed forms."""

from __future__ import annotations

import random

import pytest

from paraplan.core import Cluster, Device, Group, LayerProfile, Link, ModelProfile
from paraplan.plan.hybrid import search
from paraplan.plan.hybrid.comm_constants import DappleConstantsModel
from paraplan.plan.hybrid.objective import evaluate_layout, hpgo_latency_s, layout_slots
from paraplan.plan.hybrid.problem import MemorySettings, PlanProblem
from paraplan.plan.hybrid.search import NoFeasiblePlanError, enumerate_hybrid, plan_hybrid


def _profile(rng: random.Random, layers: int, pbs: int = 8) -> ModelProfile:
    return ModelProfile("random", pbs, tuple(
        LayerProfile(f"l{i}", rng.uniform(1e-3, 1e-2), rng.uniform(1e-3, 2e-2),
                     rng.uniform(1e5, 5e7), rng.uniform(0, 3e8))
        for i in range(layers)
    ))


def _cluster(nodes: int, per_node: int, memory_bytes: float = 16e9) -> Cluster:
    return Cluster("test", nodes, per_node, Device("gpu", 1e13, 1e12, memory_bytes), Link(25e9), Link(3e9))


CASES = [  # (layers, nodes, devices per node, global batch, memory bytes)
    (12, 1, 4, 32, 16e9),
    (12, 2, 2, 16, 3e9),
    (8, 2, 4, 16, 16e9),
    (8, 1, 8, 8, 2e9),
    (10, 4, 1, 32, 16e9),
    (6, 2, 4, 64, 1.5e9),
    (7, 2, 3, 24, 16e9),
]


@pytest.mark.parametrize(("layers", "nodes", "per_node", "gbs", "memory"), CASES)
def test_dp_equals_exhaustive_enumeration(layers, nodes, per_node, gbs, memory):
    rng = random.Random(layers * 1000 + nodes * 100 + per_node + gbs)
    problem = PlanProblem(_profile(rng, layers), _cluster(nodes, per_node), DappleConstantsModel(),
                          MemorySettings(memory, 2.0, None), gbs, 1)
    best = plan_hybrid(problem)[0]
    reference = enumerate_hybrid(problem)
    assert best.latency_s == pytest.approx(reference.latency_s, rel=1e-12)
    # the returned plan re-evaluates to its own estimate
    slots = [(s.first_layer, s.last_layer + 1, s.replicas // best.copies) for s in best.stages]
    again = evaluate_layout(problem, best.pipeline_devices, best.num_microbatches, layout_slots(slots),
                            best.strategy.gradient_sync)
    assert again is not None and again.latency_s == pytest.approx(best.latency_s, rel=1e-12)


def test_every_returned_plan_fits_in_memory():
    rng = random.Random(7)
    profile = _profile(rng, 10)
    memory = MemorySettings(2.5e9, 3.0, None)
    problem = PlanProblem(profile, _cluster(2, 4, 2.5e9), DappleConstantsModel(), memory, 32, 1)
    for plan in plan_hybrid(problem, candidates=5):
        num = plan.num_stages
        for s, stage in enumerate(plan.stages):
            first, stop = stage.first_layer, stage.last_layer + 1
            samples = plan.micro_batch_size / (stage.replicas // plan.copies)
            state = memory.model_state_factor * profile.param_bytes[first:stop].sum()
            act = profile.activation_bytes[first:stop].sum() / profile.batch_size * samples
            inflight = min(plan.num_microbatches, num - s)
            assert state + inflight * act <= memory.memory_bytes


def test_memory_forces_a_pipeline():
    # 8 layers of 1 GB parameters: model state 2 x 8 GB does not fit one 10 GB device;
    # a device holds at most 4 layers (8 GB state + activations), so every plan has
    # at least two stages of at most 4 layers
    layers = tuple(LayerProfile(f"l{i}", 1e-3, 2e-3, 1e6, 1e9) for i in range(8))
    profile = ModelProfile("big", 4, layers)
    problem = PlanProblem(profile, _cluster(1, 4, 10e9), DappleConstantsModel(),
                          MemorySettings(10e9, 2.0, None), 16, 1)
    plans = plan_hybrid(problem, candidates=3)
    assert all(p.num_stages >= 2 for p in plans)
    assert all(max(s.last_layer - s.first_layer + 1 for s in p.stages) <= 4 for p in plans)


def test_nothing_fits_is_an_error():
    layers = tuple(LayerProfile(f"l{i}", 1e-3, 2e-3, 1e6, 5e9) for i in range(3))
    problem = PlanProblem(ModelProfile("huge", 4, layers), _cluster(1, 2, 8e9), DappleConstantsModel(),
                          MemorySettings(8e9, 2.0, None), 8, 1)
    message = ("no plan fits in 8 GB per device for global batch 8 on 2 devices (model state 2 x 15 GB of parameters "
               "plus activations); use more devices, a larger --memory-gb or a smaller batch")
    for search_for in (plan_hybrid, enumerate_hybrid):
        with pytest.raises(NoFeasiblePlanError) as err:
            search_for(problem)
        assert str(err.value) == message


def test_hpgo_latency_closed_form():
    # 4 micro-batches, block 1 s, path 3 s, all-reduce 2.5 s on stage 1 hides 1 block
    assert hpgo_latency_s(1.0, 4, 3.0, [0.5, 2.5]) == pytest.approx(3 + 3 + 1.5)
    assert hpgo_latency_s(1.0, 4, 3.0, [0.0, 0.5]) == pytest.approx(6.0)


def test_single_stage_plan_is_data_parallel_with_accumulation():
    # one stage on all devices: latency = M x compute of a micro-batch + all-reduce
    layers = tuple(LayerProfile(f"l{i}", 1e-3, 2e-3, 1e6, 1e8) for i in range(4))
    profile = ModelProfile("m", 8, layers)
    problem = PlanProblem(profile, _cluster(1, 4), DappleConstantsModel(), MemorySettings(), 64, 1)
    plan = evaluate_layout(problem, 4, 2, layout_slots([(0, 4, 4)]))
    compute = 4 * 3e-3 * (32 / 4) / 8  # micro-batch 32 over 4 replicas, per-sample 3e-3/8 per layer
    ar = 2 * 3 / 4 * 4e8 / 25e9 / 2
    assert plan.latency_s == pytest.approx(2 * compute + ar)


def test_dapple_constants():
    m = DappleConstantsModel()
    assert m.time_s("all_reduce", 1e9, Group(8, 1)) == pytest.approx(2 * 7 / 8 * 1e9 / 25e9 / 4)
    assert m.time_s("all_reduce", 1e9, Group(16, 2)) == pytest.approx(2 * 15 / 16 * 1e9 / 3e9)
    assert m.time_s("send_recv", 3e9, Group(2, 2)) == pytest.approx(1.0)
    assert m.time_s("all_reduce", 1e9, Group(1, 1)) == 0.0


def test_paper_form_closed_forms():
    from paraplan.plan.hybrid.objective import paper_latency_s

    # uniform stages, no all-reduce: 1F1B takes (M + S - 1)(F + B)
    assert paper_latency_s([1.0] * 3, [2.0] * 3, 4, [0.0] * 3) == pytest.approx((4 + 3 - 1) * 3.0)
    # its compute part equals HPGO's (M - 1) B + path
    fwd, bwd = [1.0, 3.0, 2.0], [2.0, 5.0, 3.0]
    block = max(f + b for f, b in zip(fwd, bwd, strict=True))
    path = sum(fwd) + sum(bwd)
    assert paper_latency_s(fwd, bwd, 6, [0.0] * 3) == pytest.approx(hpgo_latency_s(block, 6, path, [0.0] * 3))
    # stage 2's all-reduce of 10 s hides behind the backward of stages 0 and 1 (7 s)
    assert paper_latency_s(fwd, bwd, 6, [0.0, 0.0, 10.0]) == pytest.approx(5 * 8 + path + 3.0)


@pytest.mark.parametrize("beam", [0, 1])
@pytest.mark.parametrize(("layers", "nodes", "per_node", "gbs", "memory"), CASES[:4])
def test_heuristic_pass_changes_no_answer(monkeypatch, beam, layers, nodes, per_node, gbs, memory):
    # the beam pass only seeds the incumbent: without it (0) or narrower (1) the best is the same
    rng = random.Random(layers * 1000 + nodes * 100 + per_node + gbs)
    problem = PlanProblem(_profile(rng, layers), _cluster(nodes, per_node), DappleConstantsModel(),
                          MemorySettings(memory, 2.0, None), gbs, 1)
    best = plan_hybrid(problem)[0]
    monkeypatch.setattr(search, "BEAM_WIDTH", beam)
    assert plan_hybrid(problem)[0].latency_s == pytest.approx(best.latency_s, rel=1e-12)
    assert enumerate_hybrid(problem).latency_s == pytest.approx(best.latency_s, rel=1e-12)
