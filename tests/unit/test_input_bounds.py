"""Every input crosses one boundary (issue 15): the core types refuse NaN, negative and
infinite numbers; absurd-but-valid values (1e9 samples, 10 million devices, a petabyte
per GPU) are refused or warned with the reason; the planner's and a study's work is
bounded whatever the numbers say."""

from __future__ import annotations

import math
import time

import pytest
import yaml

from paraplan.cli.main import main
from paraplan.core import (
    Cluster,
    ConfigError,
    Device,
    InputFileError,
    LayerProfile,
    Link,
    ModelProfile,
    Strategy,
    StrategyError,
)
from paraplan.core.limits import MAX_NUM_MICROBATCHES
from paraplan.plan.hybrid import verify
from paraplan.plan.hybrid.comm_constants import DappleConstantsModel
from paraplan.plan.hybrid.problem import MemorySettings, PlanProblem, divisors
from paraplan.plan.hybrid.request import PlanRequest
from paraplan.studies.simulate import load_study
from paraplan.typed import Source, load

GPU = Device("gpu", 1e13, 1e12, 16e9)
CLUSTER = Cluster("c", 2, 8, GPU, Link(25e9, 5e-6), Link(3e9, 2e-5))


# ---- the core types -------------------------------------------------------------------


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Device("d", math.nan, 1e12, 16e9), "device 'd': peak_flops must be a finite number > 0, got nan"),
    (lambda: Device("d", 1e13, 0.0, 16e9), "device 'd': mem_bandwidth_Bps must be a finite number > 0, got 0.0"),
    (lambda: Device("d", 1e13, 1e12, math.inf), "device 'd': memory_bytes must be a finite number >= 0, got inf"),
    (lambda: Device("d", 1e13, 1e12, 16e9, launch_overhead_s=-1e-6),
     "device 'd': launch_overhead_s must be a finite number >= 0, got -1e-06"),
    (lambda: Device("d", 1e13, 1e12, 16e9, peak_flops_by_dtype=(("bf16", -1.0),)),
     "device 'd': peak_flops_by_dtype[bf16] must be a finite number > 0, got -1.0"),
    (lambda: Link(math.nan), "link: bandwidth_Bps must be > 0, got nan"),
    (lambda: Link(0.0), "link: bandwidth_Bps must be > 0, got 0.0"),
    (lambda: Link(1e9, -5e-6), "link: latency_s must be a finite number >= 0, got -5e-06"),
    (lambda: Cluster("c", 0, 8, GPU, Link(1e9), Link(1e9)), "nodes and devices_per_node must be integers >= 1"),
    (lambda: Cluster("c", 1.5, 8, GPU, Link(1e9), Link(1e9)), "got 1.5 x 8"),
    (lambda: Cluster("c", 10_000, 1_000, GPU, Link(1e9), Link(1e9)),
     "cluster 'c': 10000 x 1000 devices is above 1,048,576: more devices than any machine built"),
    (lambda: LayerProfile("l", math.nan, 1.0, 0.0, 0.0), "layer 'l': fwd_s must be a finite number >= 0, got nan"),
    (lambda: LayerProfile("l", 1.0, -2.0, 0.0, 0.0), "layer 'l': bwd_s must be a finite number >= 0, got -2.0"),
    (lambda: LayerProfile("l", 1.0, 2.0, 0.0, 0.0, bwd_fixed_s=3.0),
     "layer 'l': bwd_fixed_s 3.0 exceeds bwd_s 2.0; expected fixed <= total"),
    (lambda: LayerProfile("l", 1.0, 2.0, 0.0, 0.0, flops=math.inf), "layer 'l': flops must be a finite number"),
    (lambda: ModelProfile("p", 8.5, (LayerProfile("l", 1.0, 2.0, 0.0, 0.0),)),
     "profile 'p': batch_size must be an integer >= 1, got 8.5"),
])
def test_core_types_refuse_what_no_hardware_or_model_has(make, message):
    with pytest.raises(ValueError) as err:
        make()
    assert message in str(err.value)


