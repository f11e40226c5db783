"""FP8 training (paraplan.predict.fp8_ops, docs/fp8.md): which GEMMs run in FP8, what
their casts move, the FP8 weight copies in memory, the measured FP8 GEMM ceiling and
the errors for what cannot run."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from paraplan.cli.main import main
from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel
from paraplan.core.errors import InputFileError, StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.kernels.ceilings import KernelCeilings, fp8_ceiling, load_kernel_ceilings
from paraplan.predict import fp8_ops
from paraplan.predict.build import run_structure
from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed, Fp8GemmCeiling, kernel_times_s
from paraplan.predict.edge_ops import head_work
from paraplan.predict.moe_ops import moe_layer_work
from paraplan.predict.ops import FP8_GEMM, GEMM, MEMORY, Kernels, layer_work
from paraplan.predict.runtable import read_run_table

REPO = Path(__file__).resolve().parents[2]
GPT = TransformerModel("gpt", num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                       vocab_size=51200, hidden_dropout=0.0, attention_dropout=0.0)
FP8 = RunSettings(tensor_model_parallel_size=2, micro_batch_size=1, global_batch_size=4, dtype="fp8",
                  fp8_recipe="delayed")
H, F, T, TOKENS = 1024, 4096, 2, 2048  # hidden, ffn, tensor-parallel size, b x s
COMM = ConstantBandwidthModel(100e9, 20e9)


def shapes(kernels, kind):
    keep = kernels.kind == kind
    return sorted(zip(kernels.m[keep], kernels.k[keep], kernels.n[keep], kernels.weight_grad[keep], strict=True))


def test_the_linear_layers_run_in_fp8_and_the_attention_core_and_head_in_16_bits():
    """Forward: QKV (h -> 3h/t), projection (h/t -> h), fc1 (h -> f/t), fc2 (f/t -> h) in
    FP8; the unfused attention core's two batched products in BF16 (2-byte operands)."""
    work = layer_work(GPT, replace(FP8, use_flash_attn=False))
    assert shapes(work.forward.kernels, FP8_GEMM) == sorted([
        (TOKENS, H, 3 * H / T, False), (TOKENS, H / T, H, False), (TOKENS, H, F / T, False),
        (TOKENS, F / T, H, False)])
    fwd = work.forward.kernels
    core = fwd.kind == GEMM
    assert core.sum() == 2 and set(fwd.batch[core]) == {GPT.num_attention_heads / T}
    m, k, n, b = fwd.m[core][0], fwd.k[core][0], fwd.n[core][0], fwd.batch[core][0]
    assert fwd.bytes[core][0] == 2 * (m * k + k * n + m * n) * b
    fp8 = fwd.kind == FP8_GEMM
    qkv = fwd.m[fp8][0], fwd.k[fp8][0], fwd.n[fp8][0]
    assert fwd.bytes[fp8][0] == qkv[0] * qkv[1] + qkv[1] * qkv[2] + 2 * qkv[0] * qkv[2]  # FP8 in, BF16 out
    # backward: an input and a weight gradient per linear layer, all FP8; 4 core GEMMs in BF16
    back = work.backward.kernels
    assert (back.kind == FP8_GEMM).sum() == 8 and (back.weight_grad & (back.kind == FP8_GEMM)).sum() == 4
    assert (back.kind == GEMM).sum() == 4
    head = head_work(GPT, FP8)
    assert not (head.forward.kernels.kind == FP8_GEMM).any() and (head.forward.kernels.kind == GEMM).sum() == 1
    assert not (head.backward.kernels.kind == FP8_GEMM).any()


def test_bf16_runs_have_no_fp8_gemms():
    work = layer_work(GPT, replace(FP8, dtype="bf16", fp8_recipe=""))
    assert not (work.forward.kernels.kind == FP8_GEMM).any()


def test_the_router_stays_in_16_bits_and_the_experts_run_in_fp8():
    moe = replace(GPT, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=512)
    s = replace(FP8, tensor_model_parallel_size=1, expert_model_parallel_size=1)
    fwd = moe_layer_work(moe, s).forward.kernels
    bf16 = fwd.kind == GEMM
    assert list(zip(fwd.k[bf16], fwd.n[bf16], strict=True)) == [(H, 8)]  # router logits
    experts = (fwd.kind == FP8_GEMM) & (fwd.batch == 8)
    assert sorted(zip(fwd.k[experts], fwd.n[experts], strict=True)) == [(512, H), (H, 512)]


