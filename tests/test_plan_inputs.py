"""Batch-size ranges, cluster shapes, stage formatting, experiment files, DP baselines."""

from __future__ import annotations

import pytest

from paraplan.core import ConfigError, LayerProfile, ModelProfile
from paraplan.plan.baselines import accumulation_steps, data_parallel_estimates
from paraplan.plan.comm_constants import DappleConstantsModel
from paraplan.plan.experiment import load_plan_experiment
from paraplan.plan.inputs import parse_cluster_shape, parse_gbs_list, parse_gbs_range
from paraplan.plan.problem import MemorySettings, PlanProblem
from paraplan.plan.records import PlannedStage, format_stages


def test_gbs_range_of_the_dapple_sweep():
    sizes = parse_gbs_range("32:4096:64")
    assert len(sizes) == 65
    assert sizes[:4] == [32, 64, 128, 192] and sizes[-1] == 4096


def test_gbs_range_edges():
    assert parse_gbs_range("64:256:64") == [64, 128, 192, 256]
    assert parse_gbs_range("10:10:5") == [10]
    with pytest.raises(ConfigError, match="gbs-range"):
        parse_gbs_range("32:16:8")
    with pytest.raises(ConfigError, match="A:B:S"):
        parse_gbs_range("32-4096")
    assert parse_gbs_list("128,32,64,32") == [32, 64, 128]
    with pytest.raises(ConfigError, match="'gbs'"):
        parse_gbs_list("32,x")


def test_cluster_shape():
    assert parse_cluster_shape("2x8") == (2, 8)
    assert parse_cluster_shape("16X1") == (16, 1)
    with pytest.raises(ConfigError, match="NODESxDEVICES"):
        parse_cluster_shape("16")


def test_stage_format():
    stages = (PlannedStage(0, 96, tuple(range(15))), PlannedStage(97, 175, (15,)))
    assert format_stages(stages) == "[0-96]x15 | [97-175]x1"


def test_dapple_experiment_file(repo_root):
    exp = load_plan_experiment(repo_root / "config/experiments/dapple_resnet50.yaml")
    assert exp.layouts == ((2, 8), (16, 1))
    assert len(exp.batch_sizes) == 65
    assert (exp.pbs, exp.mbs, exp.optimizer_factor) == (32, 32, 2.0)
    assert exp.peak_activation_bytes_per_sample == 7e7


def test_experiment_unknown_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nprofile: p.txt\nlayouts: [2x8]\ngbs: [32]\nbatch: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:batch"):
        load_plan_experiment(path)


def _resnet_like(param_bytes: float) -> ModelProfile:
    layers = tuple(LayerProfile(f"l{i}", 1e-3, 2e-3, 1e6, param_bytes / 4) for i in range(4))
    return ModelProfile("m", 32, layers)


def test_accumulation_follows_memory():
    # DAPPLE's ResNet-50: (16e9 - 2 x 102.2 MB) / 7e7 = 225 samples fit one GPU
    profile = _resnet_like(102.2e6)
    from paraplan.clusters import load_cluster

    cluster = load_cluster("dgx1-v100")
    memory = MemorySettings(16e9, 2.0, 7e7)
    problem = PlanProblem(profile, cluster, DappleConstantsModel(), memory, 16 * 225, 32)
    assert problem.max_samples_per_device() == 225
    assert accumulation_steps(problem) == 1
    bigger = PlanProblem(profile, cluster, DappleConstantsModel(), memory, 16 * 226, 32)
    assert accumulation_steps(bigger) == 2


def test_data_parallel_no_overlap_closed_form():
    from paraplan.clusters import load_cluster

    profile = _resnet_like(1e9)
    cluster = load_cluster("dgx1-v100")  # 2 x 8: the all-reduce crosses machines at 3 GB/s
    problem = PlanProblem(profile, cluster, DappleConstantsModel(), MemorySettings(16e9, 2.0, None), 512, 32)
    est = data_parallel_estimates(problem)
    compute = 4 * 3e-3 * (512 / 16) / 32
    assert est.no_overlap_s == pytest.approx(compute + 2 * 15 / 16 * 1e9 / 3e9)
    assert est.p3_s <= est.overlap_s <= est.no_overlap_s
    assert est.single_device_s == pytest.approx(4 * 3e-3 * 512 / 32)