def test_an_infinite_link_is_a_free_one():
    assert Link(math.inf, 0.0).transfer_s(1e9) == 0.0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_microbatches": 0}, "num_microbatches must be an integer >= 1, got 0"),
    ({"num_microbatches": 2.5}, "num_microbatches must be an integer >= 1, got 2.5"),
    ({"virtual_pipeline_model_parallel_size": -1}, "virtual_pipeline_model_parallel_size must be an integer >= 1"),
    ({"pipeline_model_parallel_size": 2, "stage_boundaries": (-3,)}, "stage_boundaries must be layer indices >= 1"),
    ({"pipeline_model_parallel_size": 2, "stage_replicas": (1.5, 1)}, "stage_replicas must be >= 1"),
    ({"pipeline_model_parallel_size": 2, "placement": ((0,), (-1,))}, "placement must list device ids"),
])
def test_a_strategy_refuses_negative_and_fractional_numbers(kwargs, message):
    with pytest.raises(StrategyError, match=message.replace("(", r"\(")):
        Strategy(**kwargs)


# ---- the plan request -----------------------------------------------------------------


def _request(**options: str) -> PlanRequest:
    return load(PlanRequest, options, Source.command_line())


@pytest.mark.parametrize(("options", "message"), [
    ({"global_batch_sizes": "2000000000000"},
     "option --global-batch-sizes: expected a global batch size of at most 2^40, got 2,000,000,000,000: "
     "more samples per iteration than any data set holds"),
    ({"global_batch_sizes": "1:100000000:1"},
     "option --global-batch-sizes: '1:100000000:1' holds 100,000,000 batch sizes; expected at most 10,000"),
    ({"global_batch_sizes": "64.5"}, "option --global-batch-sizes: expected a list of integers >= 1"),
    ({"shapes": "10000000x1"},
     "option --shapes (item 1): expected at most 1,048,576 devices, got '10000000x1' (10,000,000): "
     "more devices than any machine built"),
    ({"memory_GB": "1e300"},
     "option --memory-gb: expected a number >= 1e-6 and <= 1000000, got '1e300': above 1 PB per device; "
     "wrong unit? (GB, 1e9 bytes)"),
    ({"memory_GB": "inf"}, "option --memory-gb: expected a number >= 1e-6 and <= 1000000, got 'inf': "
                           "not a finite number"),
    ({"min_micro_batch_size": "-8"}, "option --min-micro-batch-size: expected an integer >= 1, got '-8'"),
    ({"min_micro_batch_size": "1_0"}, "option --min-micro-batch-size: expected an integer >= 1, got '1_0'"),
    ({"candidates": "1000000"}, "option --candidates: expected an integer >= 1 and <= 100, got '1000000': "
                                "each candidate is simulated"),
])
def test_absurd_plan_requests_are_refused_with_the_reason(options, message):
    with pytest.raises(ConfigError) as err:
        _request(**options)
    assert str(err.value).startswith(message)


def test_a_huge_but_valid_global_batch_is_planned_with_a_warning():
    request = _request(global_batch_sizes="64,1000000000")
    (warning,) = request.warnings()
    assert warning.startswith("global batch 1,000,000,000 is above 2^20 samples per iteration, far beyond published "
                              "training runs")
    assert _request(global_batch_sizes="64,4096").warnings() == []


# ---- bounded planning -----------------------------------------------------------------


def test_divisors_are_those_of_trial_division_and_fast_for_2_to_the_40():
    for n in range(1, 400):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    assert divisors(360, 10) == [1, 2, 3, 4, 5, 6, 8, 9, 10]
    start = time.perf_counter()
    assert len(divisors(2**40)) == 41 and len(divisors(963_761_198_400)) == 6720
    assert time.perf_counter() - start < 2.0


