"""The Megatron-Bridge MoE test rows as their recipes ran them
(benchmarks/data/megatron_bridge_h100_moe.csv, docs/moe.md) and the FP8 casts of a
grouped GEMM as Transformer Engine launches them (paraplan.predict.fp8_ops)."""

import csv
from pathlib import Path

import numpy as np
import pytest

from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict import fp8_ops
from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed, kernel_times_s
from paraplan.predict.moe_ops import moe_layer_work
from paraplan.predict.ops import FP8_GEMM, KERNEL_FIELDS_ORDER, MEMORY, Kernels

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "benchmarks" / "data" / "megatron_bridge_h100_moe.csv"
H = 1024
MOE = TransformerModel("moe", num_layers=4, hidden_size=H, num_attention_heads=16, seq_length=2048,
                       vocab_size=51200, hidden_dropout=0.0, attention_dropout=0.0, num_experts=128,
                       moe_router_topk=8, moe_ffn_hidden_size=256)
EP8 = RunSettings(micro_batch_size=1, global_batch_size=32, data_parallel_size=8, expert_model_parallel_size=8,
                  dtype="fp8", fp8_recipe="tensorwise")
MICROBATCHES = 4  # 32 / (1 x 8)
LOCAL_EXPERTS = 16  # 128 / EP 8


def rows() -> dict[str, dict[str, str]]:
    with TABLE.open(newline="") as f:
        return {r["name"]: r for r in csv.DictReader(f)}


@pytest.mark.parametrize(("name", "micro_batch_size", "virtual", "cited"), [
    # v0.2.0 GPT_OSS_120B_H100_BF16_BASE_CONFIG: micro_batch_size 1 (the page printed 4, with GA 2)
    ("gpt-oss-120b 25.11", "1", "1", "GPT_OSS_120B_H100_BF16_BASE_CONFIG"),
    # v0.2.0 QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG: PP 2, v 12, micro-batch 1 (the page printed 2 and 24)
    ("qwen3-30b-a3b 25.11", "1", "12", "QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG"),
])
def test_the_25_11_rows_take_micro_batch_and_v_from_the_release_recipe(name, micro_batch_size, virtual, cited):
    row = rows()[name]
    assert (row["micro_batch_size"], row["virtual_pipeline_model_parallel_size"]) == (micro_batch_size, virtual)
    assert cited in row["note"] and "v0.2.0 (7af9601c9" in row["note"] and "97ad8cc6f" in row["note"]


def test_gpt_oss_25_11_ran_without_recomputation():
    """v0.2.0's set_recompute_overrides set recompute_modules without recompute_granularity
    (None: Megatron-Core recomputes nothing); c9dd05869 (after 25.11) added 'selective',
    which v0.4.0 (26.04) has."""
    table = rows()
    old, new = table["gpt-oss-120b 25.11"], table["gpt-oss-120b 26.04.01"]
    assert (old["recompute_granularity"], old["recompute_modules"]) == ("", "")
    assert "c9dd05869" in old["note"]
    assert (new["recompute_granularity"], new["recompute_modules"]) == ("selective", "layernorm moe_act")


def test_the_qwen3_235b_rows_split_the_pipeline_as_the_recipe_and_run_current_scaling_fp8():
    """qwen3_235b_a22b_pretrain_config counts the embedding and the loss as layers: 94
    layers + 2 over 8 x 4 virtual stages of 3; 26.04.01's FP8 is the H100 FP8_CS variant."""
    table = rows()
    for name in ("qwen3-235b-a22b 25.11", "qwen3-235b-a22b 26.04.01"):
        row = table[name]
        assert (row["account_for_embedding_in_pipeline_split"], row["account_for_loss_in_pipeline_split"]) == (
            "true", "true")
        assert row["fp8_recipe"] == "tensorwise"
    assert "QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2" in table["qwen3-235b-a22b 26.04.01"]["note"]


def test_every_predicted_row_states_its_recipes_data_parallel_overlaps():
    """Megatron-Bridge's MoE recipes overlap the gradient reduce-scatter and the parameter
    all-gather (DistributedDataParallelConfig True, True), except DeepSeek-V3 25.09 on
    H100, whose run_script turned the gradient overlap off."""
    for name, row in rows().items():
        if row["not_expressible"]:
            continue
        expected = ("false", "true") if name == "deepseek-v3 25.09" else ("true", "true")
        assert (row["overlap_grad_reduce"], row["overlap_param_gather"]) == expected, name
        assert row["grad_reduce_in_bf16"] == "true", name  # every recipe: grad_reduce_in_fp32 False


