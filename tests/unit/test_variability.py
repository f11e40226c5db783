"""GPU-to-GPU speed variability (paraplan.predict.variability): a synchronous job of N GPUs
computes at its slowest GPU's pace, 1 + cv x E[max of N standard normals] times an average
GPU's compute-bound time, with cv measured by per-GPU GEMM micro-benchmarks on Perlmutter's
A100s (data/published/gpu_variability/, docs/accuracy-at-scale.md)."""

import csv
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from paraplan.cli.main import main
from paraplan.clusters import cluster_from_dict, load_cluster
from paraplan.core import ConstantBandwidthModel
from paraplan.core.errors import InputFileError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import run_structure
from paraplan.predict.calibration import load_calibration
from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed, kernel_times_s
from paraplan.predict.explain import PARTS, explain_run
from paraplan.predict.ops import GEMM, MEMORY, Kernels
from paraplan.predict.variability import (
    MEASURED_A100_CV,
    expected_max_std_normal,
    split_jobs,
    straggler_time_factor,
    unpriced_spread_note,
    within_job_cv,
)

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data/published/gpu_variability"


def test_the_log_cdf_matches_scipys_without_importing_it():
    from scipy.special import log_ndtr

    from paraplan.predict.variability import _log_ndtr

    x = np.linspace(-12.0, 12.0, 2401)
    ours = np.array([_log_ndtr(v) for v in x.tolist()])
    assert np.allclose(ours, log_ndtr(x), rtol=1e-13, atol=0)


def test_the_maximum_of_two_standard_normals_is_one_over_root_pi():
    assert expected_max_std_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-9)


def test_the_maximum_of_three_is_three_halves_over_root_pi():
    assert expected_max_std_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-9)


@pytest.mark.parametrize("n,tabulated", [(1, 0.0), (4, 1.0293753730), (5, 1.1629644736), (10, 1.5387527308),
                                         (100, 2.5075936064)])
def test_expected_maxima_match_the_tables_of_normal_order_statistics(n, tabulated):
    # Teichroew (1956) / Harter (1961) tables of expected normal order statistics
    assert expected_max_std_normal(n) == pytest.approx(tabulated, abs=2e-7)


def test_the_expected_maximum_matches_sampling():
    rng = np.random.default_rng(7)
    sampled = rng.standard_normal((100_000, 64)).max(axis=1)
    assert expected_max_std_normal(64) == pytest.approx(sampled.mean(), abs=4 * sampled.std() / math.sqrt(1e5))


def test_it_grows_like_root_two_log_n_and_stays_below_it():
    sizes = [2, 8, 64, 1024, 16384, 1_000_000]
    e = [expected_max_std_normal(n) for n in sizes]
    bound = [math.sqrt(2 * math.log(n)) for n in sizes]
    assert (np.diff(e) > 0).all()  # more GPUs, a slower slowest one
    assert all(x < b for x, b in zip(e, bound, strict=True))  # E[max] <= sqrt(2 ln n)
    ratio = [x / b for x, b in zip(e, bound, strict=True)]
    assert (np.diff(ratio) > 0).all()  # ... and approaches it
    assert 0.92 < ratio[-1] < 0.93


def test_the_time_factor_is_one_plus_cv_times_the_expected_maximum():
    assert straggler_time_factor(0.02, 2) == pytest.approx(1 + 0.02 / math.sqrt(math.pi), rel=1e-12)
    assert straggler_time_factor(0.01, 1) == 1.0  # a lone GPU is an average one
    assert straggler_time_factor(0.0, 16384) == 1.0
    assert straggler_time_factor(0.01, 16384) == pytest.approx(1.0397135, abs=1e-7)


@pytest.mark.parametrize("call,message", [
    (lambda: expected_max_std_normal(0), "the number of GPUs must be an integer >= 1, got 0"),
    (lambda: straggler_time_factor(-0.01, 8), "gpu_speed_cv must be a finite number >= 0, got -0.01"),
])
def test_bad_arguments_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_within_job_cv_pools_deviations_from_each_jobs_own_mean():
    assert within_job_cv([[1.0, 3.0]]) == pytest.approx(0.5)
    assert within_job_cv([[1.0, 3.0], [2.0, 6.0]]) == pytest.approx(0.5)  # a slower job adds nothing
    assert within_job_cv([[1.0, 3.0], [10.0, 10.0]]) == pytest.approx(math.sqrt(0.5 / 4))


