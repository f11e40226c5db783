"""PyTorch FSDP2's own passes (`use_torch_fsdp2`) and torch.optim's foreach AdamW
(`optimizer_impl foreach`) against closed forms read from torch's FSDP2 (1963fc8-era
`_fsdp_collectives.py`, `_fsdp_param_group.py`, `_fsdp_state.py`) and torchtitan 9dec370
(`apply_fsdp`, `clip_grad_norm_`, `build_optimizers`); the settings' rules with their
exact messages."""

import math

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel, StrategyError
from paraplan.core.comm import Group
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import OPTIMIZER_KERNELS, kernel_times_by_pass, price, run_structure
from paraplan.predict.calibration import load_calibration
from paraplan.predict.device_model import DeviceEfficiency, memory_time_s
from paraplan.predict.fsdp2_passes import (
    copy_in_bytes_per_element,
    grad_bytes_per_element,
    optimizer_kernels,
    optimizer_step_bytes,
)
from paraplan.predict.fsdp_ops import paired_s
from paraplan.predict.pass_times import pass_times
from paraplan.predict.predictor import predict_settings

GPT = TransformerModel("gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                       vocab_size=50257)
A100 = load_cluster("dgx-a100")  # 8 GPUs per node
COMM = ConstantBandwidthModel(100e9, 20e9)
EFF = DeviceEfficiency(comm_overlap_contention=0.25)  # no host time: an op's time is its device time
IN_NODE = 24 / 108  # ZeRO-3's collectives inside a DGX A100 node: 24 NCCL CTAs of 108 SMs (`overlap_share`)
L = GPT.layer_params  # one FSDP unit (a transformer block), whole on the rank (t = 1)
ROOT = GPT.embedding_params() + GPT.norm_params  # the root unit: embedding, final norm (tied head)
N = GPT.num_layers


def fsdp2(**kw) -> RunSettings:
    base = dict(data_parallel_size=8, micro_batch_size=1, global_batch_size=8, zero_stage=3, use_torch_fsdp2=True)
    return RunSettings(**{**base, **kw})


def priced(settings):
    st = run_structure(GPT, settings, A100, COMM)
    kernels = kernel_times_by_pass([st], EFF)[0]
    return st, pass_times(st, kernels, EFF), price(st, kernels, EFF)


def mem(nbytes: float, speed, kernels: int = 1) -> float:
    return memory_time_s(nbytes, speed, EFF, kernels)


def test_bytes_per_element_are_the_copies_fsdp2_runs():
    """Copy-in: fp32 shard cast to w bytes, then copied into the all-gather input: 4 + w +
    2w. Gradients: bf16 cast into the fp32 reduce-scatter input, 2 + 4; accumulated over M
    micro-batches in fp32: 6 + (M - 1)(4 + 2 + 4) + 8 per iteration; in bf16 autograd adds
    in place, (M - 1) 3 x 2, and the copy-in 2 x 2."""
    assert copy_in_bytes_per_element(2, 4) == 10
    assert copy_in_bytes_per_element(1, 4) == 7  # torchao's float8 all-gather: the fp8 copies
    assert copy_in_bytes_per_element(2, 2) == 4  # bf16 shards: no cast, the copy into the input alone
    assert copy_in_bytes_per_element(1, 2) == 5  # bf16 shards cast to fp8: 2 + 1, then 1 + 1
    assert grad_bytes_per_element(2, 4, 1, False) == 6
    assert grad_bytes_per_element(2, 4, 8, True) == 6  # every micro-batch reduces its own
    assert grad_bytes_per_element(2, 4, 8, False) == pytest.approx((6 + 7 * 10 + 8) / 8)
    assert grad_bytes_per_element(2, 2, 4, False) == pytest.approx((3 * 3 * 2 + 4) / 4)


def test_the_passes_of_one_unit_and_of_the_root_in_bytes():
    st = run_structure(GPT, fsdp2(), A100, COMM)
    assert st.fsdp is not None and st.fsdp.fsdp2 is not None
    f = st.fsdp.fsdp2
    assert f.layer_copy_in_bytes == pytest.approx(10 * L / 8)  # per shard element, 1/8 of the unit
    assert f.layer_copy_out_bytes == pytest.approx(4 * L)  # split_with_sizes_copy: read 2, write 2
    assert f.layer_grad_bytes == pytest.approx(6 * L)  # chunk_cat: read bf16, write fp32
    assert f.root_copy_out_bytes[0] == pytest.approx(4 * ROOT)
    assert f.root_grad_bytes[0] == pytest.approx(6 * ROOT)
    assert f.last_unit_kept and f.root_after_backward and f.gathers_per_layer
    # the root unit's fp32 reduce-scatter follows the backward (no clip all-reduce: fused optimizer)
    assert f.after_backward_comm_s[0] == pytest.approx(COMM.time_s("reduce_scatter", 4 * ROOT, Group(8, 1)))
    plain = run_structure(GPT, fsdp2(use_torch_fsdp2=False), A100, COMM).fsdp
    assert plain is not None and plain.fsdp2 is None


def test_forward_adds_the_copy_ins_to_each_gather_and_a_copy_out_per_unit():
    """Forward of n layers: n pair(a + c_in, g) + (a + c_in) + (a_root + c_in_root) + n
    c_out + c_out_root, against plain ZeRO-3's n pair(a, g) + a + a_root."""
    st, times, em = priced(fsdp2())
    _, _, plain = priced(fsdp2(use_torch_fsdp2=False))
    a = COMM.time_s("all_gather", L * 2, Group(8, 1))
    root = COMM.time_s("all_gather", ROOT * 2, Group(8, 1))
    c_in, c_in_root = mem(10 * L / 8, st.speed, 2), mem(10 * ROOT / 8, st.speed, 2)
    c_out, c_out_root = mem(4 * L, st.speed), mem(4 * ROOT, st.speed)
    g_f = times.device_s[0]
    ours = N * paired_s(a + c_in, g_f, IN_NODE) + a + c_in + root + c_in_root + N * c_out + c_out_root
    theirs = N * paired_s(a, g_f, IN_NODE) + a + root
    assert em.costs.fwd_s[0] - plain.costs.fwd_s[0] == pytest.approx(ours - theirs, rel=1e-9)


def test_backward_keeps_the_root_and_the_last_block_and_copies_each_gradient_in():
    """torchtitan's default: the root unit and the last block stay gathered, so the
    backward exposes no gather and copies out n - 1 units; every unit's gradient is
    copied into the fp32 reduce-scatter input (6 bytes per parameter)."""
    st, times, em = priced(fsdp2())
    _, _, plain = priced(fsdp2(use_torch_fsdp2=False))
    a = COMM.time_s("all_gather", L * 2, Group(8, 1))
    root = COMM.time_s("all_gather", ROOT * 2, Group(8, 1))
    c_in = mem(10 * L / 8, st.speed, 2)
    g_b = times.device_s[1] + times.device_s[2]
    ours = N * paired_s(a + c_in, g_b, IN_NODE) + (N - 1) * mem(4 * L, st.speed) + N * mem(6 * L, st.speed)
    theirs = N * paired_s(a, g_b, IN_NODE) + a + root
    assert em.costs.bwd_s[0] - plain.costs.bwd_s[0] == pytest.approx(ours - theirs, rel=1e-9)


def test_resharding_every_block_gathers_the_last_one_again():
    """`fsdp_reshard_after_forward always`: the last block's gather is exposed at the start
    of the backward and its copy-out is paid; the root unit is still kept (FSDP2's root)."""
    st, _, em = priced(fsdp2(fsdp_reshard_after_forward="always"))
    _, _, kept = priced(fsdp2())
    assert st.fsdp is not None and st.fsdp.fsdp2 is not None and not st.fsdp.fsdp2.last_unit_kept
    a = COMM.time_s("all_gather", L * 2, Group(8, 1))
    extra = a + mem(10 * L / 8, st.speed, 2) + mem(4 * L, st.speed)
    assert em.costs.bwd_s[0] - kept.costs.bwd_s[0] == pytest.approx(extra, rel=1e-9)


def test_the_root_unit_is_reduced_after_the_layers_buckets():
    """The layers' buckets carry only the blocks (one per unit); the root's reduce-scatter
    and its copy-in come after the backward, with the optimizer step."""
    st, _, em = priced(fsdp2())
    layer_rs = COMM.time_s("reduce_scatter", 4 * L, Group(8, 1))
    assert len(em.grad_sync[0].bucket_s) == N
    np.testing.assert_allclose(em.grad_sync[0].bucket_s, layer_rs, rtol=1e-9)
    root_rs = COMM.time_s("reduce_scatter", 4 * ROOT, Group(8, 1))
    step = mem((N * L + ROOT) / 8 * 42, st.speed, OPTIMIZER_KERNELS)  # Megatron's fused step (placement.Precision)
    assert em.after_sync_s[0] == pytest.approx(root_rs + step + mem(6 * ROOT, st.speed), rel=1e-9)


def test_foreach_adamw_reads_and_writes_92_bytes_per_parameter_and_all_reduces_the_norm():
    """clip_grad_norm_ (norm 4, clip 4 + 4) and AdamW's eight foreach passes (80) on fp32
    shards, each pass a multi_tensor_apply launch per 320 x 65,536 elements; the total
    norm is all-reduced over the data-parallel mesh."""
    s = fsdp2(optimizer_impl="foreach")
    assert optimizer_step_bytes(s, 38) == 92
    assert optimizer_step_bytes(fsdp2(), 38) == 38
    assert optimizer_kernels(s, 1e9, OPTIMIZER_KERNELS) == 10 * math.ceil(1e9 / (320 * 65536))
    st, _, em = priced(s)
    params = (N * L + ROOT) / 8
    root_rs = COMM.time_s("reduce_scatter", 4 * ROOT, Group(8, 1))
    clip = COMM.time_s("all_reduce", 4, Group(8, 1))
    step = mem(params * 92, st.speed, optimizer_kernels(s, params, OPTIMIZER_KERNELS))
    assert em.after_sync_s[0] == pytest.approx(root_rs + clip + step + mem(6 * ROOT, st.speed), rel=1e-9)


def test_the_shards_gradients_and_moments_are_kept_in_the_parameters_dtype():
    """FSDP2's sharded parameters are the optimizer's own: fp32 ones (torchtitan) keep 4 +
    4 + 8 = 16 bytes per parameter over the 8 ranks, bf16 ones (NeMo AutoModel) 2 + 2 + 4
    = 8, where ZeRO-3 without FSDP2 keeps Megatron's 2 + 4 + 12; the gathers still move
    bf16 weights and the reduce-scatters fp32 gradients, and the bf16 shards are copied
    into the gathers without a cast and stepped at half the bytes."""
    shard = (N * L + ROOT) / 8
    for settings, kept in ((fsdp2(), (4, 4, 8)), (fsdp2(fsdp_param_dtype="bf16"), (2, 2, 4)),
                           (fsdp2(use_torch_fsdp2=False), (2, 4, 12))):
        st = run_structure(GPT, settings, A100, COMM)
        rank = st.memory[0]
        lazy = 0.0 if rank.lazy_gradient_bytes_per_chunk is None else rank.lazy_gradient_bytes_per_chunk.sum()
        got = (rank.weights_bytes, rank.gradients_bytes + lazy, rank.optimizer_bytes)
        np.testing.assert_allclose(got, np.array(kept) * shard, rtol=1e-12)
        # FSDP2's gradients come and go with zero_grad: allocated in the backward, not kept
        assert (rank.gradients_bytes == 0) == settings.use_torch_fsdp2
    st = run_structure(GPT, fsdp2(fsdp_param_dtype="bf16"), A100, COMM)
    assert st.fsdp is not None and st.fsdp.fsdp2 is not None
    assert st.fsdp.fsdp2.layer_copy_in_bytes == pytest.approx(4 * L / 8)
    assert st.fsdp.layer_gather_s == pytest.approx(
        run_structure(GPT, fsdp2(), A100, COMM).fsdp.layer_gather_s)  # type: ignore[union-attr]
    assert optimizer_step_bytes(fsdp2(fsdp_param_dtype="bf16", optimizer_impl="foreach"), 38) == 46
    assert optimizer_step_bytes(fsdp2(fsdp_param_dtype="bf16"), 42) == 21


def test_a_stage_gathered_once_per_iteration_accumulates_in_fp32_and_copies_once():
    """Under pipelines (weights kept to the last backward) FSDP2 gathers each stage once:
    its copy-in and copy-out once per iteration, after the step; each micro-batch's
    backward adds its gradients into the fp32 accumulator."""
    s = fsdp2(pipeline_model_parallel_size=2, data_parallel_size=4, global_batch_size=16)
    st, _, _ = priced(s)
    assert st.fsdp is not None and st.fsdp.fsdp2 is not None
    f = st.fsdp.fsdp2
    m = s.num_microbatches
    assert m == 4 and not f.gathers_per_layer and not f.last_unit_kept
    assert f.layer_grad_bytes == pytest.approx((6 + (m - 1) * 10 + 8) / m * L)
    fwd, bwd = st.fsdp.fsdp2_stage_s(np.array([4.0, 4.0]), np.zeros(2), st.speed, EFF)
    np.testing.assert_allclose(fwd, 0.0)
    np.testing.assert_allclose(bwd, 4 * mem(f.layer_grad_bytes, st.speed))


@pytest.mark.parametrize("kw, message", [
    (dict(zero_stage=1), "use_torch_fsdp2 needs zero_stage 3 (FSDP2 shards weights, gradients and optimizer "
                         "state), got zero_stage 1"),
    (dict(use_torch_fsdp2=False, optimizer_impl="foreach"),
     "optimizer_impl foreach is priced on FSDP2's sharded weights: it needs use_torch_fsdp2 true"),
    (dict(optimizer_impl="sgd"), "optimizer_impl 'sgd' is not one of fused, foreach"),
    (dict(fsdp_param_dtype="fp16"), "fsdp_param_dtype 'fp16' is not one of fp32, bf16"),
    (dict(use_torch_fsdp2=False, fsdp_param_dtype="bf16"),
     "fsdp_param_dtype bf16 is the dtype FSDP2 keeps its sharded parameters in: it needs use_torch_fsdp2 true "
     "(Megatron-LM's own optimizers keep fp32 main params)"),
    (dict(fsdp_param_dtype="bf16", dtype="fp32"),
     "fsdp_param_dtype bf16 with dtype fp32: expected dtype bf16 or fp8 (bf16 parameters computed in a wider dtype "
     "are not modelled)"),
])
def test_settings_rules(kw, message):
    with pytest.raises(StrategyError) as info:
        fsdp2(**kw).check(GPT)
    assert str(info.value) == message


def test_zero_grad_frees_the_sharded_gradients_until_the_backward():
    """torchtitan and NeMo AutoModel call `optimizer.zero_grad()` (set_to_none) before the
    forward, so FSDP2's sharded gradients are absent at the end of the forward, the peak of
    one micro-batch, and back (4 bytes per parameter over the 8 ranks) once the backward has
    freed the activations. ZeRO-3 without FSDP2 (Megatron's persistent gradient buffer)
    holds them at the peak. Under 1F1B over two stages the first stage holds two
    micro-batches after its second forward: with two micro-batches that is before its first
    backward, without gradients; with four, again after its third forward, beside the
    unsharded fp32 gradients it accumulates from its first backward on (FSDP2 under
    pipelines reduces after the last micro-batch), whose shards replace them only after."""
    cal = load_calibration()
    shard = 4 * (N * L + ROOT) / 8
    (torch_fsdp, _), (megatron, _) = predict_settings(
        GPT, [fsdp2(), fsdp2(use_torch_fsdp2=False, overlap_grad_reduce=True)], A100, cal.comm_model(A100),
        cal.efficiency)
    at = torch_fsdp.memory_at_peak
    assert at.gradient_accumulator_bytes[0] == 0
    assert at.state_bytes[0] == pytest.approx((4 + 8) * (N * L + ROOT) / 8)
    assert megatron.memory_at_peak.state_bytes[0] == pytest.approx((2 + 4 + 12) * (N * L + ROOT) / 8)
    st = run_structure(GPT, fsdp2(), A100, COMM)
    assert st.memory[0].lazy_gradient_bytes_per_chunk.sum() == pytest.approx(shard)
    assert st.memory[0].iteration_end_bytes == pytest.approx(shard)
    pp = [fsdp2(pipeline_model_parallel_size=2, data_parallel_size=4, micro_batch_size=8, global_batch_size=32 * m)
          for m in (2, 4)]  # a micro-batch's activations (1.1 GB) outweigh the stage's gradients
    (two, _), (four, _) = predict_settings(GPT, pp, A100, cal.comm_model(A100), cal.efficiency)
    first_stage = N // 2 * L + GPT.embedding_params()
    assert two.memory_at_peak.gradient_accumulator_bytes[0] == 0
    assert four.memory_at_peak.gradient_accumulator_bytes[0] == pytest.approx(4 * first_stage)
