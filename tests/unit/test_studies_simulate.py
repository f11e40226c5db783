"""Simulation studies: the typed file (errors name the file and key; 0.1 names still
load), sweep expansion into strategies, both modes, and the corrected mode's MLP profile."""

from __future__ import annotations

import copy

import pytest
import yaml

from paraplan.core import InputFileError, Strategy
from paraplan.sim import distir_compat as dc
from paraplan.studies import simulate as st
from paraplan.studies.simulate_study import CorrectedMode, Series, SimulateStudy, StudyModel, StudyModes
from paraplan.typed import Source, load

SMALL = {
    "name": "small",
    "model": {"kind": "mlp", "num_layers": 8, "hidden_dim": 256},
    "modes": {"distir-v0.1": {"bandwidth_Gbit_per_s": 200}, "corrected": {"bandwidth_Gbit_per_s": 4800}},
    "series": [
        {"name": "DP", "parallelism": "data", "global_batch_sizes": [64, 128], "devices": [2, 4],
         "distir_sends": "fig3_dp"},
        {"name": "PP", "parallelism": "pipeline", "global_batch_sizes": [128], "devices": [2, 4],
         "num_microbatches": [2, 4], "distir_sends": "fig3_pp"},
    ],
}
OLD_SMALL = {  # the same study in paraplan 0.1's names
    "name": "small",
    "model": {"kind": "mlp", "layers": 8, "dim": 256},
    "modes": {"distir-v0.1": {"bandwidth_gbps": 200}, "corrected": {"bandwidth_gbps": 4800}},
    "series": [
        {"name": "DP", "parallelism": "data", "batch_sizes": [64, 128], "devices": [2, 4],
         "distir_sends": "fig3_dp"},
        {"name": "PP", "parallelism": "pipeline", "batch_sizes": [128], "devices": [2, 4],
         "microbatches": [2, 4], "distir_sends": "fig3_pp"},
    ],
}
FILE = "config/studies/simulate/small.yaml"


def _load(data) -> SimulateStudy:
    return load(SimulateStudy, data, Source.file(FILE))


def test_design_columns_are_exact():
    assert st.RESULT_COLUMNS == (
        "experiment", "mode", "series", "D", "T", "P", "microbatches", "schedule", "batch_size",
        "devices", "step_time_s", "throughput", "speedup", "bubble_fraction", "peak_mem_bytes",
    )


@pytest.mark.parametrize("edit,key,message", [
    (lambda d: d.update(colour="red"), "colour", "unknown key; expected one of name, description, stage"),
    (lambda d: d["model"].update(width=3), "model.width", "unknown key"),
    (lambda d: d["modes"]["distir-v0.1"].update(bandwith_gbps=1), "modes.distir-v0.1.bandwith_gbps", "unknown"),
    (lambda d: d["series"][1].update(microbatchs=[2]), "series[1].microbatchs", "unknown key"),
    (lambda d: d["series"][0].update(parallelism="diagonal"), "series[0].parallelism",
     "expected one of data, tensor, pipeline, grid, got 'diagonal'"),
    (lambda d: d["modes"].update(fancy={}), "modes.fancy", "unknown key; expected one of distir-v0.1, corrected"),
    (lambda d: d["series"][0].update(devices=[0]), "series[0].devices[0]",
     "expected an integer >= 1 and <= 2^20, got 0"),
    (lambda d: d["series"][0].update(devices=[10_000_000]), "series[0].devices[0]",
     "expected an integer >= 1 and <= 2^20, got 10000000: more devices than any machine built"),
    (lambda d: d["series"][0].update(global_batch_sizes=[512.5]), "series[0].global_batch_sizes[0]",
     "expected an integer >= 1 and <= 2^40, got 512.5: not an integer"),
    (lambda d: d["series"][0].update(global_batch_sizes=[None]), "series[0].global_batch_sizes[0]",
     "expected an integer >= 1 and <= 2^40, got None"),
    (lambda d: d["series"][1].update(virtual_pipeline_model_parallel_size=0),
     "series[1].virtual_pipeline_model_parallel_size", "expected an integer >= 1 and <= 65536, got 0"),
    (lambda d: d["series"][1].update(num_microbatches=[10_000_000]), "series[1].num_microbatches[0]",
     "expected an integer >= 1 and <= 16384, got 10000000: training runs use at most a few thousand"),
    (lambda d: d["model"].update(num_layers=1e9), "model.num_layers", "got 1000000000.0: not an integer"),
    (lambda d: d["modes"]["corrected"].update(memory_GB=float("inf")), "modes.corrected.memory_GB",
     "got inf: not a finite number"),
    (lambda d: d.pop("series"), "series", "missing; expected a list of mappings"),
    (lambda d: d["modes"]["corrected"].update(schedule="zigzag"), "modes.corrected.schedule",
     "expected one of gpipe, 1f1b"),
    (lambda d: d["modes"]["corrected"].update(bandwidth_Gbit_per_s=float("nan")),
     "modes.corrected.bandwidth_Gbit_per_s", "not a finite number"),
])
def test_study_errors_name_the_file_key_value_and_what_was_expected(edit, key, message):
    data = copy.deepcopy(SMALL)
    edit(data)
    with pytest.raises(InputFileError) as err:
        _load(data)
    assert str(err.value).startswith(f"{FILE}: key '{key}': ")
    assert message in str(err.value)


