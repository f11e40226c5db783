"""Low-precision storage in Megatron-LM's names: the precision-aware optimizer's bytes
per parameter and step traffic (Megatron-LM d98e8a64, Transformer Engine d0067d0d
FusedAdam), the refusals Megatron makes, and `activation_func_fp8_input_store`'s
activation bytes."""

from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel, InputFileError, StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import Precision, run_structure
from paraplan.predict.models import PRESETS
from paraplan.predict.moe_ops import moe_activation_bytes, moe_layer_work
from paraplan.predict.ops import layer_activation_bytes, layer_work
from paraplan.predict.runtable import read_run_table

GPT = TransformerModel("gpt", num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                       vocab_size=50257)
LLAMA = TransformerModel("llama", num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                         vocab_size=32000, ffn_hidden_size=2816, swiglu=True, normalization="RMSNorm",
                         position_embedding_type="rope", hidden_dropout=0.0, attention_dropout=0.0,
                         add_bias_linear=False)
QWEN = PRESETS["qwen3-30b-a3b"]  # h 2048, 128 experts of 768 (gated), top-8, s 4096
DISTOPT = RunSettings(data_parallel_size=4, micro_batch_size=1, global_batch_size=8, use_distributed_optimizer=True)
PAO = replace(DISTOPT, use_precision_aware_optimizer=True)
COMM = ConstantBandwidthModel(100e9, 100e9, 5e-6, 5e-6)


def _bytes(**kw) -> tuple[int, int, int, int]:
    p = Precision.of_settings(replace(PAO, **kw))
    return p.weight_bytes, p.grad_bytes, p.optimizer_bytes, p.optimizer_step_bytes