@pytest.mark.parametrize(("recipe", "activation", "weight", "kernels", "launches_of_16_splits"), [
    ("delayed", 4.0, 4.0, 1, 1),  # read 2 bytes, write row-wise + transposed FP8; splits fused
    ("tensorwise", 6.0, 6.0, 2, 48),  # + the amax pass reading the tensor first; amax, scale, cast per split
    ("blockwise", 4 + 2 * 4 / 128, 4 + 4 / (128 * 128), 1, 16),  # fp32 scales per 1x128 tile / 128x128 block
    ("mxfp8", 4 + 2 / 32, 4 + 2 / 32, 1, 16),  # one E8M0 byte per 32 elements, each orientation
])
def test_quantise_bytes_per_element_per_recipe(recipe, activation, weight, kernels, launches_of_16_splits):
    cost = fp8_ops.quantise_cost(recipe)
    assert (cost.bytes_per_element, cost.kernels) == (activation, kernels)
    assert cost.launches(np.array([16.0])).tolist() == [launches_of_16_splits]
    assert fp8_ops.quantise_cost(recipe, weight=True).bytes_per_element == pytest.approx(weight, rel=1e-15)


def test_scaling_kernels_of_a_layer_forward_and_backward():
    """Forward: every FP8 GEMM's input cast (tokens x (h + h/t + h + f/t)) and 1/M of
    its weights (h x 3h/t + h/t x h + h x f/t + f/t x h); backward: the output gradient of
    each input-gradient GEMM (tokens x (3h/t + h + f/t + h)); M = 4 micro-batches."""
    work = layer_work(GPT, FP8)
    inputs = TOKENS * (H + H / T + H + F / T)
    weights = H * 3 * H / T + H / T * H + H * F / T + F / T * H
    nbytes, count = fp8_ops.scaling_bytes(work.forward.kernels, "forward", "tensorwise", 4)
    assert (nbytes, count) == (pytest.approx(6 * inputs + 6 * weights / 4), 8)
    nbytes, count = fp8_ops.scaling_bytes(work.forward.kernels, "recompute", "delayed", 4)
    assert (nbytes, count) == (pytest.approx(4 * inputs), 4)
    grads = TOKENS * (3 * H / T + H + F / T + H)
    nbytes, count = fp8_ops.scaling_bytes(work.backward.kernels, "backward", "delayed", 4)
    assert (nbytes, count) == (pytest.approx(4 * grads), 4)
    scaled = fp8_ops.with_scaling(work.forward, "forward", "delayed", 4)
    added = scaled.kernels.kind[len(work.forward.kernels):]
    assert list(added) == [MEMORY] * 4 and scaled.collectives == work.forward.collectives
    assert scaled.kernels.bytes[len(work.forward.kernels):].sum() == pytest.approx(4 * inputs + 4 * weights / 4)


def test_fp8_weight_copies_in_memory_per_rank():
    """Two FP8 bytes (row-wise and transposed) per linear weight on the rank: 4 layers x
    (h 3h + h h + h f + f h) / t, plus the delayed recipe's nothing else; the weights,
    gradients and optimizer state are as in bf16."""
    cluster = load_cluster("dgx-h100")
    bf16 = run_structure(GPT, replace(FP8, dtype="bf16", fp8_recipe=""), cluster, COMM).memory[0]
    fp8 = run_structure(GPT, FP8, cluster, COMM).memory[0]
    linear = GPT.num_layers * (H * 3 * H + H * H + H * F + F * H) / T
    assert fp8.weights_bytes - bf16.weights_bytes == pytest.approx(2 * linear)
    assert fp8.optimizer_bytes == bf16.optimizer_bytes and fp8.gradients_bytes == bf16.gradients_bytes
    mx = fp8_ops.weight_copy_bytes_per_element("mxfp8")
    assert mx == 2 + 2 / 32


def test_fp8_runs_keep_the_linear_inputs_as_fp8_activations():
    """Korthikanti's sbh(34/t ...) terms for the QKV/fc1 inputs (2 x 2 sbh), the
    projection input (2 sbh/t) and the fc2 input (2 x 4 sbh/t) drop to one byte each."""
    bf16 = layer_work(GPT, replace(FP8, dtype="bf16", fp8_recipe="")).activation_bytes
    fp8 = layer_work(GPT, FP8).activation_bytes
    assert bf16 - fp8 == pytest.approx(TOKENS * (2 * H + H / T + F / T))


