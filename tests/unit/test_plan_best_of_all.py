"""The profile planner's whole space (pipelines, one-stage plans in every gradient sync,
the data-parallel baselines): exact against exhaustive enumeration, never slower than a
baseline (estimated and simulated), every reported plan in memory, bad input refused."""

from __future__ import annotations

import math
import random

import pytest

from paraplan.core import Cluster, ConfigError, Device, LayerProfile, Link, ModelProfile
from paraplan.plan.hybrid.baselines import BASELINES, accumulation_steps, baseline_plans
from paraplan.plan.hybrid.comm_constants import DappleConstantsModel
from paraplan.plan.hybrid.problem import MemorySettings, PlanProblem
from paraplan.plan.hybrid.search import enumerate_hybrid, plan_hybrid
from paraplan.plan.hybrid.sweep import PlanSettings, plan_batch


def _profile(rng: random.Random, layers: int, pbs: int = 8, params: float = 3e8) -> ModelProfile:
    return ModelProfile("random", pbs, tuple(
        LayerProfile(f"l{i}", rng.uniform(1e-3, 1e-2), rng.uniform(1e-3, 2e-2),
                     rng.uniform(1e5, 5e7), rng.uniform(0, params))
        for i in range(layers)
    ))


def _cluster(nodes: int, per_node: int, memory_bytes: float = 16e9) -> Cluster:
    return Cluster("test", nodes, per_node, Device("gpu", 1e13, 1e12, memory_bytes), Link(25e9), Link(3e9))


def _problem(seed: int, layers: int, nodes: int, per_node: int, gbs: int, memory: float = 16e9,
             params: float = 3e8, min_micro: int = 1) -> PlanProblem:
    rng = random.Random(seed)
    return PlanProblem(_profile(rng, layers, params=params), _cluster(nodes, per_node, memory),
                       DappleConstantsModel(), MemorySettings(memory, 2.0, None), gbs, min_micro)


# (seed, layers, nodes, devices per node, global batch, memory bytes, parameter bytes per layer up to)
CASES = [
    (1, 6, 1, 4, 32, 16e9, 3e8),
    (2, 7, 2, 2, 16, 16e9, 1e6),  # communication nearly free: data parallelism wins
    (3, 5, 2, 4, 64, 16e9, 5e8),
    (4, 6, 4, 1, 24, 4e9, 3e8),
    (5, 8, 1, 8, 8, 3e9, 2e8),
    (6, 5, 2, 3, 48, 16e9, 1e9),
]


@pytest.mark.parametrize("syncs", [("end",), ("end", "overlap", "p3"), ("p3",)])
@pytest.mark.parametrize(("seed", "layers", "nodes", "per_node", "gbs", "memory", "params"), CASES)
def test_search_equals_enumeration_over_the_whole_space(seed, layers, nodes, per_node, gbs, memory, params, syncs):
    problem = _problem(seed, layers, nodes, per_node, gbs, memory, params)
    best = plan_hybrid(problem, gradient_syncs=syncs)[0]
    reference = enumerate_hybrid(problem, gradient_syncs=syncs)
    assert best.latency_s == pytest.approx(reference.latency_s, rel=1e-12)
    assert best.num_stages > 1 or best.gradient_sync in syncs  # pipelines synchronise at the end


@pytest.mark.parametrize(("seed", "layers", "nodes", "per_node", "gbs", "memory", "params"), CASES)
def test_no_baseline_is_faster_than_the_answer_estimated(seed, layers, nodes, per_node, gbs, memory, params):
    problem = _problem(seed, layers, nodes, per_node, gbs, memory, params)
    best = plan_hybrid(problem)[0]
    for column, plan in baseline_plans(problem).items():
        assert best.latency_s <= plan.latency_s * (1 + 1e-9), column
    # the full space is never worse than DAPPLE's own (end-only) space
    assert best.latency_s <= plan_hybrid(problem, gradient_syncs=("end",))[0].latency_s * (1 + 1e-9)


def test_cheap_communication_answer_is_a_baseline_plan():
    # all-reduces of ~1 MB: data parallelism on every device, one micro-step, overlapped
    problem = _problem(2, 7, 2, 2, 16, 16e9, 1e6)
    best = plan_hybrid(problem)[0]
    assert best.num_stages == 1 and best.stages[0].replicas == 4 and best.num_microbatches == 1
    assert best.describe() == f"[0-6]x4 sync={best.gradient_sync}" and best.gradient_sync in ("overlap", "p3")
    assert best.latency_s == pytest.approx(min(p.latency_s for p in baseline_plans(problem).values()), rel=1e-12)


