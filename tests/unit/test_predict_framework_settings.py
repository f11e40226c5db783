"""Framework behaviour as run settings: gradient-accumulation fusion and the
data-parallel wrapper (Megatron's local DDP vs torch DDP), priced in the execution
model, read from run tables with errors naming the column."""

import math
from dataclasses import replace

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel, InputFileError, StrategyError
from paraplan.core.run_settings import DTYPES, MAIN_GRAD_BYTES, RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import TORCH_DDP_BUCKET_BYTES, Precision, build_execution, run_structure
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.ops import MEMORY, layer_work
from paraplan.predict.runtable import read_run_table

GPT = TransformerModel("gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                       vocab_size=50257)
ONE = RunSettings(micro_batch_size=2, global_batch_size=2)
CLUSTER = load_cluster("dgx-a100")
COMM = ConstantBandwidthModel(100e9, 100e9, 5e-6, 5e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_main_gradient_bytes_agree_with_the_memory_model(dtype):
    assert MAIN_GRAD_BYTES[dtype] == Precision.of(dtype).grad_bytes


def test_unfused_accumulation_adds_a_read_read_write_per_weight():
    """GPT layer, t = 1: QKV 3h^2, projection h^2, MLP 4h^2 + 4h^2 = 12 h^2 weights;
    bf16 without fusion moves 2 + 4 + 4 = 10 bytes per weight per micro-batch."""
    fused = layer_work(GPT, ONE).backward.kernels
    unfused = layer_work(GPT, replace(ONE, gradient_accumulation_fusion=False)).backward.kernels
    assert len(unfused) == len(fused) + 4
    extra = unfused.bytes.sum() - fused.bytes.sum()
    assert extra == pytest.approx(12 * 1024**2 * 10)
    added = (unfused.kind == MEMORY) & unfused.weight_grad
    assert added.sum() == 4 and unfused.bytes[added].sum() == pytest.approx(extra)
    assert layer_work(GPT, replace(ONE, gradient_accumulation_fusion=False)).forward.kernels.bytes.sum() == \
        pytest.approx(layer_work(GPT, ONE).forward.kernels.bytes.sum())


def test_unfused_accumulation_costs_its_bytes_at_memory_speed():
    eff = DeviceEfficiency(kernel_latency_s=0.0)
    fused = build_execution(GPT, ONE, CLUSTER, COMM, eff)
    unfused = build_execution(GPT, replace(ONE, gradient_accumulation_fusion=False), CLUSTER, COMM, eff)
    per_layer = 12 * 1024**2 * 10 / (CLUSTER.device.mem_bandwidth_Bps * eff.memory_efficiency)
    added = unfused.costs.bwd_s - fused.costs.bwd_s
    assert added.sum() == pytest.approx(8 * per_layer + 50304 * 1024 * 10 / (
        CLUSTER.device.mem_bandwidth_Bps * eff.memory_efficiency), rel=1e-3)  # + the LM head's weights


def test_torch_ddp_overlaps_in_25_mib_buckets_of_16_bit_gradients():
    s = RunSettings(data_parallel_size=4, micro_batch_size=1, global_batch_size=8)
    local = run_structure(GPT, s, CLUSTER, COMM)
    torch_ = run_structure(GPT, replace(s, DDP_impl="torch"), CLUSTER, COMM)
    params = float(local.rank_params[0])
    assert local.grad_sync[0].bucket_s.size == math.ceil(params / 40e6)
    assert torch_.grad_sync[0].bucket_s.size == math.ceil(params * 2 / TORCH_DDP_BUCKET_BYTES)
    one = COMM.time_s("all_reduce", params * 2 / torch_.grad_sync[0].bucket_s.size, _dp(4))
    assert np.allclose(torch_.grad_sync[0].bucket_s, one)
    eff = DeviceEfficiency()
    assert not build_execution(GPT, s, CLUSTER, COMM, eff).overlap_grad_reduce
    assert build_execution(GPT, replace(s, DDP_impl="torch"), CLUSTER, COMM, eff).overlap_grad_reduce


def _dp(n):
    from paraplan.core.comm import Group

    return Group(n, 1)


@pytest.mark.parametrize(("change", "message"), [
    ({"DDP_impl": "torch", "use_distributed_optimizer": True}, "DDP_impl torch cannot shard the optimizer"),
    ({"DDP_impl": "torch", "overlap_grad_reduce": True}, "overlap_grad_reduce is an option of DDP_impl local"),
    ({"DDP_impl": "apex"}, "DDP_impl 'apex' is not one of local, torch"),
])
def test_ddp_interlocks(change, message):
    with pytest.raises(StrategyError, match=message):
        replace(RunSettings(data_parallel_size=2, global_batch_size=2), **change).check(GPT)


HEADER = ("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,tensor_model_parallel_size,"
          "pipeline_model_parallel_size,data_parallel_size,global_batch_size")


def test_run_table_columns(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + ",gradient_accumulation_fusion,DDP_impl,async_tensor_model_parallel_allreduce\n"
                    "x,24,2048,16,2048,50257,2,1,2,8,false,torch,false\n")
    (row,) = read_run_table(path)[1]
    s = row.settings
    assert (s.gradient_accumulation_fusion, s.DDP_impl, s.async_tensor_model_parallel_allreduce) == \
        (False, "torch", False)


@pytest.mark.parametrize(("extra", "cells", "message"), [
    (",DDP_impl", "apex", "runs.csv:2: column 'DDP_impl': expected one of local, torch, got 'apex'"),
    (",gradient_accumulation_fusion", "sometimes",
     "runs.csv:2: column 'gradient_accumulation_fusion': expected true or false, got 'sometimes'"),
    (",DDP_impl,use_distributed_optimizer", "torch,true",
     "runs.csv:2: impossible run: DDP_impl torch cannot shard the optimizer"),
])
def test_bad_framework_cells_name_the_column(tmp_path, extra, cells, message):
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + extra + "\nx,24,2048,16,2048,50257,1,1,2,8," + cells + "\n")
    with pytest.raises(InputFileError) as err:
        read_run_table(path)
    assert message in str(err.value)


def test_grad_reduce_in_bf16_halves_gradient_memory_and_reduced_bytes():
    """bf16 main gradients: 2 bytes per parameter held and reduced instead of 4; the
    distributed optimizer's fp32 copy of its shard (4 bytes / shards) joins its state."""
    s = RunSettings(data_parallel_size=4, micro_batch_size=1, global_batch_size=8, use_distributed_optimizer=True)
    fp32 = run_structure(GPT, s, CLUSTER, COMM)
    bf16 = run_structure(GPT, replace(s, grad_reduce_in_bf16=True), CLUSTER, COMM)
    params = float(fp32.rank_params[0])
    assert fp32.memory[0].gradients_bytes == pytest.approx(4 * params)
    assert bf16.memory[0].gradients_bytes == pytest.approx(2 * params)
    assert bf16.memory[0].optimizer_bytes - fp32.memory[0].optimizer_bytes == pytest.approx(4 * params / 4)
    bucket = params / fp32.grad_sync[0].bucket_s.size
    assert np.allclose(fp32.grad_sync[0].bucket_s, COMM.time_s("reduce_scatter", bucket * 4, _dp(4)))
    assert np.allclose(bf16.grad_sync[0].bucket_s, COMM.time_s("reduce_scatter", bucket * 2, _dp(4)))
    unfused = layer_work(GPT, replace(ONE, gradient_accumulation_fusion=False, grad_reduce_in_bf16=True))
    fused = layer_work(GPT, ONE)
    assert unfused.backward.kernels.bytes.sum() - fused.backward.kernels.bytes.sum() == \
        pytest.approx(12 * 1024**2 * (2 + 2 * 2))  # read the GEMM output, read + write a bf16 main gradient


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_grad_reduce_in_bf16_needs_bf16_or_fp8(dtype):
    with pytest.raises(StrategyError, match=f"grad_reduce_in_bf16 with dtype {dtype}: expected dtype bf16 or fp8"):
        RunSettings(dtype=dtype, grad_reduce_in_bf16=True).check(GPT)
