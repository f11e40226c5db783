"""MoE activation memory per saved tensor and Megatron-Core's MoE `recompute_modules`
(moe_act, moe, shared_experts): what each drops and what the backward redoes."""

import pytest

from paraplan.core import StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.predict.models import PRESETS
from paraplan.predict.moe_ops import moe_activation_bytes, moe_layer_work
from paraplan.predict.ops import GEMM, MEMORY, layer_activation_bytes

QWEN = PRESETS["qwen3-30b-a3b"]  # h 2048, 128 experts of 768 (gated), top-8, no shared experts, s 4096
DSV3 = PRESETS["deepseek-v3"]  # one shared expert of 2048


def settings(**kw) -> RunSettings:
    base = dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, data_parallel_size=8,
                global_batch_size=8, micro_batch_size=1, expert_model_parallel_size=8)
    return RunSettings(**{**base, **kw})


def test_experts_keep_fc1_input_fc1_output_and_fc2_input_per_dispatched_token():
    s = settings()
    T, k, h, f = 4096, 8, 2048, 768
    # attention half and norms as a dense layer, router probabilities fp32 T x E,
    # per dispatched token: h (fc1 input) + 2f (gated fc1 output) + f (fc2 input), bf16
    dense_mlp = (2 * 2 + 2) * T * QWEN.ffn_size
    expected = layer_activation_bytes(QWEN, s) - dense_mlp + 4 * T * 128 + 2 * T * k * (h + 2 * f + f)
    assert moe_activation_bytes(QWEN, s) == expected


def test_moe_act_drops_fc2_input_and_recomputes_the_activation_in_the_backward():
    plain, act = settings(), settings(recompute_granularity="selective", recompute_modules=("moe_act",))
    T, k, f = 4096, 8, 768
    assert moe_activation_bytes(QWEN, plain) - moe_activation_bytes(QWEN, act) == 2 * T * k * f
    redo = moe_layer_work(QWEN, act).recompute
    # SwiGLU forward on T k tokens: read 2f, write f (bf16), read the fp32 routing probability
    assert list(redo.kernels.kind) == [MEMORY]
    assert redo.kernels.bytes[0] == 3 * 2 * T * k * f + 4 * T * k
    assert not redo.collectives


def test_fp8_keeps_the_experts_linear_inputs_as_fp8_copies():
    s = settings(dtype="fp8")
    act = settings(dtype="fp8", recompute_granularity="selective", recompute_modules=("moe_act",))
    assert moe_activation_bytes(QWEN, s) - moe_activation_bytes(QWEN, act) == 1 * 4096 * 8 * 768


def test_moe_recomputes_the_whole_block_with_its_all_to_alls():
    s = settings(recompute_granularity="selective", recompute_modules=("moe",))
    work = moe_layer_work(QWEN, s)
    T = 4096
    dense_mlp = (2 * 2 + 2) * T * QWEN.ffn_size
    assert moe_activation_bytes(QWEN, s) == layer_activation_bytes(QWEN, s) - dense_mlp
    assert [c.collective for c in work.recompute.collectives] == ["all_gather", "all_to_all", "all_to_all",
                                                                 "all_to_all"]
    # router + 2 expert GEMMs forward; the forward has the attention's too
    assert sum(work.recompute.kernels.kind == GEMM) + sum(work.recompute.kernels.kind == 3) == 3


def test_shared_experts_recompute_drops_their_inner_activations():
    base = dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, data_parallel_size=64,
                global_batch_size=64, micro_batch_size=1, expert_model_parallel_size=64)
    plain = RunSettings(**base)
    shared = RunSettings(**base, recompute_granularity="selective", recompute_modules=("shared_experts",))
    T, fs = 4096, 2048  # one shared expert of 2048, gated
    assert moe_activation_bytes(DSV3, plain) - moe_activation_bytes(DSV3, shared) == T * (2 * 2 * fs + 2 * fs)
    assert sum(moe_layer_work(DSV3, shared).recompute.kernels.kind == GEMM) == 2


@pytest.mark.parametrize(("model", "module", "message"), [
    ("llama3-8b", "moe_act", "recompute_modules moe_act needs a mixture-of-experts model; 'llama3-8b' has no experts"),
    ("qwen3-30b-a3b", "shared_experts",
     "recompute_modules shared_experts needs shared experts; 'qwen3-30b-a3b' has none"),
])
def test_moe_modules_need_a_model_that_has_them(model, module, message):
    s = RunSettings(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, data_parallel_size=8,
                    global_batch_size=8, micro_batch_size=1, recompute_granularity="selective",
                    recompute_modules=(module,))
    with pytest.raises(StrategyError) as err:
        s.check(PRESETS[model])
    assert str(err.value) == message