def test_an_fp8_gemm_is_priced_at_the_measured_fp8_ceiling():
    ceiling = Fp8GemmCeiling(peak_flops=1978.9e12, gemm_efficiency=0.8, gemm_k_half=100.0)
    speed = DeviceSpeed(989.4e12, 3.35e12, 132, ceiling)
    eff = DeviceEfficiency(gemm_efficiency=0.85, gemm_k_half=150.0, kernel_latency_s=4e-6)
    m, k, n = 8192.0, 8192.0, 8448.0  # 64 x 66 tiles = 4,224 = 32 waves of 132 units
    flops = 2 * m * k * n
    kernels = Kernels(np.array([FP8_GEMM, GEMM], dtype=np.int8), np.full(2, flops), np.zeros(2), np.full(2, m),
                      np.full(2, n), np.full(2, k), np.ones(2), np.zeros(2, dtype=bool), np.ones(2))
    fp8_s, bf16_s = kernel_times_s(kernels, speed, eff)
    assert fp8_s == pytest.approx(flops / (1978.9e12 * 0.8 * k / (k + 100)) + 4e-6)
    assert bf16_s == pytest.approx(flops / (989.4e12 * 0.85 * k / (k + 150)) + 4e-6)


def test_h100_fp8_ceiling_agrees_with_the_sustained_loops_and_sits_under_mamf_burst():
    """The H100 FP8 ceiling is fitted on our held, windowed grid (data/measured/h100-sxm5).
    Two measurements it was not fitted on check it: the 20-s sustained loops of 8192^3 on
    the same GPU (split accumulation 1,228 TFLOP/s, fast 1,304: Transformer Engine's mix of
    one fast and two split GEMMs runs at 3 / (1 / 1304 + 2 / 1228) = 1,253), within 6%; and
    MAMF's best published FP8 shape (burst, another H100: 1,402.6 TFLOP/s), which a
    ceiling at the power limit must price slower."""
    import csv

    kernels = load_kernel_ceilings("H100-SXM5-80GB")
    ceiling = fp8_ceiling("H100-SXM5-80GB")
    assert kernels.fp8 is not None and ceiling is not None and ceiling.peak_flops == 1978.9e12
    assert kernels.fp8["fitted"] == ["gemm_efficiency", "gemm_k_half"] and "held" in kernels.fp8
    speed = DeviceSpeed(989.4e12, 3.35e12, 132, fp8_gemm=ceiling)
    eff = DeviceEfficiency(kernel_latency_s=kernels.fp8["params"]["kernel_latency_s"])

    def rate(m: float, n: float, k: float) -> float:
        flops = 2 * m * n * k
        shape = Kernels(np.array([FP8_GEMM], dtype=np.int8), np.array([flops]), np.zeros(1), np.array([m]),
                        np.array([n]), np.array([k]), np.ones(1), np.zeros(1, dtype=bool), np.ones(1))
        return flops / kernel_times_s(shape, speed, eff)[0] / 1e12

    rows = list(csv.DictReader((REPO / "data/measured/h100-sxm5/gemm_sustained_fp8.csv").open()))
    sustained = {r["source"].endswith("fast-accum"): float(r["sustained_tflops"]) for r in rows}
    mix = 3 / (1 / sustained[True] + 2 / sustained[False])
    assert mix == pytest.approx(1252.6, abs=0.1)
    assert rate(8192, 8192, 8192) == pytest.approx(mix, rel=0.06)
    assert rate(8192, 8192, 8192) < mix
    assert rate(1024, 9216, 14336) < 1402.6 * 0.9


def test_fp8_prediction_uses_the_bf16_peak_outside_the_fp8_gemms():
    cluster = load_cluster("dgx-h100")
    speed = run_structure(GPT, FP8, cluster, COMM).speed
    assert speed.peak_flops == 989.4e12 and speed.fp8_gemm is not None
    assert speed.fp8_gemm.peak_flops == 1978.9e12


def test_mxfp8_needs_blackwell():
    with pytest.raises(StrategyError) as err:
        run_structure(GPT, replace(FP8, fp8_recipe="mxfp8"), load_cluster("dgx-h100"), COMM)
    assert str(err.value) == ("fp8_recipe mxfp8 needs MXFP8 tensor cores (Blackwell): device H100-SXM5-80GB lists "
                              "no mxfp8 peak in its cluster file; use delayed, tensorwise or blockwise")


