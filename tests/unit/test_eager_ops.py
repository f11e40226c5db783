"""Eager (unfused) elementwise pricing: the bytes of torchtitan's ops, summed by hand."""

import pytest

from paraplan.core.errors import StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.predict import eager_ops
from paraplan.predict.models import load_model
from paraplan.predict.ops import MEMORY, layer_work


def test_rms_norm_bytes_per_element_and_row() -> None:
    # forward: cast 6, pow 8, mean 4, multiply 8, cast 6, weight 4 = 36 per element;
    # per row: mean 4, eps 8, rsqrt 8, multiply 4 = 24
    assert sum(eager_ops.rms_norm_forward_bytes(1.0, 0.0, 2)) == 36
    assert sum(eager_ops.rms_norm_forward_bytes(0.0, 1.0, 2)) == 24
    assert len(eager_ops.rms_norm_forward_bytes(1.0, 1.0, 2)) == 8
    # backward: 4 + 6 + 2 + 6 + 8 + 12 + 4 + 4 + 8 + 8 + 12 + 12 + 6 = 92 per element
    assert sum(eager_ops.rms_norm_backward_bytes(1.0, 0.0, 2)) == 92
    assert sum(eager_ops.rope_forward_bytes(1.0, 2)) == 20
    assert sum(eager_ops.swiglu_forward_bytes(1.0, 2)) == 10
    assert sum(eager_ops.swiglu_backward_bytes(1.0, 2)) == 18


def test_eager_layer_forward_adds_the_unfused_traffic() -> None:
    model = load_model("llama3-8b")
    fused = layer_work(model, RunSettings(micro_batch_size=1)).forward.kernels
    eager = layer_work(model, RunSettings(micro_batch_size=1, elementwise_kernels="eager")).forward.kernels
    n, r, e = model.seq_length * 4096.0, float(model.seq_length), 2
    q, k, f = n, model.seq_length * 1024.0, model.seq_length * 14336.0
    fused_bytes = 2 * (2 * e * n) + 2 * e * (q + k) + 3 * e * f + 2 * 3 * e * n  # norms, rope, swiglu, adds
    eager_bytes = 2 * (36 * n + 24 * r) + 20 * (q + k) + 2 * e * (q + k) + 10 * f + 2 * 3 * e * n
    memory = lambda kernels: float(kernels.bytes[kernels.kind == MEMORY].sum())  # noqa: E731
    assert memory(eager) - memory(fused) == pytest.approx(eager_bytes - fused_bytes, rel=1e-12)


def test_eager_needs_torchtitans_llama_layer() -> None:
    with pytest.raises(StrategyError) as error:
        RunSettings(elementwise_kernels="eager", tensor_model_parallel_size=8, pipeline_model_parallel_size=8,
                    global_batch_size=8).check(load_model("gpt3-175b"))
    assert str(error.value) == ("elementwise_kernels eager prices torchtitan's Llama layer; 'gpt3-175b' differs "
                                "from it: expected normalization RMSNorm, swiglu, position_embedding_type rope, "
                                "no dropout, no linear biases")


def _titan(**kw: object) -> RunSettings:
    return RunSettings(micro_batch_size=2, global_batch_size=2, recompute_granularity="selective",
                       selective_ac_option="op", **kw)  # type: ignore[arg-type]


def test_op_sac_keeps_input_wq_wv_attention_w1_w2() -> None:
    model = load_model("llama3-8b")  # h 4096, 32 heads, 8 groups of 128, ffn 14336, seq 8192
    work = layer_work(model, _titan())
    per_token = 2 * (4096 + 4096 + 1024 + 4096 + 14336 + 4096) + 4 * 32
    assert work.activation_bytes == 2 * 8192 * per_token
    gemm = work.recompute.kernels.kind != MEMORY
    assert work.recompute.kernels.flops[gemm].sum() == 2 * 2 * 8192 * 4096 * (1024 + 4096 + 14336)  # wk, wo, w3
    eager = layer_work(model, _titan(elementwise_kernels="eager")).recompute.kernels
    assert int((eager.kind == MEMORY).sum()) == 2 * 8 + 3 * 2 + 2 + 1 + 2  # norms, rope, repeat_kv, add, swiglu


def test_op_sac_needs_selective_without_tensor_parallelism() -> None:
    model = load_model("llama3-8b")
    with pytest.raises(StrategyError) as error:
        RunSettings(selective_ac_option="op", recompute_granularity="full").check(model)
    assert str(error.value) == ("selective_ac_option op needs recompute_granularity selective and the default "
                                "recompute_modules (core_attn), got recompute_granularity full, recompute_modules "
                                "core_attn")
    with pytest.raises(StrategyError) as error:
        _titan(tensor_model_parallel_size=8).check(model)
    assert str(error.value) == ("selective_ac_option op is priced without tensor parallelism (its recomputation "
                                "re-runs the all-gathers), got tensor_model_parallel_size 8")
