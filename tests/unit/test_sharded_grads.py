"""Sharded gradients (ZeRO-2 and 3) with pipeline parallelism: reduce-scattered after
every micro-batch (Megatron-FSDP `optim_grads`) or accumulated unsharded and
reduce-scattered once after the last (FSDP2 under PyTorch's pipeline schedules, Meta's
Llama 3 405B), against hand-derived closed forms (docs/fsdp.md)."""

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel
from paraplan.core.comm import Group
from paraplan.core.run_settings import RunSettings
from paraplan.core.sharding import reduces_every_microbatch
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import kernel_times_by_pass, price, run_structure
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.fsdp_ops import paired_s
from paraplan.predict.pass_times import pass_times

GPT = TransformerModel("gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                       vocab_size=50257)
A100 = load_cluster("dgx-a100")  # 8 GPUs per node
COMM = ConstantBandwidthModel(100e9, 20e9)
EFF = DeviceEfficiency(comm_overlap_contention=0.25)
IN_NODE = 24 / 108  # ZeRO-3's collectives inside a DGX A100 node: 24 NCCL CTAs of 108 SMs (`overlap_share`)
G = 4  # fp32 gradients, bytes per parameter


def zero2(**kw) -> RunSettings:
    base = dict(data_parallel_size=8, pipeline_model_parallel_size=2, micro_batch_size=1, global_batch_size=32,
                zero_stage=2, overlap_grad_reduce=True)
    return RunSettings(**{**base, **kw})


def priced(settings):
    st = run_structure(GPT, settings, A100, COMM)
    kernels = kernel_times_by_pass([st], EFF)[0]
    return st, pass_times(st, kernels, EFF), price(st, kernels, EFF)


def test_the_default_moment_is_every_micro_batch_for_zero2_and_the_last_for_zero3():
    assert reduces_every_microbatch(zero2())
    assert not reduces_every_microbatch(zero2(zero_stage=3))
    assert not reduces_every_microbatch(zero2(sharded_grad_reduce="last_microbatch"))
    assert reduces_every_microbatch(zero2(zero_stage=3, sharded_grad_reduce="every_microbatch"))
    assert not reduces_every_microbatch(zero2(zero_stage=1, use_distributed_optimizer=True))


def test_every_micro_batch_pairs_each_layers_backward_with_its_reduce_scatter():
    """A chunk of n layers: n pair(s, g_b) + s (its last layer's reduce-scatter) + the
    root unit's; the forward unchanged; nothing left to reduce after the last backward."""
    s = zero2()
    s.check(GPT)
    st, times, em = priced(s)
    _, _, once = priced(zero2(sharded_grad_reduce="last_microbatch"))
    group = Group(8, 1)
    scatter = COMM.time_s("reduce_scatter", GPT.layer_params * G, group)
    assert st.fsdp is not None and not st.fsdp.gathers and st.fsdp.layer_scatter_s == pytest.approx(scatter)
    g_b = times.device_s[1] + times.device_s[2]
    n = GPT.num_layers // 2
    root_first = COMM.time_s("reduce_scatter", GPT.embedding_params() * G, group)
    added = n * (paired_s(scatter, g_b, IN_NODE) - g_b) + scatter + root_first
    assert em.costs.bwd_s[0] - once.costs.bwd_s[0] == pytest.approx(added, rel=1e-9)
    np.testing.assert_allclose(em.costs.fwd_s, once.costs.fwd_s)
    assert all(sync.bucket_s.size == 0 for sync in em.grad_sync)
    assert all(sync.bucket_s.size > 0 for sync in once.grad_sync)


def test_every_micro_batch_holds_the_fp32_shard_and_the_unit_reducing_beside_a_layer():
    """max(u, r) + u unsharded: the root unit (larger than a layer here) or a layer being
    reduce-scattered, and the layer the backward produces beside it."""
    st, _, _ = priced(zero2())
    stage0, u = st.rank_params[0], GPT.layer_params
    assert GPT.embedding_params() > u
    assert st.memory[0].gradients_bytes == pytest.approx(stage0 * G / 8)
    assert st.memory[0].working_bytes == pytest.approx((GPT.embedding_params() + u) * G)
    head = st.rank_params[1] - 4 * u  # final norm (the tied output layer is the embedding's)
    assert st.memory[1].working_bytes == pytest.approx((max(u, head) + u) * G)


def test_reducing_after_the_last_micro_batch_holds_the_stage_unsharded_from_its_first_backward():
    """FSDP2 under pipelines: the micro-batches accumulate the whole stage's gradient in
    fp32 (P g) beside the fp32 shard (P g / N), allocated by each chunk's first backward.
    No working set but the last stage's loss, its 16-bit logits for a moment (`loss_ops`)."""
    st, _, _ = priced(zero2(sharded_grad_reduce="last_microbatch"))
    loss = 2 * GPT.seq_length * GPT.padded_vocab_size(1)
    for s in range(2):
        n = st.rank_params[s]
        assert st.memory[s].gradients_bytes == pytest.approx(n * G / 8)
        assert st.memory[s].working_bytes == (loss if s == 1 else 0.0)
        assert st.memory[s].lazy_gradient_bytes_per_chunk == pytest.approx([n * G])


def test_lazy_gradients_join_the_activations_after_the_first_backward():
    """1F1B, 2 stages, 4 micro-batches of activation a, gradients G allocated by the
    first backward: stage 0 holds 2a at its first backward, then a + G after it and
    2a + G at the next forward; stage 1 (warmup 0) a, then G, then a + G. All-forward-
    first (GPipe) holds 4a before any gradient, then 3a + G. (Activations, gradients)
    held at the peak of their sum."""
    from paraplan.sim.rank_peak import peak_with_lazy_gradients as _peak_with_lazy_gradients
    from paraplan.sim.schedules import BWD, cached_orders
    a, g = 1.0, 10.0
    orders = cached_orders("1f1b", 2, 4, 1, 1)
    peaks = [_peak_with_lazy_gradients(o, np.array([a]), np.array([g]), BWD) for o in orders]
    assert peaks == [(2 * a, g), (a, g)]
    gpipe = cached_orders("gpipe", 2, 4, 1, 1)
    assert _peak_with_lazy_gradients(gpipe[0], np.array([a]), np.array([g]), BWD) == (3 * a, g)
    assert _peak_with_lazy_gradients(gpipe[0], np.array([a]), np.array([0.5]), BWD) == (4 * a, 0.0)


def test_zero3_under_pipelines_keeping_the_weights_gathers_each_stage_once_per_iteration():
    """PyTorch's pipeline stages keep the gathered weights to the last backward: no
    gather beside any micro-batch's layers; the stage's weights gathered once, after the
    step, like the distributed optimizer's parameter all-gather (hidden with
    overlap_param_gather)."""
    kept = zero2(zero_stage=3)
    st, _, em = priced(kept)
    _, _, dist_opt = priced(zero2(zero_stage=1, use_distributed_optimizer=True, sharded_grad_reduce="default"))
    assert st.fsdp is not None and st.fsdp.layer_gather_s == 0.0 and not st.fsdp.reshard_after_forward
    np.testing.assert_allclose(em.costs.fwd_s, dist_opt.costs.fwd_s)
    np.testing.assert_allclose(em.costs.bwd_s, dist_opt.costs.bwd_s)
    gather = [COMM.time_s("all_gather", n * 2, Group(8, 1)) for n in st.rank_params]
    exchange = st.embedding_exchange_s  # the tied embedding's gradient all-reduce, first and last stage
    assert exchange > 0
    np.testing.assert_allclose(st.after_sync_comm_s, np.array(gather) + exchange)
    hidden, _, _ = priced(zero2(zero_stage=3, overlap_param_gather=True))
    np.testing.assert_allclose(hidden.after_sync_comm_s, exchange)
    # every micro-batch reduced: the stage reshards after each backward and gathers again
    again, _, _ = priced(zero2(zero_stage=3, sharded_grad_reduce="every_microbatch"))
    assert again.fsdp is not None and again.fsdp.layer_gather_s > 0.0


def test_run_table_reads_megatron_fsdp_optim_grads_with_pipelines_and_the_reduce_moment(tmp_path):
    from paraplan.core.errors import InputFileError
    from paraplan.predict.runtable import read_run_table
    path = tmp_path / "runs.csv"
    header = ("num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,tensor_model_parallel_size,"
              "pipeline_model_parallel_size,data_parallel_size,global_batch_size,data_parallel_sharding_strategy,"
              "sharded_grad_reduce\n")
    path.write_text(header + "8,1024,16,1024,50257,1,2,8,32,optim_grads,last_microbatch\n", encoding="utf-8")
    _, rows = read_run_table(path)
    s = rows[0].settings
    assert (s.zero_stage, s.pipeline_model_parallel_size, s.sharded_grad_reduce) == (2, 2, "last_microbatch")
    s.check(rows[0].model)
    path.write_text(header + "8,1024,16,1024,50257,1,2,8,32,optim_grads,sometimes\n", encoding="utf-8")
    with pytest.raises(InputFileError) as err:
        read_run_table(path)
    assert str(err.value) == (f"{path}:2: column 'sharded_grad_reduce': expected one of default, every_microbatch, "
                              "last_microbatch, got 'sometimes'")