def test_split_jobs_counts_blocks_from_either_end_and_refuses_a_gpu_twice():
    gpus, times = ["a", "b", "c", "a", "b"], [1.0, 2.0, 3.0, 4.0, 5.0]
    assert split_jobs(gpus[:4], times[:4], 2) == [[1.0, 2.0], [3.0, 4.0]]
    assert split_jobs(gpus, times, 2, from_end=True) == [[2.0, 3.0], [4.0, 5.0]]
    with pytest.raises(ValueError, match="rows 3-4: not 2 distinct GPUs"):
        split_jobs(["a", "b", "c", "c"], times[:4], 2)


def _published(name: str, job_gpus: int, from_end: bool) -> list[list[float]]:
    with (DATA / name).open() as f:
        rows = list(csv.DictReader(f))
    return split_jobs([f"{r['Node']}_GPU{r['GPU']}" for r in rows], [float(r["Time"]) for r in rows], job_gpus,
                      from_end)


def test_perlmutter_a100_gemm_times_give_a_cv_of_one_percent():
    jobs64 = _published("perlmutter_a100_bf16_gemm_n32768.csv", 64, from_end=False)
    jobs256 = _published("perlmutter_a100_bf16_gemm_n32768_tail.csv", 256, from_end=True)
    assert (len(jobs64), len(jobs256)) == (11, 2)
    cv = within_job_cv(jobs64 + jobs256)
    assert cv == pytest.approx(0.010015, abs=1e-6)
    # every shipped A100 cluster file states it, rounded to a tenth of a percent
    for name in ("dgx-a100", "dgx-a100-40gb", "vtrain-a100", "oci-bm-gpu4-8"):
        assert load_cluster(name).device.gpu_speed_cv == round(cv, 3) == MEASURED_A100_CV
    # the measured slowest GPU of each job against the model (held out: cv is the spread, not the maxima)
    slowest64 = np.mean([max(j) / np.mean(j) for j in jobs64])
    assert slowest64 == pytest.approx(1.0280, abs=1e-4)
    assert straggler_time_factor(cv, 64) == pytest.approx(1.0235, abs=1e-4)


def test_a_multi_node_job_on_a_device_without_a_measured_spread_is_told_it_is_not_priced():
    h100 = load_cluster("dgx-h100")
    a100 = load_cluster("dgx-a100")
    assert h100.device.gpu_speed_cv == 0  # no H100 measurement of the spread exists (docs/accuracy-at-scale.md)
    note = unpriced_spread_note(h100.device, 16384, h100.devices_per_node)
    # 1 + 0.010 x E[max of 16,384 standard normals] = 1 + 0.010 x 3.971
    assert "slowest of 16,384 GPUs is not priced" in note and "by 4.0%" in note and "gpu_speed_cv" in note
    assert "by 2.3%" in unpriced_spread_note(h100.device, 64, 8)  # E[max of 64] = 2.344
    # one node: nothing to say; a device whose spread is measured: priced, nothing to say
    assert unpriced_spread_note(h100.device, 8, 8) == ""
    assert unpriced_spread_note(a100.device, 16384, a100.devices_per_node) == ""


def test_the_factor_scales_compute_bound_time_only():
    speed = DeviceSpeed(312e12, 2039e9, 108)
    eff = DeviceEfficiency()
    def one(kind: int, flops: float, nbytes: float, mnk: int) -> Kernels:
        dims = np.full(1, float(mnk))
        return Kernels(np.full(1, kind, dtype=np.int8), np.full(1, flops), np.full(1, nbytes), dims, dims, dims,
                       np.ones(1), np.zeros(1, dtype=bool), np.ones(1))

    gemm = one(GEMM, 2 * 8192.0**3, 3 * 2 * 8192.0**2, 8192)
    norm = one(MEMORY, 1e6, 1e9, 0)
    slow = replace(speed, compute_time_factor=1.03)
    latency = eff.kernel_latency_s
    assert kernel_times_s(gemm, slow, eff)[0] - latency == pytest.approx(
        1.03 * (kernel_times_s(gemm, speed, eff)[0] - latency), rel=1e-12)
    assert kernel_times_s(norm, slow, eff)[0] == kernel_times_s(norm, speed, eff)[0]


def _with_cv(cluster, cv: float):
    return replace(cluster, device=replace(cluster.device, gpu_speed_cv=cv))