def _problem(gbs: int, min_micro_batch_size: int = 1) -> PlanProblem:
    profile = ModelProfile("p", 8, tuple(LayerProfile(f"l{i}", 1e-3, 2e-3, 1e6, 1e6) for i in range(6)))
    comm = DappleConstantsModel(CLUSTER.intra.bandwidth_Bps, CLUSTER.inter.bandwidth_Bps)
    return PlanProblem(profile, CLUSTER, comm, MemorySettings(16e9), gbs, min_micro_batch_size)


def test_microbatch_counts_are_the_divisors_with_big_enough_micro_batches():
    problem = _problem(96, min_micro_batch_size=4)
    for copies in (1, 2, 3, 4, 5, 16):
        expected = ([m for m in range(1, 96 // copies + 1) if (96 // copies) % m == 0 and 96 // copies // m >= 4]
                    if 96 % copies == 0 else [])
        assert problem.microbatch_counts(copies) == expected
    assert problem.pipeline_widths() == [1, 2, 4, 8, 16]


def test_a_huge_batch_searches_at_most_the_micro_batch_bound():
    problem = _problem(10**9)
    counts = problem.microbatch_counts(16)  # 62,500,000 samples per copy
    assert max(counts) <= MAX_NUM_MICROBATCHES and counts[-1] == 15625
    assert problem.microbatch_cap_binds(16) and not _problem(4096).microbatch_cap_binds(1)


@pytest.mark.parametrize("gradient_sync", ["end", "overlap", "p3"])
def test_data_parallel_beyond_the_bound_is_the_simulators_line(monkeypatch, gradient_sync):
    """At 4096 samples per device with room for 1 sample (k = 4096 micro-steps), the
    extrapolation from 3 and 4 micro-steps equals the direct simulation."""
    profile = ModelProfile("p", 8, tuple(LayerProfile(f"l{i}", 1e-3, 2e-3, 1e9, 1e6, 2e-4, 3e-4) for i in range(6)))
    comm = DappleConstantsModel(CLUSTER.intra.bandwidth_Bps, CLUSTER.inter.bandwidth_Bps)
    problem = PlanProblem(profile, CLUSTER, comm, MemorySettings(1e9, 2.0, None), 16 * 4096)
    direct = verify.simulate_data_parallel(problem, gradient_sync)
    monkeypatch.setattr(verify, "MAX_NUM_MICROBATCHES", 8)
    line = verify.simulate_data_parallel(problem, gradient_sync)
    assert direct is not None and line is not None
    assert line.step_time_s == pytest.approx(direct.step_time_s, rel=1e-12)
    assert line.speedup == pytest.approx(direct.speedup, rel=1e-12)
    assert line.peak_mem_bytes == direct.peak_mem_bytes


def test_plan_of_a_billion_samples_ends_in_seconds(data_dir, tmp_path, capsys):
    vgg = data_dir / "pipedream-profiles" / "vgg-19-pbs-32.txt"
    out = tmp_path / "plan.csv"
    start = time.perf_counter()
    code = main(["plan", "--profile", str(vgg), "--global-batch-sizes", "64,1000000000", "-o", str(out),
                 "--jobs", "1", "--no-track"])
    assert code == 0 and time.perf_counter() - start < 60
    err = capsys.readouterr().err
    assert "warning: global batch 1,000,000,000 is above 2^20" in err
    assert "no plan fits" not in err  # the data-parallel baselines are candidates of the search
    rows = out.read_text().splitlines()
    header, big = rows[0].split(","), dict(zip(rows[0].split(","), rows[2].split(","), strict=True))
    assert "stages" in header and big["gbs"] == "1000000000"
    assert 15.9 < float(big["dp_no_overlap"]) <= 16.0  # DP, simulated by extrapolation
    # the answer is the P3 baseline (accumulation far beyond the simulation bound, extrapolated)
    assert big["stages"] == "[0-24]x16 sync=p3" and float(big["best_hybrid"]) == float(big["dp_p3"])


def test_a_huge_batch_with_no_plan_names_the_micro_batch_bound():
    # the model state (2 x 4 x 3 GB) fits no single device (no data parallelism), and at
    # 10^9 samples every micro-batch the search takes (<= 16,384 per copy) is too large
    from paraplan.plan.hybrid.sweep import PlanSettings, plan_batch

    profile = ModelProfile("p", 8, tuple(LayerProfile(f"l{i}", 1e-3, 2e-3, 8e7, 3e9) for i in range(4)))
    comm = DappleConstantsModel(CLUSTER.intra.bandwidth_Bps, CLUSTER.inter.bandwidth_Bps)
    settings = PlanSettings(profile, CLUSTER, comm, MemorySettings(16e9, 2.0, None), verify=False)
    row = plan_batch(settings, 10**9)
    assert row.stages == "" and math.isnan(row.best_hybrid_est)
    assert "no plan fits in 16 GB per device" in row.infeasible
    assert "the search takes at most 16,384 micro-batches per pipeline copy" in row.infeasible


# ---- bounded studies ------------------------------------------------------------------

UNIT_STUDY = {
    "name": "s", "model": {"kind": "unit", "num_layers": 4}, "modes": {"corrected": {}},
    "series": [{"name": "pp", "parallelism": "pipeline", "devices": [4], "global_batch_sizes": [64],
                "micro_batch_size": 8}],
}


def _study_file(tmp_path, edit) -> str:
    data = yaml.safe_load(yaml.safe_dump(UNIT_STUDY))
    edit(data)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["series"][0].update(global_batch_sizes=[10**9], micro_batch_size=1),
     "key 'series[0]': series 'pp' at global batch 1,000,000,000 on 4 devices has 1,000,000,000 micro-batches; "
     "expected at most 16,384"),
    (lambda d: d["series"][0].update(devices=[1024], global_batch_sizes=[8192], micro_batch_size=1),
     "key 'series[0]': series 'pp' at global batch 8,192 on 1,024 devices is 25,165,824 pipeline operations "
     "(3 x stages x micro-batches x chunks x iterations); expected at most 8,388,608 per configuration"),
    # 500 device counts x 400 batch sizes: the bound is on their product (a 200,000-long list took 15 s of YAML)
    (lambda d: d["series"][0].update(devices=list(range(1, 501)), global_batch_sizes=list(range(8, 8 * 401, 8)),
                                     micro_batch_size=8),
     "key 'series[0]': series 'pp' sweeps up to 200,000 configurations; expected at most 100,000 per study"),
    (lambda d: d["series"][0].update(devices=[10_000_000]),
     "key 'series[0].devices[0]': expected an integer >= 1 and <= 2^20, got 10000000: more devices than any "
     "machine built"),
])
def test_a_study_too_big_to_simulate_is_refused_before_it_starts(tmp_path, edit, message):
    path = _study_file(tmp_path, edit)
    with pytest.raises(InputFileError) as err:
        load_study(path)
    assert str(err.value) == f"{path}: {message}" or str(err.value).startswith(f"{path}: {message}")


# ---- YAML at the edge -----------------------------------------------------------------


def _cluster_text(repo_root) -> str:
    return (repo_root / "config" / "clusters" / "dgx1-v100.yaml").read_text()


@pytest.mark.parametrize(("extra", "message"), [
    (b"\nextra: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "not valid YAML: nested too deeply"),
    (b"\n# \xff\n", ":28: byte 0xff at column 3 is not UTF-8"),
    (b"".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n".encode() for i in range(1, 10)),
     "holds more than 1,000,000 values once its aliases are expanded"),
])
def test_bad_yaml_is_one_error_line_and_writes_nothing(repo_root, data_dir, tmp_path, capsys, extra, message):
    text = _cluster_text(repo_root).encode()
    if b"&a" in extra:
        text += b"a0: &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9]\n"
    path = tmp_path / "c.yaml"
    path.write_bytes(text + extra)
    out = tmp_path / "out.csv"
    vgg = data_dir / "pipedream-profiles" / "vgg-19-pbs-32.txt"
    code = main(["plan", "--profile", str(vgg), "--cluster", str(path), "--global-batch-sizes", "64",
                 "-o", str(out), "--no-track"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and not out.exists()
    assert message in err and str(path) in err
