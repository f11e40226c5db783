"""Measured layer-time factors: the key, where a factor applies (the layer passes of
that shape only), the fit recovering a factor that generated the times, and the
calibration file's form of them (round trip, bad entries named)."""

import json
from dataclasses import replace

import pytest

from paraplan.clusters import load_cluster
from paraplan.core import InputFileError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict import calibrate
from paraplan.predict.build import kernel_times_by_pass, run_structure
from paraplan.predict.calibrate import (
    IterationTimes,
    fit_efficiency,
    fit_layer_factors,
    fit_with_factors,
    predict_iteration_s,
)
from paraplan.predict.calibration import Calibration, load_calibration
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.layer_factors import LayerTimeFactors, layer_shape_key
from paraplan.predict.models import PRESETS
from paraplan.predict.pass_times import LAYER_PASSES, PASSES, pass_times

TRUE = DeviceEfficiency(gemm_efficiency=0.7, gemm_k_half=150.0, memory_efficiency=0.6, kernel_latency_s=3e-6,
                        host_kernel_s=20e-6, host_collective_s=40e-6, host_microbatch_s=5e-4)
CLUSTER = load_cluster("dgx-a100")
COMM = Calibration("x", "none", DeviceEfficiency()).comm_model(CLUSTER)


def _settings(t=1, p=1, b=1, gbs=8, **kw):
    return RunSettings(tensor_model_parallel_size=t, pipeline_model_parallel_size=p, micro_batch_size=b,
                       global_batch_size=gbs, recompute_granularity="full", dtype="fp16", use_flash_attn=False, **kw)


def _model(layers=4, h=1024):
    return TransformerModel(f"h{h}", num_layers=layers, hidden_size=h, num_attention_heads=16, seq_length=512,
                            vocab_size=8192)


def test_the_key_is_the_layer_shape_not_the_run():
    device = CLUSTER.device.name
    key = layer_shape_key(_model(4), _settings(t=2, b=4), device)
    assert "hidden=1024" in key and "tp=2" in key and "mbs=4" in key and f"device={device}" in key
    # more layers, another pipeline split or data-parallel degree: the same layer kernels
    assert layer_shape_key(_model(12), _settings(t=2, p=2, b=4, gbs=64), device) == key
    assert layer_shape_key(_model(4), _settings(t=2, b=2), device) != key
    assert layer_shape_key(_model(4, 2048), _settings(t=2, b=4), device) != key
    assert layer_shape_key(_model(4), _settings(t=2, b=4), "H100-SXM5-80GB") != key
    assert layer_shape_key(_model(4), _settings(t=2, b=4), device, tp_nodes=2) != key


def test_a_factor_scales_the_layer_passes_of_its_shape_only():
    """Device time (kernels and TP collectives) and host time of the layer passes, and
    the layer's weight-gradient kernels; nothing of another shape, nothing else."""
    st = run_structure(_model(), _settings(t=2, p=2, b=2), CLUSTER, COMM)
    other = run_structure(_model(), _settings(t=1, b=2), CLUSTER, COMM)
    assert st.passes[0].blocking_comm_s > 0  # TP all-reduces are part of what is scaled
    table = LayerTimeFactors((st.layer_key,), (1.25,), (3,))
    kernel_s = kernel_times_by_pass([st, other], TRUE)
    for structure, ks, want in ((st, kernel_s[0], 1.25), (other, kernel_s[1], 1.0)):
        plain = pass_times(structure, ks, TRUE)
        scaled = pass_times(structure, ks, replace(TRUE, layer_time_factors=table))
        for j in range(len(PASSES)):
            w = want if j in LAYER_PASSES else 1.0
            assert scaled.device_s[j] == pytest.approx(w * plain.device_s[j])
            assert scaled.host_s[j] == pytest.approx(w * plain.host_s[j])
        assert scaled.layer_weight_grad_s == pytest.approx(want * plain.layer_weight_grad_s)
        assert scaled.head_weight_grad_s == plain.head_weight_grad_s