def test_a_run_is_priced_at_the_slowest_of_its_gpus():
    gpt = TransformerModel("gpt", num_layers=4, hidden_size=2048, num_attention_heads=16, seq_length=2048,
                           vocab_size=51200)
    run = RunSettings(tensor_model_parallel_size=8, pipeline_model_parallel_size=4, data_parallel_size=32,
                      micro_batch_size=1, global_batch_size=128)
    st = run_structure(gpt, run, _with_cv(load_cluster("dgx-a100"), 0.02), ConstantBandwidthModel(100e9, 20e9))
    assert st.speed.compute_time_factor == pytest.approx(1 + 0.02 * expected_max_std_normal(1024), rel=1e-12)
    same = run_structure(gpt, run, _with_cv(load_cluster("dgx-a100"), 0.0), ConstantBandwidthModel(100e9, 20e9))
    assert same.speed.compute_time_factor == 1.0
    shipped = run_structure(gpt, run, load_cluster("dgx-a100"), ConstantBandwidthModel(100e9, 20e9))
    assert shipped.speed.compute_time_factor == pytest.approx(1 + 0.010 * expected_max_std_normal(1024), rel=1e-12)
    h100 = run_structure(gpt, run, load_cluster("dgx-h100"), ConstantBandwidthModel(100e9, 20e9))
    assert h100.speed.compute_time_factor == 1.0  # no published H100 spread: the A100's is not carried over


def test_a_percentage_in_the_cluster_file_is_refused_with_the_key():
    data = yaml.safe_load((REPO / "config/clusters/dgx-a100.yaml").read_text())
    data["device"]["gpu_speed_cv"] = 1
    with pytest.raises(InputFileError) as err:
        cluster_from_dict(data, "x.yaml")
    assert str(err.value).startswith(
        "x.yaml: key 'device.gpu_speed_cv': expected a number >= 0 and <= 0.5, got 1: GPUs of one SKU more than "
        "50% apart in speed; wrong unit? (a fraction: 0.01 = 1%)")


def test_explain_shows_what_the_slowest_gpu_adds():
    gpt = TransformerModel("gpt", num_layers=8, hidden_size=2048, num_attention_heads=16, seq_length=2048,
                           vocab_size=51200)
    run = RunSettings(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, data_parallel_size=2,
                      micro_batch_size=2, global_batch_size=16)
    cal = load_calibration("a100-vtrain")
    a100 = _with_cv(load_cluster("dgx-a100"), 0.010)
    b = explain_run(gpt, run, a100, cal.comm_model(a100), cal.efficiency)
    compute = b.seconds["gemm"] + b.seconds["attention"]
    extra = straggler_time_factor(0.010, 8) - 1  # 8 GPUs: 1.42% of the FLOP-bound time
    assert 0.8 * extra * compute < b.seconds["straggler"] <= extra * compute * (1 + 1e-9)
    assert sum(b.seconds[k] for k in PARTS) == pytest.approx(b.iteration_s, rel=1e-12)
    same = _with_cv(a100, 0.0)
    plain = explain_run(gpt, run, same, cal.comm_model(same), cal.efficiency)
    assert plain.seconds["straggler"] == 0.0
    assert plain.seconds["gemm"] == pytest.approx(b.seconds["gemm"], rel=1e-12)  # one average GPU's GEMMs


def test_predict_names_the_unpriced_spread_of_its_largest_multi_node_job(tmp_path, capsys):
    table = tmp_path / "runs.csv"
    table.write_text("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,"
                     "tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,global_batch_size\n"
                     "one node,4,1024,16,2048,32000,1,1,8,64\nsix nodes,4,1024,16,2048,32000,1,1,48,96\n")
    assert main(["predict", str(table), "--cluster", "dgx-h100", "-o", str(tmp_path / "h.csv"), "--no-track"]) == 0
    err = capsys.readouterr().err
    assert ("paraplan predict: note: H100-SXM5-80GB has no measured GPU-to-GPU speed spread (its cluster file states "
            "no gpu_speed_cv), so the wait for the slowest of 48 GPUs is not priced") in err
    assert main(["predict", str(table), "--cluster", "dgx-a100", "-o", str(tmp_path / "a.csv"), "--no-track"]) == 0
    assert "speed spread" not in capsys.readouterr().err  # the A100's is measured, and priced
