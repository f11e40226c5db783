"""Analytic profiles: closed-form FLOPs and bytes, DistIR's published anchors, and
agreement with the torch models' parameter and activation bytes."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConfigError, Device
from paraplan.profile.analytic import analytic_profile, linear_ops, model_ops
from paraplan.profile.specs import make_spec

DISTIR = Device("distir", peak_flops=1e14, mem_bandwidth_Bps=1.2e12, memory_bytes=16e9)
# DistIR v0.1's own values (data/README.md; docs/distir-cost-model.md)
_ANCHORS = pd.read_csv(Path(__file__).resolve().parents[2] / "data" / "reference" / "distir" / "anchors.csv",
                       dtype={"cost_model": str})
ANCHORS_V01 = {r["quantity"]: float(r["value"]) for r in _ANCHORS.to_dict("records") if r["cost_model"] == "v0.1"}


def test_linear_flops_are_the_closed_form():
    fwd, bwd = linear_ops(m=32, k=100, n=10, e=4, bias=True)
    assert sum(op.flops for op in fwd) == 2 * 32 * 100 * 10 + 32 * 10
    assert sum(op.flops for op in bwd) == 4 * 32 * 100 * 10 + 32 * 10


def test_mlp_flops_and_bytes_are_the_closed_form():
    spec = make_spec("mlp", {"layers": 3, "input_dim": 20, "hidden_dim": 30, "output_dim": 5})
    ops = model_ops(spec, batch=8)
    dims = [(20, 30), (30, 30), (30, 5)]
    # Linear 2 b k n, bias b n, ReLU b n
    assert [lo.fwd_flops for lo in ops] == [2 * 8 * k * n + 2 * 8 * n for k, n in dims]
    assert [lo.param_bytes for lo in ops] == [4 * (k * n + n) for k, n in dims]
    assert [lo.activation_bytes for lo in ops] == [4 * 8 * n for _, n in dims]


def test_distir_sequential_anchor_in_sum_mode():
    # DistIR's Figure 3 program: batch 4096, dim 4096, 64 layers, v0.1 (2 bytes per element
    # in the MatMul memory term); sequential time, MatMul and MatMulGrad as DistIR gives them
    spec = make_spec("mlp", {"layers": 64, "input_dim": 4096, "hidden_dim": 4096, "output_dim": 4096,
                             "bias": False})
    profile = analytic_profile(spec, 4096, DISTIR, "sum", dtype="float16", include_loss=True)
    assert profile.fwd_s.sum() + profile.bwd_s.sum() == pytest.approx(ANCHORS_V01["sequential_s"], abs=1e-9)
    relu_s = 4 * 4096 * 4096 / 1e14
    assert relu_s == pytest.approx(ANCHORS_V01["relu_s"], abs=1e-9)
    assert profile.fwd_s[0] - relu_s == pytest.approx(ANCHORS_V01["matmul_s"], abs=1e-9)
    assert profile.bwd_s[0] - relu_s == pytest.approx(ANCHORS_V01["matmul_grad_s"], abs=1e-9)


def test_roofline_takes_the_larger_of_compute_and_memory():
    spec = make_spec("mlp", {"layers": 1, "input_dim": 4096, "hidden_dim": 4096, "output_dim": 4096,
                             "bias": False})
    layer = analytic_profile(spec, 1, DISTIR, "roofline").layers[0]
    # batch 1: a memory-bound GEMV, then a ReLU over 4096 elements
    gemv = 4 * (4096 + 4096 * 4096 + 4096) / 1.2e12
    relu = 4 * 2 * 4096 / 1.2e12
    assert layer.fwd_s == pytest.approx(gemv + relu, rel=1e-12)


@pytest.mark.parametrize(("name", "settings"), [
    ("mlp", {"layers": 3, "input_dim": 24, "hidden_dim": 40, "output_dim": 8}),
    ("gpt", {"layers": 2, "hidden": 32, "heads": 4, "seq_len": 16, "vocab": 100}),
    ("resnet", {"image_size": 64}),
])
def test_analytic_bytes_match_the_torch_models(name, settings):
    torch = pytest.importorskip("torch")  # the torch models are the measure extra's
    from paraplan.profile.models import build_model

    spec = make_spec(name, settings)
    model = build_model(spec)
    ops = model_ops(spec, batch=2)
    assert [lo.param_bytes for lo in ops] == [
        sum(p.numel() * 4 for p in layer.parameters()) for layer in model.layers]
    x = model.make_input(2, torch.device("cpu"), torch.float32)
    out = []
    with torch.no_grad():
        for layer in model.layers:
            x = layer(x)
            out.append(x.numel() * 4)
    assert [lo.activation_bytes for lo in ops] == out


def test_resnet50_forward_flops_per_sample():
    # ResNet-50 at 224x224: about 4.1 GMACs = 8.2 GFLOP per image (convolutions + FC)
    ops = model_ops(make_spec("resnet"), batch=1)
    assert sum(lo.fwd_flops for lo in ops) / 1e9 == pytest.approx(8.2, rel=0.02)


def test_gpu_clusters_list_float32_peaks(repo_root):
    expected = {"dgx1-v100": 15.7e12, "dgx-a100": 19.5e12, "dgx-h100": 67e12}
    for name, fp32 in expected.items():
        device = load_cluster(repo_root / "config" / "clusters" / f"{name}.yaml").device
        assert device.peak_flops_for("float32") == pytest.approx(fp32)
    a100 = load_cluster(repo_root / "config" / "clusters" / "dgx-a100.yaml").device
    assert a100.peak_flops_for("bfloat16") == pytest.approx(312e12)


def test_unknown_combine_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^config key 'combine': unknown value 'average'; expected one of "
                                          r"roofline, sum$"):
        analytic_profile(make_spec("mlp"), 8, DISTIR, "average")  # type: ignore[arg-type]


def test_distir_corrected_sequential_anchor():
    # 83d7fc3 (4 bytes per element in the MatMul memory term): sequential 285.445 ms
    spec = make_spec("mlp", {"layers": 64, "input_dim": 4096, "hidden_dim": 4096, "output_dim": 4096,
                             "bias": False})
    profile = analytic_profile(spec, 4096, DISTIR, "sum", dtype="float32", include_loss=True)
    assert (profile.fwd_s.sum() + profile.bwd_s.sum()) * 1e3 == pytest.approx(285.445, abs=5e-4)
