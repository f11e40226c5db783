"""What Megatron-Core's grouped experts and DeepEP issue besides the GEMMs and transfers:
fc2's bias one local expert at a time (`moe_bias`), GPT-OSS's clamped activation
(`moe_activation`), Transformer Engine's FP8 row padding (`moe_padding`), DeepEP's layout
and notify kernels and its host wait (`moe_deepep`)."""

import dataclasses
import json
from pathlib import Path

import pytest

from paraplan.core.errors import InputFileError
from paraplan.core.run_settings import RunSettings
from paraplan.predict.hf_config import read_hf_config
from paraplan.predict.models import PRESETS
from paraplan.predict.moe_activation import clamp_backward, clamp_forward
from paraplan.predict.moe_bias import expert_bias_backward, expert_bias_forward, probs_bytes
from paraplan.predict.moe_deepep import deepep_host_work
from paraplan.predict.moe_ops import moe_layer_work
from paraplan.predict.moe_padding import pads_fp8_rows
from paraplan.predict.work import _Builder

GPT_OSS = PRESETS["gpt-oss-120b"]  # 128 experts, top-4, expert biases
QWEN = PRESETS["qwen3-30b-a3b"]  # 128 experts, top-8, no biases
N, H, E_LOCAL = 1600.0, 10.0, 16  # dispatched tokens on the rank, hidden size, local experts


def settings(**kw) -> RunSettings:
    base = dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, data_parallel_size=8,
                global_batch_size=8, micro_batch_size=1, expert_model_parallel_size=8)
    return RunSettings(**{**base, **kw})


def built(fn, *args) -> tuple[int, float]:
    w = _Builder(2)
    fn(w, *args)
    work = w.build()
    return len(work.kernels), float(work.kernels.bytes.sum())


def test_bias_forward_is_two_calls_per_expert_and_a_concatenation():
    """b * p and t + b p per expert (4 n h e + n q + h e), then torch.cat (2 N h e)."""
    e = q = 2
    rows, nbytes = built(expert_bias_forward, N, E_LOCAL, H, e, q)
    assert rows == 2 * E_LOCAL + 1
    assert nbytes == pytest.approx(6 * N * H * e + N * q + E_LOCAL * H * e)


def test_bias_backward_is_four_calls_per_expert_and_two_concatenations():
    """grad * p and its sum (b), grad * b and its sum (p) per expert; the splits' backward
    concatenates the output's and the probabilities' gradients."""
    e = q = 2
    rows, nbytes = built(expert_bias_backward, N, E_LOCAL, H, e, q)
    assert rows == 4 * E_LOCAL + 2
    assert nbytes == pytest.approx(8 * N * H * e + 3 * N * q + N * e + 2 * E_LOCAL * H * e)


def test_fp32_probabilities_promote_the_products_and_add_the_casts():
    """With 4-byte probabilities the products are fp32 (r = 4): a cast back forward, and
    the cast's backward and one cast of t's gradient per expert backward."""
    fwd_rows, _ = built(expert_bias_forward, N, E_LOCAL, H, 2, 4)
    bwd_rows, _ = built(expert_bias_backward, N, E_LOCAL, H, 2, 4)
    assert (fwd_rows, bwd_rows) == (2 * E_LOCAL + 2, 5 * E_LOCAL + 3)


def test_probabilities_are_the_routers_dtype_or_fp32_for_deepep():
    assert probs_bytes(settings()) == 2
    assert probs_bytes(settings(moe_router_dtype="fp32")) == 4
    assert probs_bytes(settings(moe_token_dispatcher_type="flex", expert_model_parallel_size=16,
                                data_parallel_size=16, global_batch_size=16)) == 4


def test_a_layer_with_expert_biases_issues_the_bias_calls():
    """GPT-OSS 120B at EP 8: 16 local experts, so 33 more rows forward and 66 backward
    than the same layer without biases (and the router's bias gradient, a sum over the
    tokens: `moe_router`; and the attention output projection's bias gradient, a sum over
    the tokens in its residual junction: `ops._row_bias_backward`); `moe_act`
    recomputation does not repeat them."""
    s = settings()
    with_bias = moe_layer_work(GPT_OSS, s)
    without = moe_layer_work(dataclasses.replace(GPT_OSS, add_bias_linear=False), s)
    assert len(with_bias.forward.kernels) - len(without.forward.kernels) == 2 * 16 + 1
    assert len(with_bias.backward.kernels) - len(without.backward.kernels) == 4 * 16 + 2 + 1 + 1
    act = settings(recompute_granularity="selective", recompute_modules=("moe_act",))
    assert len(moe_layer_work(GPT_OSS, act).recompute.kernels) == len(
        moe_layer_work(dataclasses.replace(GPT_OSS, add_bias_linear=False), act).recompute.kernels)