@pytest.mark.parametrize("gbs", [8, 16, 64])
def test_no_baseline_is_faster_than_the_answer_simulated(gbs):
    problem = _problem(3, 5, 2, 4, gbs, 16e9, 5e8)
    rng = random.Random(3)
    settings = PlanSettings(_profile(rng, 5, params=5e8), problem.cluster, DappleConstantsModel(),
                            MemorySettings(16e9, 2.0, None), 1, verify=True)
    row = plan_batch(settings, gbs)
    baselines = [getattr(row, column) for column, _ in BASELINES]
    assert all(math.isfinite(v) for v in baselines)
    assert row.best_hybrid >= max(baselines) * (1 - 1e-12)
    assert row.stages  # the plan the best speedup belongs to


@pytest.mark.parametrize(("seed", "memory"), [(11, 2.5e9), (12, 4e9), (13, 16e9)])
def test_every_reported_plan_fits_in_memory(seed, memory):
    rng = random.Random(seed)
    profile = _profile(rng, 9)
    settings = MemorySettings(memory, 2.0, None)
    problem = PlanProblem(profile, _cluster(2, 4, memory), DappleConstantsModel(), settings, 32, 1)
    plans = plan_hybrid(problem, candidates=8) + list(baseline_plans(problem).values())
    assert plans
    for plan in plans:
        for s, stage in enumerate(plan.stages):
            first, stop = stage.first_layer, stage.last_layer + 1
            samples = plan.micro_batch_size / (stage.replicas // plan.copies)
            assert samples >= 1
            state = settings.model_state_factor * profile.param_bytes[first:stop].sum()
            act = profile.activation_bytes[first:stop].sum() / profile.batch_size * samples
            inflight = min(plan.num_microbatches, plan.num_stages - s)
            assert state + inflight * act <= settings.memory_bytes, plan.describe()


def test_baselines_accumulate_where_memory_requires():
    # a device holds the model state (2 x 4 x 1e8) and 4 samples of 1e8 bytes: 32 samples
    # on 4 devices take 2 micro-steps of 4
    layers = tuple(LayerProfile(f"l{i}", 1e-3, 2e-3, 1e8 * 8 / 4, 1e8) for i in range(4))
    profile = ModelProfile("m", 8, layers)
    memory = 0.8e9 + 4 * 1e8 + 1
    problem = PlanProblem(profile, _cluster(1, 4, memory), DappleConstantsModel(),
                          MemorySettings(memory, 2.0, None), 32, 1)
    assert accumulation_steps(problem) == 2
    plans = baseline_plans(problem)
    assert sorted(plans) == sorted(column for column, _ in BASELINES)
    assert {p.num_microbatches for p in plans.values()} == {2}
    assert plan_hybrid(problem)[0].latency_s <= min(p.latency_s for p in plans.values()) * (1 + 1e-9)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"candidates": 0}, "candidates"),
    ({"gradient_syncs": ("end", "ring")}, "gradient_syncs"),
    ({"gradient_syncs": ()}, "gradient_syncs"),
])
def test_bad_search_arguments_are_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        plan_hybrid(_problem(1, 6, 1, 4, 32), **kwargs)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"global_batch_size": 0}, "global_batch_size"),
    ({"min_micro_batch_size": 0}, "min_micro_batch_size"),
])
def test_bad_problems_are_errors(kwargs, match):
    rng = random.Random(0)
    base = {"global_batch_size": 8, "min_micro_batch_size": 1}
    base.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        PlanProblem(_profile(rng, 3), _cluster(1, 2), DappleConstantsModel(), MemorySettings(),
                    base["global_batch_size"], base["min_micro_batch_size"])


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"memory_bytes": 0.0}, "memory_GB"),
    ({"model_state_factor": 0.5}, "model_state_factor"),
    ({"peak_activation_bytes_per_sample": -1.0}, "peak_activation_bytes_per_sample"),
])
def test_bad_memory_settings_are_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        MemorySettings(**kwargs)