def test_fp8_without_a_measured_ceiling_is_an_error():
    fp8_ops.fp8_gemm_ceiling.cache_clear()
    with pytest.raises(StrategyError) as err:
        run_structure(GPT, FP8, load_cluster("gh200-alps"), COMM)
    assert str(err.value) == (
        "dtype fp8: no measured FP8 GEMM ceiling for device GH200-96GB (config/kernels/GH200-96GB.json has "
        "no fp8 section; fit one from FP8 GEMM micro-benchmarks with `paraplan fit --kind kernels`, docs/fp8.md)")


def test_a_device_of_the_same_compute_takes_the_measured_fp8_ceiling():
    """The H200 (`same_compute_as: H100-SXM5-80GB`) runs FP8 GEMMs at the H100's measured
    ceiling: the same FP8 GEMM speed, its own name and memory."""
    h100, h200 = (run_structure(GPT, FP8, load_cluster(c), COMM) for c in ("dgx-h100", "dgx-h200"))
    assert h200.speed.fp8_gemm == h100.speed.fp8_gemm is not None


def test_fp8_recipe_needs_dtype_fp8():
    with pytest.raises(StrategyError) as err:
        replace(FP8, dtype="bf16").check(GPT)
    assert str(err.value) == "fp8_recipe 'delayed' with dtype bf16: expected empty unless dtype fp8"


def test_the_run_table_names_an_unknown_recipe(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("model,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
                    "global_batch_size,dtype,fp8_recipe\nllama3-8b,1,1,8,8,fp8,current\n")
    with pytest.raises(InputFileError) as err:
        read_run_table(path)
    assert "column 'fp8_recipe'" in str(err.value) and "delayed, tensorwise, blockwise, mxfp8" in str(err.value)


def test_predict_prints_the_default_recipe(tmp_path, capsys):
    path = tmp_path / "runs.csv"
    path.write_text("model,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
                    "global_batch_size,micro_batch_size,dtype,fp8_recipe\nllama3-8b,1,1,8,8,1,fp8,\n"
                    "llama3-8b,1,1,8,8,1,fp8,blockwise\n")
    out = tmp_path / "out.csv"
    assert main(["predict", str(path), "--cluster", "dgx-h100", "-o", str(out), "--no-track"]) == 0
    assert (f"paraplan predict: note: {path}: line(s) 2: dtype fp8 with an empty fp8_recipe runs Megatron-LM's "
            "default recipe, delayed (docs/fp8.md)") in capsys.readouterr().err


def test_a_kernel_file_with_a_bad_fp8_section_is_refused():
    data = json.loads((REPO / "config/kernels/H100-SXM5-80GB.json").read_text())
    data["fp8"]["efficiency"] = {"gemm_efficiency": 0.8}
    with pytest.raises(InputFileError) as err:
        KernelCeilings.from_dict(data, "k.json")
    assert "fp8.efficiency" in str(err.value) and "expected {gemm_efficiency, gemm_k_half}" in str(err.value)
    a100 = load_kernel_ceilings("A100-SXM4-80GB")
    assert a100.fp8 is None and "fp8" not in a100.to_dict()


def test_the_fp8_test_set_converts_to_the_printed_tokens_per_gpu():
    """Every row of NVIDIA's FP8 H100 table, expressible or not: GBS x 8,192 tokens /
    measured_iteration_s / GPUs gives back the printed tokens/s/GPU (70B 25.11: 1,602)."""
    import csv

    with (REPO / "benchmarks/data/megatron_bridge_h100_llama3_fp8.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["published_value"] for r in rows] == ["14451", "1602", "1621", "292", "311"]
    for r in rows:
        tokens = int(r["global_batch_size"]) * int(r["seq_length"])
        assert tokens / float(r["measured_iteration_s"]) / int(r["num_gpus"]) == pytest.approx(
            float(r["published_value"]), rel=1e-5)
        assert r["dtype"] == "fp8" and r["fp8_recipe"] == "tensorwise"  # FP8-CS: current scaling


def test_plan_refuses_a_recipe_without_fp8(tmp_path, capsys):
    out = tmp_path / "plans.csv"
    assert main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size",
                 "64", "--fp8-recipe", "tensorwise", "-o", str(out), "--no-track"]) != 0
    assert ("option --fp8-recipe: applies to --dtype fp8 only, got --dtype bf16"
            in capsys.readouterr().err)
    assert not out.exists()
