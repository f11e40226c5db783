"""Experiment files: validation (errors name the file and key), sweep expansion,
both modes, and the corrected mode's MLP profile."""

from __future__ import annotations

import copy

import pytest
import yaml

from paraplan.core import ConfigError
from paraplan.sim import distir_compat as dc
from paraplan.sim import experiments as ex

SMALL = {
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


def test_design_columns_are_exact():
    assert ex.RESULT_COLUMNS == (
        "experiment", "mode", "series", "D", "T", "P", "microbatches", "schedule", "batch_size",
        "devices", "step_time_s", "throughput", "speedup", "bubble_fraction", "peak_mem_bytes",
    )


@pytest.mark.parametrize("edit,key", [
    (lambda d: d.update(colour="red"), "colour"),
    (lambda d: d["model"].update(width=3), "model.width"),
    (lambda d: d["modes"]["distir-v0.1"].update(bandwith_gbps=1), "modes.distir-v0.1.bandwith_gbps"),
    (lambda d: d["series"][1].update(microbatchs=[2]), "series[1].microbatchs"),
    (lambda d: d["series"][0].update(parallelism="diagonal"), "series[0].parallelism"),
    (lambda d: d["modes"].update(fancy={}), "modes.fancy"),
    (lambda d: d["series"][0].update(devices=[0]), "series[0].devices"),
    (lambda d: d.pop("series"), "series"),
    (lambda d: d["modes"]["corrected"].update(schedule="zigzag"), "modes.corrected.schedule"),
])
def test_experiment_errors_name_the_file_and_key(edit, key):
    data = copy.deepcopy(SMALL)
    edit(data)
    with pytest.raises(ConfigError) as err:
        ex.parse_experiment(data, "config/experiments/small.yaml")
    assert err.value.key == key
    assert "config/experiments/small.yaml" in str(err.value)


def test_shipped_experiment_files_load(repo_root):
    for name in ("distir_fig3", "distir_fig4", "schedules"):
        exp = ex.load_experiment(repo_root / "config/experiments" / f"{name}.yaml")
        assert exp.name == name


def test_sweeps_expand_to_the_published_configurations(repo_root):
    fig3 = ex.load_experiment(repo_root / "config/experiments/distir_fig3.yaml")
    counts = {s.name: len(ex.expand(s)) for s in fig3.series}
    assert counts == {"DP": 20, "DP_overlap": 20, "PP": 20}
    fig4 = ex.load_experiment(repo_root / "config/experiments/distir_fig4.yaml")
    points = ex.expand(fig4.series[0])
    assert len(points) == 111
    per_devices = {}
    for p in points:
        per_devices[p.D * p.T * p.P] = per_devices.get(p.D * p.T * p.P, 0) + 1
    assert per_devices == {1: 1, 2: 7, 4: 18, 8: 33, 16: 52}  # as in the published CSV
    assert all(p.microbatches == 1 for p in points if p.P == 1)
    assert max(p.microbatches for p in points) == 32 and points[0] == ex.Point("grid", 1, 1, 1, 1, 8192)


def test_both_modes_produce_rows_with_every_design_column(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    exp = ex.load_experiment(path)
    result = ex.run_experiment(exp, repeats=2)
    rows = ex.result_rows(result)
    assert len(rows) == 2 * (4 + 4)
    assert all(tuple(r) == ex.RESULT_COLUMNS for r in rows)
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
    profile = ex.mlp_profile(64, 4096, 4096)
    total = float(profile.fwd_s.sum() + profile.bwd_s.sum())
    assert total == pytest.approx(dc.sequential_time_s(dc.MlpProgram(4096, 4096, 64), dc.FIX_83D7FC3), rel=1e-12)
    micro = dc.matmul_s(128, 4096, 4096, dc.FIX_83D7FC3) + 4 * 128 * 4096 / dc.TP_FLOPS
    assert profile.fwd_s_at(128)[0] == pytest.approx(micro, rel=1e-12)


def test_corrected_dp_without_overlap_is_close_to_distir_83d7fc3():
    """Same costs and no overlap: only DistIR's (double-counted) Allgathers differ."""
    mode = ex.CorrectedMode(bandwidth_gbps=4800)
    series = ex.SeriesSpec("DP", "data", (4096,), (32,))
    exp = ex.Experiment("x", "x.yaml", "", ex.ModelSpec("mlp", 64, 4096), {"corrected": mode}, (series,))
    [sim] = ex._run_corrected(exp, mode, [(series, ex.expand(series)[0])])
    assert sim.timeline.speedup == pytest.approx(9.59, rel=0.01)


def test_tensor_shards_read_a_t_th_of_each_weight():
    profile = ex.mlp_profile(8, 1024, 512)
    sharded = ex.tensor_sharded_profile(profile, 4)
    la, sh = profile.layers[3], sharded.layers[3]
    # what the engine computes per shard: fixed + (t - fixed) / T
    per_shard = sh.fwd_fixed_s + (sh.fwd_s - sh.fwd_fixed_s) / 4
    assert per_shard == pytest.approx(la.fwd_s / 4, rel=1e-12)
    assert sh.bwd_fixed_s == pytest.approx(la.bwd_fixed_s / 4)
    assert ex.tensor_sharded_profile(profile, 1) is profile