def test_the_fit_recovers_the_factor_that_generated_the_times(monkeypatch):
    runs = [run_structure(_model(layers), _settings(t=t, p=p, b=b, gbs=16), CLUSTER, COMM)
            for layers in (4, 8) for t in (1, 2) for p in (1, 2) for b in (1, 2, 4)]
    slow = runs[0].layer_key
    truth = LayerTimeFactors((slow,), (1.3,), (1,))
    measured = predict_iteration_s(runs, replace(TRUE, layer_time_factors=truth))
    table = fit_layer_factors(IterationTimes(tuple(runs)), measured, TRUE)
    got = dict(zip(table.keys, table.factors, strict=True))
    assert table.runs[table.keys.index(slow)] == sum(r.layer_key == slow for r in runs) == 4
    assert 1.05 < got[slow] < 1.3  # the prior (an exactly predicted pseudo-run at factor 1) shrinks it
    assert all(abs(f - 1) < 1e-3 for k, f in got.items() if k != slow)
    monkeypatch.setattr(calibrate, "FACTOR_PRIOR_RUNS", 0.0)
    exact = fit_layer_factors(IterationTimes(tuple(runs)), measured, TRUE)
    assert exact.factors[exact.keys.index(slow)] == pytest.approx(1.3, rel=1e-3)
    # the device parameters are fitted as without factors (even from a start that has some)
    start = replace(TRUE, gemm_efficiency=0.8, layer_time_factors=truth)
    fit = fit_with_factors(IterationTimes(tuple(runs)), measured, ("gemm_efficiency",), start)
    alone = fit_efficiency(runs, measured, ("gemm_efficiency",), replace(TRUE, gemm_efficiency=0.8))
    assert fit.efficiency.gemm_efficiency == alone.efficiency.gemm_efficiency
    assert len(fit.efficiency.layer_time_factors) == len(table)


def test_shapes_with_fewer_runs_than_the_minimum_get_no_factor():
    runs = [run_structure(_model(), _settings(b=b), CLUSTER, COMM) for b in (1, 1, 2)]
    table = fit_layer_factors(IterationTimes(tuple(runs)), predict_iteration_s(runs, TRUE) * 1.2, TRUE)
    assert table.keys == ()


def test_an_unmeasured_shape_is_predicted_as_without_factors():
    """Factors measured on small shapes (h <= 2048) never reach another shape: GPT-3 175B
    is priced by the device parameters alone."""
    cal = load_calibration()
    key = layer_shape_key(_model(), _settings(t=8, b=1), CLUSTER.device.name)
    measured = replace(cal.efficiency, layer_time_factors=LayerTimeFactors((key,), (1.2,), (12,)))
    model = PRESETS["gpt3-175b"]
    st = run_structure(model, _settings(t=8, p=16, b=1, gbs=1536), CLUSTER, cal.comm_model(CLUSTER))
    with_table = predict_iteration_s([st], measured)
    without = predict_iteration_s([st], replace(cal.efficiency, layer_time_factors=LayerTimeFactors()))
    assert with_table[0] == without[0]


def test_calibration_file_round_trip_and_bad_entries(tmp_path):
    key = layer_shape_key(_model(), _settings(t=2, b=4), CLUSTER.device.name)
    eff = replace(TRUE, layer_time_factors=LayerTimeFactors((key,), (0.8,), (12,)))
    cal = Calibration("t", CLUSTER.device.name, eff)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(cal.to_dict()))
    back = load_calibration(str(path))
    assert back.efficiency == eff and back.label == cal.label
    assert cal.label != Calibration("t", CLUSTER.device.name, TRUE).label  # the table is part of the digest
    for entries, message in (
        ([{"shape": key, "factor": 3.0, "runs": 2}], r"layer_time_factors\[0\].factor: expected a factor in "
                                                      r"\[0.5, 2.0\], got 3.0"),
        ([{"shape": key, "factor": 1.0, "runs": 0}], r"layer_time_factors\[0\].runs: expected a whole number"),
        ([{"shape": "tp2", "factor": 1.0, "runs": 1}], r"layer_time_factors\[0\].shape: expected a layer shape key"),
        ([{"shape": key, "factor": 1.0, "runs": 1}] * 2, r"layer_time_factors\[1\].shape: layer shape listed twice"),
        ({"x": 1}, r"layer_time_factors: expected a list"),
    ):
        path.write_text(json.dumps({**cal.to_dict(), "layer_time_factors": entries}))
        with pytest.raises(InputFileError, match=r"t\.json: " + message):
            load_calibration(str(path))