@pytest.mark.parametrize(("kw", "pads"), [
    ({}, False),  # bf16: no FP8 GEMM
    ({"dtype": "fp8"}, True),  # dropless: random counts per expert
    ({"dtype": "fp8", "fp8_recipe": "tensorwise"}, True),
    # padded to capacity: ceil(4096 x 8 x 1.0 / 128) = 256 tokens from each of 8 ranks, 2,048 = 16 x 128
    ({"dtype": "fp8", "moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True}, False),
    # ceil(4096 x 8 x 1.01 / 128) = 259; 8 x 259 = 2,072 is not a multiple of 16
    ({"dtype": "fp8", "moe_expert_capacity_factor": 1.01, "moe_pad_expert_input_to_capacity": True}, True),
])
def test_fp8_rows_are_padded_unless_every_count_is_aligned(kw, pads):
    s = settings(**kw)
    assert pads_fp8_rows(s, 4096, 8, 128, 8) is pads


def test_fp8_padding_adds_three_kernels_each_way():
    """Tokens and probabilities padded, output unpadded; the backward mirrors them."""
    fp8, bf16 = moe_layer_work(QWEN, settings(dtype="fp8")), moe_layer_work(QWEN, settings())
    aligned = moe_layer_work(QWEN, settings(dtype="fp8", moe_expert_capacity_factor=1.0,
                                            moe_pad_expert_input_to_capacity=True))
    unaligned = moe_layer_work(QWEN, settings(dtype="fp8", moe_expert_capacity_factor=1.01,
                                              moe_pad_expert_input_to_capacity=True))
    assert len(unaligned.forward.kernels) - len(aligned.forward.kernels) == 3
    assert len(unaligned.backward.kernels) - len(aligned.backward.kernels) == 3
    assert len(fp8.forward.kernels) - len(bf16.forward.kernels) == 3
    assert len(fp8.backward.kernels) - len(bf16.backward.kernels) == 3


def test_deepep_forward_dispatch_runs_layout_and_notify_then_waits():
    """get_dispatch_layout reads T k int64 indices and writes T flags per rank and the
    int32 counts per rank and expert; notify_dispatch writes 2 (R^2 + E) int32; then the
    host polls the counts with nothing queued behind."""
    w = _Builder(2)
    deepep_host_work(w, 4096, 8, 128, 8, cached=False)
    work = w.build()
    assert len(work.kernels) == 2
    assert work.kernels.bytes.tolist() == [4096 * 8 * 8 + 4096 * 8 + (8 + 128) * 4, 2 * (64 + 128) * 4]
    assert work.host_syncs == ((2, 2),)
    cached = _Builder(2)
    deepep_host_work(cached, 4096, 8, 128, 8, cached=True)
    assert (len(cached.build().kernels), cached.host_syncs) == (1, [])


def test_clamped_activation_adds_three_calls_a_copy_and_a_wait_forward():
    """Two clamps (2 N f e each), their concatenation (4 N f e), the offset's copy to the
    device, then the host waits with nothing queued."""
    w = _Builder(2)
    clamp_forward(w, N, H, 2, 2)
    work = w.build()
    assert work.kernels.bytes.tolist() == [2 * N * H * 2, 2 * N * H * 2, 4 * N * H * 2, 2]
    assert work.host_syncs == ((4, 4),)


def test_clamped_activation_backward_is_seven_calls():
    """Comparison and where (gate); two comparisons, logical_and_ and where (linear half);
    the chunk's concatenation: 11 N f e + 8 N f bytes."""
    rows, nbytes = built(clamp_backward, N, H, 2)
    assert rows == 7
    assert nbytes == pytest.approx(11 * N * H * 2 + 8 * N * H)


def test_gpt_oss_layer_prices_the_clamp_and_keeps_fc1s_output():
    """GPT-OSS 120B (clamp 7.0) against the same layer unclamped: 4 rows and one wait more
    forward, 7 rows backward, N x 2f x e more activation bytes (none with moe_act)."""
    s = settings()
    plain = dataclasses.replace(GPT_OSS, activation_func_clamp_value=0.0)
    clamped, unclamped = moe_layer_work(GPT_OSS, s), moe_layer_work(plain, s)
    assert len(clamped.forward.kernels) - len(unclamped.forward.kernels) == 4
    assert len(clamped.forward.host_syncs) - len(unclamped.forward.host_syncs) == 1
    assert len(clamped.backward.kernels) - len(unclamped.backward.kernels) == 7
    tokens = 4096 * 4  # T k per rank at EP 8, balanced
    assert clamped.activation_bytes - unclamped.activation_bytes == pytest.approx(tokens * 2 * 2880 * 2)
    act = settings(recompute_granularity="selective", recompute_modules=("moe_act",))
    assert moe_layer_work(GPT_OSS, act).activation_bytes == moe_layer_work(plain, act).activation_bytes
    assert len(moe_layer_work(GPT_OSS, act).recompute.host_syncs) == 1


@pytest.mark.parametrize(("kw", "why"), [
    ({"num_experts": 0}, "every layer a MoE layer"),
    ({"moe_shared_expert_intermediate_size": 2880}, "no shared experts"),
    ({"activation_func_clamp_value": -1.0}, "a number >= 0"),
])
def test_the_clamp_is_refused_where_it_is_not_priced(kw, why):
    with pytest.raises(ValueError, match=why):
        dataclasses.replace(GPT_OSS, **kw)


def test_hugging_faces_swiglu_limit_is_the_clamp():
    hf = Path(__file__).resolve().parents[1] / "data" / "hf"
    config = json.loads((hf / "gpt-oss-120b.json").read_text())
    read = read_hf_config(config, "gpt-oss-120b", "gpt-oss-120b.json").model
    assert read.activation_func_clamp_value == 7.0 == PRESETS["gpt-oss-120b"].activation_func_clamp_value
    with pytest.raises(InputFileError, match="key 'swiglu_limit': expected a number >= 0, got 'x'"):
        read_hf_config({**config, "swiglu_limit": "x"}, "gpt-oss-120b", "gpt-oss-120b.json")