def test_every_predicted_row_splits_its_global_batch_into_whole_micro_batches():
    """GBS = micro-batch x data-parallel size x micro-batches, at least one per pipeline stage."""
    for name, row in rows().items():
        if row["not_expressible"]:
            continue
        per_step = int(row["micro_batch_size"]) * int(row["data_parallel_size"])
        assert int(row["global_batch_size"]) % per_step == 0, name
        assert int(row["global_batch_size"]) // per_step >= int(row["pipeline_model_parallel_size"]), name


def fp8_casts(kernels: Kernels, before: int) -> Kernels:
    keep = np.arange(len(kernels)) >= before
    return Kernels(*(getattr(kernels, f)[keep] for f in KERNEL_FIELDS_ORDER))


def test_tensorwise_casts_of_a_grouped_gemm_launch_three_kernels_per_expert():
    """Transformer Engine's split_quantize quantises each of the 16 local experts' splits
    alone under current scaling (amax, scale, cast: 3 launches each); the forward casts
    the inputs of QKV and the projection (dense: 3 launches each) and of fc1 and fc2 (16
    splits: 48 each), plus the weights (2 dense + 2 x 16 experts, 3 launches each) once
    per iteration, a quarter of them per micro-batch."""
    assert EP8.num_microbatches == MICROBATCHES
    work = moe_layer_work(MOE, EP8)
    fwd = work.forward
    fp8 = fwd.kernels.kind == FP8_GEMM
    assert sorted(fwd.kernels.batch[fp8].tolist()) == [1.0, 1.0, 16.0, 16.0]
    inputs = 2 * 3 + 2 * 3 * LOCAL_EXPERTS
    weights = 3 * (2 + 2 * LOCAL_EXPERTS) / MICROBATCHES
    assert fp8_ops.scaling_launches(fwd.kernels, "forward", "tensorwise", MICROBATCHES) == pytest.approx(
        inputs + weights, rel=1e-15)
    scaled = fp8_ops.with_scaling(fwd, "forward", "tensorwise", MICROBATCHES)
    added = fp8_casts(scaled.kernels, len(fwd.kernels))
    assert set(added.kind.tolist()) == {MEMORY} and len(added) == 2 * 4  # two host-issued passes per GEMM
    assert added.launches.sum() == pytest.approx(inputs + weights, rel=1e-15)
    # backward: the output gradients of the 4 input-gradient GEMMs, split the same way
    back = work.backward.kernels
    assert fp8_ops.scaling_launches(back, "backward", "tensorwise", MICROBATCHES) == 2 * 3 + 2 * 3 * LOCAL_EXPERTS
    # delayed scaling fuses the splits (nvte_multi_cast_transpose): one launch per input
    assert fp8_ops.scaling_launches(back, "backward", "delayed", MICROBATCHES) == 4


def test_a_memory_row_of_several_launches_pays_one_kernel_latency_per_launch():
    speed = DeviceSpeed(peak_flops=1e15, mem_bandwidth_Bps=2e12)
    eff = DeviceEfficiency(memory_efficiency=0.5, kernel_latency_s=4e-6)
    rows_ = Kernels(np.full(2, MEMORY, dtype=np.int8), np.zeros(2), np.full(2, 1e6), np.zeros(2), np.zeros(2),
                    np.zeros(2), np.ones(2), np.zeros(2, dtype=bool), np.array([1.0, 48.0]))
    one, many = kernel_times_s(rows_, speed, eff)
    assert one == pytest.approx(1e6 / 1e12 + 4e-6, rel=1e-12)
    assert many == pytest.approx(1e6 / 1e12 + 48 * 4e-6, rel=1e-12)


def test_the_26_06_qwen3_row_runs_hybridep_on_32_sms_across_two_nodes():
    """v0.5.0's QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1: HybridEP, EP 16 on 16 GPUs;
    _set_common_perf_overrides sets moe_hybridep_num_sms 32 after the H100 config names
    the backend (overrides.py lines 74-75)."""
    row = rows()["qwen3-30b-a3b 26.06"]
    assert (row["moe_token_dispatcher_type"], row["moe_flex_dispatcher_backend"],
            row["moe_flex_dispatcher_num_sms"]) == ("flex", "hybridep", "32")
    assert (row["expert_model_parallel_size"], row["num_gpus"], row["not_expressible"]) == ("16", "16", "")
    assert "lines 74-75" in row["note"] and "QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1" in row["note"]