def test_a_0_1_study_loads_the_same_with_deprecation_lines(capsys):
    assert _load(copy.deepcopy(OLD_SMALL)) == _load(copy.deepcopy(SMALL))
    err = capsys.readouterr().err
    assert f"{FILE}: key 'series[1]': 'microbatches' is deprecated, use 'num_microbatches'" in err
    assert f"{FILE}: key 'modes.distir-v0.1': 'bandwidth_gbps' is deprecated, use 'bandwidth_Gbit_per_s'" in err
    old = {"name": "x", "model": {"kind": "mlp", "num_layers": 2, "hidden_dim": 8},
           "modes": {"corrected": {"bandwidth_Gbit_per_s": 1, "overlap_grad_allreduce": True,
                                   "device_memory_bytes": 16e9}},
           "series": [{"name": "DP", "parallelism": "data", "global_batch_sizes": [8]}]}
    corrected = _load(old).modes.corrected
    assert corrected is not None and (corrected.gradient_sync, corrected.memory_GB) == ("overlap", 16.0)


def test_shipped_study_files_load(repo_root):
    for name in ("distir_fig3", "distir_fig4", "schedules"):
        study = st.load_study(repo_root / "config/studies/simulate" / f"{name}.yaml")
        assert study.name == name


def test_sweeps_expand_to_the_published_configurations(repo_root):
    fig3 = st.load_study(repo_root / "config/studies/simulate/distir_fig3.yaml")
    counts = {s.name: len(st.expand(s)) for s in fig3.series}
    assert counts == {"DP": 20, "DP_overlap": 20, "PP": 20}
    fig4 = st.load_study(repo_root / "config/studies/simulate/distir_fig4.yaml")
    confs = st.expand(fig4.series[0])
    assert len(confs) == 111
    per_devices: dict[int, int] = {}
    for c in confs:
        per_devices[c.strategy.num_devices] = per_devices.get(c.strategy.num_devices, 0) + 1
    assert per_devices == {1: 1, 2: 7, 4: 18, 8: 33, 16: 52}  # as in the published CSV
    strategies = [c.strategy for c in confs]
    assert all(s.num_microbatches == 1 for s in strategies if s.pipeline_model_parallel_size == 1)
    assert max(s.num_microbatches for s in strategies) == 32
    assert confs[0] == st.Configuration("grid", Strategy(), 8192)


def test_both_modes_produce_rows_with_every_design_column(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    study = st.load_study(path)
    result = st.run_study(study, repeats=2)
    rows = st.result_rows(result)
    assert len(rows) == 2 * (4 + 4)
    assert all(tuple(r) == st.RESULT_COLUMNS for r in rows)
    compat = [r for r in rows if r["mode"] == "distir-v0.1"]
    corrected = [r for r in rows if r["mode"] == "corrected"]
    assert all(r["peak_mem_bytes"] is None for r in compat)  # DistIR models no memory
    assert all(r["peak_mem_bytes"] > 0 for r in corrected)
    assert {r["schedule"] for r in compat if r["P"] > 1} == {"distir_greedy"}
    assert {r["schedule"] for r in corrected if r["P"] > 1} == {"1f1b"}
    for r in rows:
        assert r["throughput"] == pytest.approx(r["batch_size"] / r["step_time_s"])
    assert set(result.simulate_s_by_mode) == {"distir-v0.1", "corrected"}
    assert result.simulate_s == pytest.approx(sum(result.simulate_s_by_mode.values()))


def test_corrected_profile_is_the_physical_distir_mlp():
    """e = 4: the whole MLP on one device takes DistIR 83d7fc3's 285.445 ms, and a
    micro-batch re-reads every weight (the layer's fixed time)."""
    profile = st.mlp_profile(64, 4096, 4096)
    total = float(profile.fwd_s.sum() + profile.bwd_s.sum())
    assert total == pytest.approx(dc.sequential_time_s(dc.MlpProgram(4096, 4096, 64), dc.FIX_83D7FC3), rel=1e-12)
    micro = dc.matmul_s(128, 4096, 4096, dc.FIX_83D7FC3) + 4 * 128 * 4096 / dc.TP_FLOPS
    assert profile.fwd_s_at(128)[0] == pytest.approx(micro, rel=1e-12)


def test_corrected_dp_without_overlap_is_close_to_distir_83d7fc3():
    """Same costs and no overlap: only DistIR's (double-counted) Allgathers differ."""
    mode = CorrectedMode(bandwidth_Gbit_per_s=4800)
    series = Series(name="DP", parallelism="data", global_batch_sizes=(4096,), devices=(32,))
    study = SimulateStudy(name="x", model=StudyModel(kind="mlp", num_layers=64, hidden_dim=4096),
                          modes=StudyModes(corrected=mode), series=(series,))
    [sim] = st._run_corrected(study, mode, [(series, st.expand(series)[0])])
    assert sim.timeline.speedup == pytest.approx(9.59, rel=0.01)


def test_tensor_shards_read_a_t_th_of_each_weight():
    from paraplan.sim import profile_execution

    profile = st.mlp_profile(8, 1024, 512)
    cluster, comm = st.physical_cluster(4, CorrectedMode(bandwidth_Gbit_per_s=4800))

    def fwd_s(t: int, **options) -> float:
        strategy = Strategy(tensor_model_parallel_size=t)
        built = profile_execution(profile, cluster, comm, strategy, 512, tp_allreduces=[0] * 8, **options)
        return float(built.model.costs.fwd_s[0])

    # each shard reads 1/T of the weight (the fixed time) and computes 1/T of the rest
    assert fwd_s(4, conditions=st.SHARDED_WEIGHT_READS) == pytest.approx(profile.fwd_s.sum() / 4, rel=1e-12)
    assert fwd_s(1, conditions=st.SHARDED_WEIGHT_READS) == fwd_s(1)