@pytest.mark.parametrize(("kw", "expected"), [
    # bf16 weights: FusedAdam keeps the fp32 main param as its 16-bit remainder (2) and the
    # fp32 moments (8); the step reads the gradient thrice (kernel, norm, zeroing: 12),
    # the weight and remainder twice (8), the moments twice (16)
    ({}, (2, 4, 2 + 8, 12 + 8 + 16)),
    # bf16 moments fused into the kernel (read 2, write 2 each)
    ({"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, (2, 4, 2 + 4, 12 + 8 + 8)),
    # bf16 main gradients read in place: 2 bytes held, 3 x 2 moved
    ({"main_grads_dtype": "bf16", "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, (2, 2, 6, 6 + 8 + 8)),
    # one bf16 moment beside an fp32 one is unscaled and scaled back: 6 + 8 + 10
    ({"exp_avg_dtype": "bf16"}, (2, 4, 2 + 2 + 4, 12 + 8 + 24 + 8)),
    # fp8 moments: 1 byte each; dequantise 5, kernel 8, aminmax and quantise 9
    ({"exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "fp8"}, (2, 4, 2 + 2, 12 + 8 + 2 * 22)),
    # fp16 moments: .float() and mul_ 14, kernel 8, aminmax, mul_ and copy 18
    ({"exp_avg_dtype": "fp16", "exp_avg_sq_dtype": "fp16"}, (2, 4, 2 + 4, 12 + 8 + 2 * 40)),
    # fp16 main params: 2 bytes, scaled like an fp16 moment, plus the bf16 weight written
    ({"main_params_dtype": "fp16"}, (2, 4, 2 + 8, 12 + 40 + 2 + 16)),
    # fp16 weights: a whole fp32 main param (4), 2-byte gradients read in place, the
    # overflow check one more pass over them
    ({"dtype": "fp16"}, (2, 2, 4 + 8, 6 + 10 + 16 + 2)),
    # fp8 with the delayed recipe: FusedAdam holds the main params, as for bf16
    ({"dtype": "fp8", "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, (2, 4, 6, 28)),
    # fp8 blockwise with fp32 main params (DeepSeek-V3's): Megatron-Core's fp32 shard (4),
    # bf16 moments; the step reads and writes the main param (8), reads it to write the weight (4 + 2)
    ({"dtype": "fp8", "fp8_recipe": "blockwise", "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"},
     (2, 4, 4 + 4, 12 + 10 + 8 + 4)),
    # ... with bf16 main gradients the shard is cast to fp32 (4 bytes held; read 2, write 4)
    ({"dtype": "fp8", "fp8_recipe": "blockwise", "main_grads_dtype": "bf16", "exp_avg_dtype": "bf16",
      "exp_avg_sq_dtype": "bf16"}, (2, 2, 4 + 4 + 4, (2 + 4) + 4 + 4 + 2 + 10 + 8 + 4)),
])
def test_bytes_per_parameter_and_step_traffic(kw, expected):
    assert _bytes(**kw) == expected


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise"])
def test_megatron_cores_fp32_shard_with_fp32_states_is_the_plain_distributed_optimizer(recipe):
    fp8 = replace(PAO, dtype="fp8", fp8_recipe=recipe)
    assert Precision.of_settings(fp8) == Precision.of("fp8")
    assert Precision.of_settings(replace(fp8, main_grads_dtype="bf16")) == Precision.of("fp8", True)


def test_the_plain_optimizer_is_unchanged():
    assert Precision.of_settings(DISTOPT) == Precision(2, 4, 12, 42)
    assert Precision.of_settings(replace(DISTOPT, grad_reduce_in_bf16=True)) == Precision.of("bf16", True)


def test_optimizer_state_is_sharded_over_the_data_parallel_ranks():
    """GPT on DP 4: 12 bytes per parameter of optimizer state / 4 without, 2 + 2 + 2 with
    bf16 moments; weights and fp32 gradients unsharded and unchanged."""
    cluster = load_cluster("dgx-a100")
    plain = run_structure(GPT, DISTOPT, cluster, COMM)
    pao = run_structure(GPT, replace(PAO, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"), cluster, COMM)
    params = float(plain.rank_params[0])
    assert plain.memory[0].optimizer_bytes == pytest.approx(12 * params / 4)
    assert pao.memory[0].optimizer_bytes == pytest.approx(6 * params / 4)
    assert pao.memory[0].gradients_bytes == plain.memory[0].gradients_bytes == pytest.approx(4 * params)
    assert pao.memory[0].weights_bytes == plain.memory[0].weights_bytes
    assert pao.precision.optimizer_step_bytes == 28


@pytest.mark.parametrize(("kw", "message"), [
    ({"exp_avg_dtype": "bf16"}, "exp_avg_dtype bf16 needs use_precision_aware_optimizer (Megatron-LM: exp_avg_dtype "
                                "can only be fp32 when not using precision-aware optimizer)"),
    ({"main_grads_dtype": "bf16"}, "main_grads_dtype bf16 needs use_precision_aware_optimizer"),
    ({"use_precision_aware_optimizer": True, "use_distributed_optimizer": False},
     "use_precision_aware_optimizer needs use_distributed_optimizer (Megatron-LM: --use-precision-aware-optimizer "
     "only supported with distributed optimizer)"),
    ({"use_precision_aware_optimizer": True, "zero_stage": 1}, "use_precision_aware_optimizer with zero_stage 1: "
                                                               "expected zero_stage 0"),
    ({"use_precision_aware_optimizer": True, "dtype": "fp32"}, "use_precision_aware_optimizer with dtype fp32: "
                                                               "expected bf16, fp16 or fp8"),
    ({"use_precision_aware_optimizer": True, "dtype": "fp16", "main_grads_dtype": "bf16"},
     "main_grads_dtype bf16 with dtype fp16: expected dtype bf16 or fp8"),
    ({"use_precision_aware_optimizer": True, "exp_avg_sq_dtype": "int8"},
     "exp_avg_sq_dtype 'int8' is not one of fp32, fp16, bf16, fp8"),
    ({"activation_func_fp8_input_store": True}, "activation_func_fp8_input_store needs a SwiGLU model"),
])
def test_refusals(kw, message):
    with pytest.raises(StrategyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        replace(DISTOPT, **kw).check(GPT)


def test_fp8_input_store_needs_megatrons_fused_swiglu():
    with pytest.raises(StrategyError, match="needs elementwise_kernels fused"):
        RunSettings(activation_func_fp8_input_store=True, elementwise_kernels="eager").check(LLAMA)


def test_dense_swiglu_input_kept_in_fp8_and_cast_both_ways():
    """Llama layer, t = 1, s b = 1024 tokens, f = 2816: the SwiGLU input (2 f per token)
    kept at 1 byte instead of 2; the forward casts it (read 2, write 1), the backward
    casts it back (read 1, write 2)."""
    s = RunSettings(micro_batch_size=1, global_batch_size=1)
    fp8 = replace(s, activation_func_fp8_input_store=True)
    elements = 1024 * 2 * 2816
    assert layer_activation_bytes(LLAMA, s) - layer_activation_bytes(LLAMA, fp8) == elements * (2 - 1)
    plain, stored = layer_work(LLAMA, s), layer_work(LLAMA, fp8)
    assert stored.forward.kernels.bytes.sum() - plain.forward.kernels.bytes.sum() == pytest.approx(3 * elements)
    assert stored.backward.kernels.bytes.sum() - plain.backward.kernels.bytes.sum() == pytest.approx(3 * elements)
    mlp = replace(s, recompute_granularity="selective", recompute_modules=("mlp",))
    assert layer_activation_bytes(LLAMA, mlp) == layer_activation_bytes(LLAMA, replace(
        mlp, activation_func_fp8_input_store=True))


def test_expert_swiglu_input_in_fp8_unless_moe_act_recomputes_it():
    """Qwen3-30B-A3B on EP 8: T k = 4096 x 8 dispatched tokens, each with a 2 x 768 SwiGLU
    input, 1 byte instead of 2; under moe_act Megatron's checkpoint keeps the bf16 input."""
    s = RunSettings(data_parallel_size=8, global_batch_size=8, micro_batch_size=1, expert_model_parallel_size=8)
    fp8 = replace(s, activation_func_fp8_input_store=True)
    assert moe_activation_bytes(QWEN, s) - moe_activation_bytes(QWEN, fp8) == 4096 * 8 * 2 * 768
    act = replace(s, recompute_granularity="selective", recompute_modules=("moe_act",))
    assert moe_activation_bytes(QWEN, act) == moe_activation_bytes(QWEN, replace(
        act, activation_func_fp8_input_store=True))
    cast = 3 * 4096 * 8 * 2 * 768
    plain, stored = moe_layer_work(QWEN, s), moe_layer_work(QWEN, fp8)
    assert stored.forward.kernels.bytes.sum() - plain.forward.kernels.bytes.sum() == pytest.approx(cast)


def test_run_table_columns(tmp_path: Path):
    path = tmp_path / "runs.csv"
    head = ("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,tensor_model_parallel_size,"
            "pipeline_model_parallel_size,data_parallel_size,global_batch_size,micro_batch_size,"
            "use_distributed_optimizer,use_precision_aware_optimizer,exp_avg_dtype,exp_avg_sq_dtype\n")
    path.write_text(head + "a,4,1024,16,1024,50257,1,1,4,8,1,true,true,bf16,fp8\n")
    _, rows = read_run_table(path)
    s = rows[0].settings
    assert (s.use_precision_aware_optimizer, s.exp_avg_dtype, s.exp_avg_sq_dtype) == (True, "bf16", "fp8")
    path.write_text(head + "a,4,1024,16,1024,50257,1,1,4,8,1,true,true,int8,bf16\n")
    with pytest.raises(InputFileError, match=r"column 'exp_avg_dtype'.*expected one of fp32, fp16, bf16, fp8"):
        read_run_table(path)
