"""Calibration: a fit recovers the parameters that generated the times; cross-validation
predicts each group from the others; the error summary."""

from dataclasses import replace
from itertools import product

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import run_structure
from paraplan.predict.calibrate import (
    ErrorSummary,
    cross_validate,
    fit_efficiency,
    predict_iteration_s,
)
from paraplan.predict.calibration import Calibration
from paraplan.predict.device_model import DeviceEfficiency

TRUE = DeviceEfficiency(gemm_efficiency=0.7, gemm_k_half=150.0, memory_efficiency=0.6, kernel_latency_s=3e-6,
                        host_kernel_s=20e-6, host_collective_s=40e-6, host_microbatch_s=5e-4)


def structures():
    cluster = load_cluster("dgx-a100")
    comm = Calibration("x", "none", DeviceEfficiency()).comm_model(cluster)
    out, groups = [], []
    for h, layers in ((1024, 4), (2048, 4), (1024, 8)):
        model = TransformerModel(f"h{h}", num_layers=layers, hidden_size=h, num_attention_heads=16, seq_length=512,
                                 vocab_size=8192)
        for t, p, b in product((1, 2, 4), (1, 2), (1, 4)):
            settings = RunSettings(tensor_model_parallel_size=t, pipeline_model_parallel_size=p, micro_batch_size=b,
                                   global_batch_size=8, recompute_granularity="full", dtype="fp16",
                                   use_flash_attn=False)
            out.append(run_structure(model, settings, cluster, comm))
            groups.append(f"h{h}-L{layers}")
    return out, groups


def test_fit_recovers_the_parameters_that_generated_the_times():
    runs, _ = structures()
    measured = predict_iteration_s(runs, TRUE)
    start = replace(TRUE, gemm_efficiency=0.85, memory_efficiency=0.85, host_kernel_s=40e-6)
    fit = fit_efficiency(runs, measured, ("gemm_efficiency", "memory_efficiency", "host_kernel_s"), start)
    assert fit.efficiency.gemm_efficiency == pytest.approx(0.7, rel=1e-3)
    assert fit.efficiency.memory_efficiency == pytest.approx(0.6, rel=1e-3)
    assert fit.efficiency.host_kernel_s == pytest.approx(20e-6, rel=1e-2)
    assert fit.at_bound == ()


def test_cross_validation_predicts_unseen_groups_from_the_others():
    runs, groups = structures()
    measured = predict_iteration_s(runs, TRUE) * np.where(np.array(groups) == "h2048-L4", 1.1, 1.0)
    cv = cross_validate(runs, measured, groups, ("gemm_efficiency", "memory_efficiency"), TRUE)
    assert cv.groups == ("h1024-L4", "h2048-L4", "h1024-L8")
    rel = cv.predicted_s / measured - 1
    held = cv.group_of_run == 1
    # the group measured 10% slower is predicted by fits that never saw it: about 10% fast
    assert np.median(rel[held]) < -0.05
    assert np.abs(rel[~held]).max() < 0.08


def test_error_summary():
    e = ErrorSummary.of(np.array([3.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0]))
    assert (e.mape, e.median_ape, e.max_ape, e.n) == (pytest.approx((2 + 0.5 + 1 / 3) / 3), pytest.approx(0.5),
                                                       pytest.approx(2.0), 3)
    assert e.mean_error == pytest.approx((2 - 0.5 - 1 / 3) / 3)
    assert e.spearman == pytest.approx(-0.5)  # ranks (3, 1, 2) against (1, 2, 3)


def test_a_layer_profile_calibrates_the_device_it_was_taken_on():
    """A GPT profile whose block times come from known efficiencies gives them back."""
    from paraplan.core import LayerProfile, ModelProfile
    from paraplan.predict.profile_fit import layer_times

    cluster = load_cluster("local-cpu")
    comm = Calibration("x", "none", DeviceEfficiency()).comm_model(cluster)
    from paraplan.profile.specs import make_spec, spec_settings

    settings = spec_settings(make_spec("gpt", {"num_layers": 2}))  # what `paraplan profile --model gpt` writes
    truth = replace(TRUE, host_kernel_s=5e-6)
    skeleton = ModelProfile("gpt", 8, tuple(LayerProfile(f"block{i}", 1.0, 1.0, 1.0, 1.0) for i in range(2)),
                            meta={"model": "gpt", "model_settings": settings, "dtype": "float32", "batches": [2, 8]})
    probe = layer_times(skeleton, cluster, comm, "probe")
    seconds = probe.predict(truth, np.arange(len(probe)))
    # the profile stores times at batch 8 and a fixed part such that batch 2 comes out right
    f2, b2, f8, b8 = seconds[0], seconds[1], seconds[4], seconds[5]
    fixed_f, fixed_b = (4 * f2 - f8) / 3, (4 * b2 - b8) / 3
    layers = tuple(LayerProfile(f"block{i}", f8, b8, 1.0, 1.0, fwd_fixed_s=fixed_f, bwd_fixed_s=fixed_b)
                   for i in range(2))
    profile = ModelProfile("gpt", 8, layers, meta=dict(skeleton.meta))
    data = layer_times(profile, cluster, comm, "profile")
    np.testing.assert_allclose(data.measured_s, seconds, rtol=1e-9)
    start = replace(truth, gemm_efficiency=0.9, memory_efficiency=0.9)
    fit = fit_efficiency(data, data.measured_s, ("gemm_efficiency", "memory_efficiency"), start)
    assert fit.efficiency.gemm_efficiency == pytest.approx(0.7, rel=1e-3)
    assert fit.efficiency.memory_efficiency == pytest.approx(0.6, rel=1e-3)


@pytest.mark.parametrize(("settings", "message"), [
    ({"num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 128},
     "meta model_settings: missing 'vocab_size'; expected the gpt profile's settings (num_layers, hidden_size, "
     "num_attention_heads, seq_length, vocab_size)"),
    ({"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024}, None),  # an older profile's names
])
def test_profile_model_settings(settings, message):
    from paraplan.core import InputFileError, LayerProfile, ModelProfile
    from paraplan.predict.profile_fit import profiled_model

    profile = ModelProfile("gpt", 8, (LayerProfile("block0", 1.0, 1.0, 1.0, 1.0),),
                           meta={"model": "gpt", "model_settings": settings, "dtype": "float32"})
    if message is None:
        model, dtype = profiled_model(profile, "p.json")
        assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.seq_length, model.vocab_size,
                dtype) == (2, 256, 4, 128, 1024, "fp32")
        return
    with pytest.raises(InputFileError, match=r"p\.json") as err:
        profiled_model(profile, "p.json")
    assert message in str(err.value)