def test_a2a_overlap_pairs_four_all_to_alls_with_the_other_micro_batch_modules():
    """Megatron-Core's combined 1F1B (schedule_layer_1f1b): combine-backward beside the
    attention forward up to the dispatch, dispatch-backward beside the experts' forward,
    dispatch beside the experts' backward, combine beside the attention backward; each
    beside its whole module; all four carry T k h bytes."""
    s = settings(overlap_moe_expert_parallel_comm=True)
    s.check(QWEN)
    work = moe_layer_work(QWEN, s)
    plain = moe_layer_work(QWEN, settings())
    T, k, h = 4096, 8, 2048
    fwd = [c for c in work.forward.collectives if c.group == "ep" and c.nbytes == T * k * h * 2]
    bwd = [c for c in work.backward.collectives if c.group == "ep" and c.nbytes == T * k * h * 2]
    assert (len(fwd), len(bwd)) == (2, 2)
    # the token counts' gather and the probabilities' all-to-alls still block
    assert [(c.collective, c.nbytes, c.hidden_by) for c in work.forward.collectives if c not in fwd] == [
        ("all_gather", 8 * 128 * 8, -1), ("all_to_all", T * k * 4, -1)]
    fk, bk = work.forward.kernels, work.backward.kernels
    attention, experts = (range(c.hidden_by, c.hidden_by + c.hidden_span) for c in fwd)
    assert attention.start == 0 and 1 in fk.kind[attention]  # from the layer's start, the fused attention in it
    # the last kernels before the dispatch: the router's logits GEMM (n = 128 experts), then its
    # memory-bound kernels (`moe_router`: Megatron's default unfused top-k, softmax and outputs, 11)
    assert fk.n[attention.stop - 12] == 128 and set(fk.kind[attention.stop - 11:attention.stop]) == {MEMORY}
    assert [(fk.m[i], fk.k[i], fk.n[i]) for i in experts if fk.kind[i] == GEMM] == [
        (T * k / 16, h, 2 * 768), (T * k / 16, 768, h)]  # fc1 and fc2 of the 16 local experts
    experts_b, attention_b = (range(c.hidden_by, c.hidden_by + c.hidden_span) for c in bwd)
    assert sum(bk.kind[experts_b] == GEMM) == 4 and sum(bk.weight_grad[experts_b]) == 2  # fc2, fc1: dgrad, wgrad
    assert attention_b.stop == len(bk) and 1 in bk.kind[attention_b]
    # the kernels themselves are unchanged; without the flag every all-to-all blocks
    assert list(fk.flops) == list(plain.forward.kernels.flops)
    assert all(c.hidden_by == -1 for c in plain.forward.collectives + plain.backward.collectives if c.group == "ep")


@pytest.mark.parametrize(("kw", "message"), [
    ({"expert_model_parallel_size": 1}, "overlap_moe_expert_parallel_comm needs expert_model_parallel_size > 1"),
    ({"recompute_granularity": "full"}, "overlap_moe_expert_parallel_comm needs no full recomputation"),
    ({"recompute_granularity": "selective", "recompute_modules": ("moe",)},
     "overlap_moe_expert_parallel_comm needs no moe in recompute_modules"),
])
def test_a2a_overlap_follows_megatron_rules(kw, message):
    with pytest.raises(StrategyError) as err:
        settings(overlap_moe_expert_parallel_comm=True, **kw).check(QWEN)
    assert str(err.value) == f"{message} (Megatron-Core's rule)"


def test_dispatched_tokens_are_sorted_by_local_expert_and_back_in_each_pass():
    """Megatron-Core's alltoall dispatcher: `sort_chunks_by_idxs` after the dispatch and
    before the combine (more than one local expert), read and write of T k tokens of h
    bf16 values and their fp32 probability; one local expert: none."""
    T, k, h = 4096, 8, 2048
    sort = 2 * T * k * (2 * h + 4)
    for ep, local in ((8, 16), (128, 1)):
        work = moe_layer_work(QWEN, settings(expert_model_parallel_size=ep, data_parallel_size=128))
        for passwork in (work.forward, work.backward):
            sorts = [b for b, kind in zip(passwork.kernels.bytes, passwork.kernels.kind, strict=True)
                     if kind == MEMORY and b == sort]
            assert len(sorts) == (2 if local > 1 else 0)
