"""The plan request: batch-size lists and ranges, cluster shapes, stage formatting,
planning studies (and their 0.1 spelling), DP baselines."""

from __future__ import annotations

import pytest

from paraplan.core import ConfigError, InputFileError, LayerProfile, ModelProfile
from paraplan.plan.hybrid.baselines import accumulation_steps, data_parallel_estimates
from paraplan.plan.hybrid.comm_constants import DappleConstantsModel
from paraplan.plan.hybrid.problem import MemorySettings, PlanProblem
from paraplan.plan.hybrid.records import PlannedStage, format_stages
from paraplan.plan.hybrid.request import ClusterShape, GlobalBatchSizes, PlanRequest
from paraplan.studies.plan import load_plan_study
from paraplan.typed import Source, load


def _sizes(value) -> tuple[int, ...]:
    return GlobalBatchSizes.parse(value).values


def test_global_batch_size_range_of_the_dapple_sweep():
    sizes = _sizes("32:4096:64")
    assert len(sizes) == 65
    assert sizes[:4] == (32, 64, 128, 192) and sizes[-1] == 4096


def test_global_batch_size_ranges_and_lists():
    assert _sizes("64:256:64") == (64, 128, 192, 256)
    assert _sizes("10:10:5") == (10,)
    with pytest.raises(ValueError, match=r"^expected 1 <= A <= B and S >= 1 in A:B:S, got '32:16:8'$"):
        _sizes("32:16:8")
    with pytest.raises(ValueError, match=r"^expected A:B:S with three integers, got '32:4096'$"):
        _sizes("32:4096")
    assert _sizes("128,32,64,32") == (32, 64, 128)
    assert _sizes([128, 32]) == (32, 128)
    with pytest.raises(ValueError, match=r"^expected a list of integers >= 1 \(32,64,128\) or A:B:S with 1 <= A <= B "
                                         r"and S >= 1, got '32,x'$"):
        _sizes("32,x")


def test_cluster_shape():
    assert ClusterShape.parse("2x8") == ClusterShape(2, 8)
    assert ClusterShape.parse("16X1") == ClusterShape(16, 1)
    assert str(ClusterShape(2, 8)) == "2x8"
    with pytest.raises(ValueError, match=r"^expected NODESxDEVICES such as 2x8 or 16x1, got '16'$"):
        ClusterShape.parse("16")


def test_request_from_the_command_line_names_the_option():
    request = load(PlanRequest, {"global_batch_sizes": "32,64", "shapes": "2x8,16x1",
                                 "model_state_factor": "4"}, Source.command_line())
    assert request.global_batch_sizes == GlobalBatchSizes((32, 64))
    assert request.shapes == (ClusterShape(2, 8), ClusterShape(16, 1))
    assert request.model_state_factor == 4.0
    with pytest.raises(ConfigError, match=r"^option --min-micro-batch-size: expected an integer >= 1, got '0'$"):
        load(PlanRequest, {"min_micro_batch_size": "0"}, Source.command_line())


def test_stage_format():
    stages = (PlannedStage(0, 96, tuple(range(15))), PlannedStage(97, 175, (15,)))
    assert format_stages(stages) == "[0-96]x15 | [97-175]x1"


def test_dapple_study_file(repo_root):
    study = load_plan_study(repo_root / "config/studies/plan/dapple_resnet50.yaml")
    assert study.shapes == (ClusterShape(2, 8), ClusterShape(16, 1))
    assert study.global_batch_sizes is not None and len(study.global_batch_sizes.values) == 65
    assert (study.profile_batch_size, study.min_micro_batch_size, study.model_state_factor) == (32, 32, 2.0)
    assert study.peak_activation_bytes_per_sample == 7e7 and study.memory_GB == 16


def test_a_0_1_study_still_loads_with_a_deprecation_line(tmp_path, capsys):
    old = tmp_path / "old.yaml"
    (tmp_path / "p.txt").write_text("")  # a study's profile is read beside it (paraplan.studies.paths)
    old.write_text("name: x\nstage: plan\nprofile: p.txt\npbs: 32\nmbs: 32\noptimizer_factor: 2\nmemory_gb: 16\n"
                   "cluster_file: dgx1-v100\nlayouts: [2x8, 16x1]\ngbs_range: '32:4096:64'\n")
    study = load_plan_study(old)
    err = capsys.readouterr().err
    assert "'gbs_range' is deprecated, use 'global_batch_sizes'" in err and "'pbs' is deprecated" in err
    new = PlanRequest(profile=study.profile, profile_batch_size=32, min_micro_batch_size=32,
                      model_state_factor=2.0, memory_GB=16.0, cluster="dgx1-v100",
                      shapes=(ClusterShape(2, 8), ClusterShape(16, 1)),
                      global_batch_sizes=GlobalBatchSizes.from_range("32:4096:64"))
    assert all(getattr(study, k) == getattr(new, k) for k in new.__dataclass_fields__)


def test_study_unknown_key_names_the_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nprofile: p.txt\nshapes: [2x8]\nglobal_batch_sizes: [32]\nbatch: 3\n")
    with pytest.raises(InputFileError, match=r"bad.yaml: key 'batch': unknown key; expected one of profile, "):
        load_plan_study(path)


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


def test_plan_help_says_the_cluster_is_required_with_a_model(capsys):
    from paraplan.cli.main import main

    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(a layer profile's default: dgx1-v100; required with --model)" in text
    assert "(default: dgx1-v100)" not in text


def test_a_plan_slower_than_one_device_says_why():
    """Issue 21: a profile plan below the profile's batch reported a "best" plan at a
    fraction of one device without a word."""
    import math

    from paraplan.plan.hybrid.sweep import PlanRow, slower_than_one_device

    def row(gbs, best):
        return PlanRow(gbs=gbs, dp_no_overlap=best, dp_p3=best, dp_overlap=best, best_hybrid=best,
                       stages="[0-24]x16", planning_time_s=0.0, dp_no_overlap_est=best, dp_p3_est=best,
                       dp_overlap_est=best, best_hybrid_est=best)

    assert slower_than_one_device(row(16, 0.38), 32) == (
        "gbs 16: the best plan ([0-24]x16) runs at 0.38x one device, slower than one device: the global batch is "
        "below the profile's batch size (32), so each device computes a few samples (their times scaled down "
        "linearly from the profile) and exchanging gradients costs more than it saves; plan global batches >= 32, "
        "or profile at a smaller batch")
    assert slower_than_one_device(row(64, 0.5), 32).endswith(
        "slower than one device: exchanging gradients and activations costs more than splitting the compute saves "
        "at this batch")
    assert slower_than_one_device(row(64, 1.5), 32) is None
    assert slower_than_one_device(row(8, math.nan), 32) is None


def test_the_plan_command_warns_below_the_profile_batch(data_dir, tmp_path, capsys):
    from paraplan.cli.main import main

    assert main(["plan", "--profile", str(data_dir / "pipedream-profiles/vgg-19-pbs-32.txt"), "--cluster",
                 "dgx1-v100", "--shapes", "2x8", "--global-batch-sizes", "16,64", "-o", str(tmp_path / "p.csv"),
                 "--no-track"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and warnings[0].startswith("paraplan plan: warning: gbs 16: the best plan (")
    assert "below the profile's batch size (32)" in warnings[0]
