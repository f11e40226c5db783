"""Sanity against the DAPPLE paper on the shared PipeDream profiles (DAPPLE's V100
constants: 16 GB, 25 GB/s inside a machine, 3 GB/s across), and the plan command."""

from __future__ import annotations

import pytest

from paraplan.clusters import load_cluster
from paraplan.plan.comm_constants import DappleConstantsModel
from paraplan.plan.problem import MemorySettings
from paraplan.plan.search import plan_hybrid
from paraplan.plan.sweep import PlanSettings, plan_batch


def _settings(shared_dir, name, shape=(2, 8), peak=None, verify=False):
    from paraplan.profile.pipedream import read_pipedream

    profile = read_pipedream(shared_dir / "data/pipedream-profiles" / f"{name}.txt")
    cluster = load_cluster("dgx1-v100").with_shape(*shape)
    return PlanSettings(profile, cluster, DappleConstantsModel(), MemorySettings(16e9, 2.0, peak),
                        profile.batch_size, verify=verify)


@pytest.mark.parametrize("shape", [(2, 8), (16, 1)])
def test_vgg19_uneven_two_stage_plan(shared_dir, shape):
    # DAPPLE's released plan for VGG-19 on 16 GPUs is 15:1: the convolutions replicated,
    # the 470 MB of fully connected layers on one GPU with no all-reduce
    settings = _settings(shared_dir, "vgg-19-pbs-32", shape)
    plan = plan_hybrid(settings.problem(2048))[0]
    assert plan.num_stages == 2
    assert tuple(s.replicas for s in plan.stages) == (15, 1)
    assert plan.stages[1].first_layer >= 16  # the FC layers (after the last conv) on one GPU


def test_xlnet36_two_stages(shared_dir):
    settings = _settings(shared_dir, "xlnet-36-pbs-1")
    plan = plan_hybrid(settings.problem(2048))[0]
    assert plan.num_stages == 2
    assert 15 <= plan.stages[1].first_layer <= 25  # the paper splits at layer 19 of 42


@pytest.mark.parametrize("name", ["vgg-19-pbs-32", "gnmt-16-pbs-64", "amoeba-18-pbs-8"])
def test_hybrid_beats_every_data_parallel_baseline(shared_dir, name):
    row = plan_batch(_settings(shared_dir, name, verify=True), 128)  # the paper compares at 128
    assert row.best_hybrid > max(row.dp_no_overlap, row.dp_overlap, row.dp_p3)
    assert row.dp_p3 >= row.dp_overlap * (1 - 1e-9)  # P3 is never slower than normal overlap
    assert row.dp_p3 == pytest.approx(row.dp_p3_est, rel=0.05)  # simulated P3 beside its estimate
    assert row.best_hybrid_est > max(row.dp_no_overlap_est, row.dp_overlap_est, row.dp_p3_est)
    assert abs(row.hybrid_est_vs_sim) < 0.25






