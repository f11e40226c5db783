"""ZeRO-3 as FSDP2 runs it (per-layer gathers prefetched beside the compute, per-layer
reduce-scatter buckets) and hybrid sharding, against hand-derived closed forms; the
sharding settings' rules with their exact messages."""

from dataclasses import replace

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel, StrategyError
from paraplan.core.comm import Group
from paraplan.core.errors import InputFileError
from paraplan.core.run_settings import RunSettings
from paraplan.core.sharding import replicate_degree, reshards_after_forward, sharding_group_size
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import kernel_times_by_pass, price, run_structure
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.fsdp_ops import paired_s
from paraplan.predict.models import PRESETS
from paraplan.predict.pass_times import pass_times
from paraplan.predict.runtable import read_run_table

GPT = TransformerModel("gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                       vocab_size=50257)
A100 = load_cluster("dgx-a100")  # 8 GPUs per node
COMM = ConstantBandwidthModel(100e9, 20e9)
EFF = DeviceEfficiency(comm_overlap_contention=0.25)  # no host time: an op's time is its device time
IN_NODE = 24 / 108  # ZeRO-3's collectives inside a DGX A100 node: 24 NCCL CTAs of 108 SMs (`overlap_share`)
W, G = 2, 4  # bf16 weights, fp32 gradients (bytes per parameter)


def fsdp(**kw) -> RunSettings:
    base = dict(data_parallel_size=8, micro_batch_size=1, global_batch_size=8, zero_stage=3)
    return RunSettings(**{**base, **kw})


def priced(settings, model=GPT):
    st = run_structure(model, settings, A100, COMM)
    kernels = kernel_times_by_pass([st], EFF)[0]
    return st, pass_times(st, kernels, EFF), price(st, kernels, EFF)


def test_a_collective_beside_compute_takes_the_longer_plus_contention_times_the_shorter():
    assert paired_s(3.0, 5.0, 0.25) == pytest.approx(5.0 + 0.25 * 3.0)
    assert paired_s(5.0, 3.0, 0.25) == pytest.approx(5.0 + 0.25 * 3.0)
    assert paired_s(2.0, 7.0, 0.0) == pytest.approx(7.0)


def test_zero3_forward_is_each_layer_beside_the_next_gather_plus_the_first_gathers():
    """n layers of forward g beside gathers a: n pair(a, g) + a + the root unit's gather
    (embedding and norm: torchtitan's root FSDP unit)."""
    st3, times, em3 = priced(fsdp())
    _, _, em0 = priced(fsdp(zero_stage=1))
    a = COMM.time_s("all_gather", GPT.layer_params * W, Group(8, 1))
    root = COMM.time_s("all_gather", (GPT.embedding_params() + GPT.norm_params) * W, Group(8, 1))
    assert st3.fsdp is not None and st3.fsdp.layer_gather_s == pytest.approx(a)
    g_f, g_b = times.device_s[0], times.device_s[1] + times.device_s[2]
    n = GPT.num_layers
    fwd = n * (paired_s(a, g_f, IN_NODE) - g_f) + a + root
    bwd = n * (paired_s(a, g_b, IN_NODE) - g_b) + a + root  # resharded after the forward: gathered again
    assert em3.costs.fwd_s[0] - em0.costs.fwd_s[0] == pytest.approx(fwd, rel=1e-9)
    assert em3.costs.bwd_s[0] - em0.costs.bwd_s[0] == pytest.approx(bwd, rel=1e-9)


def test_keeping_the_weights_after_the_forward_gathers_nothing_in_the_backward():
    _, _, kept = priced(fsdp(fsdp_reshard_after_forward="never"))
    _, _, em0 = priced(fsdp(zero_stage=1))
    assert kept.costs.bwd_s[0] == pytest.approx(em0.costs.bwd_s[0], rel=1e-12)
    assert not reshards_after_forward(fsdp(pipeline_model_parallel_size=2))  # torchtitan's default with PP
    assert reshards_after_forward(fsdp())


def test_zero3_reduce_scatters_one_bucket_per_layer_beside_the_backward():
    st, _, em = priced(fsdp())
    params = st.rank_params[0]  # 8 layers, embedding, final norm
    one = COMM.time_s("reduce_scatter", params / GPT.num_layers * G, Group(8, 1))
    sync = st.grad_sync[0]
    assert len(sync.bucket_s) == GPT.num_layers
    assert sync.bucket_s == pytest.approx([one] * GPT.num_layers)
    assert em.overlap_grad_reduce


def test_zero3_memory_is_the_sharded_state_plus_the_gathered_units_and_the_largest_gradient():
    """Resharding: (2 + 4 + 12) P / 8 sharded, plus the root unit (embedding, final norm:
    r) and two layers (u) gathered and the largest unit's gradient, (r + 2 u) w +
    max(u, r) g; keeping the weights: P w + max(u, r) g."""
    st, _, _ = priced(fsdp())
    params, unit = st.rank_params[0], GPT.layer_params
    root = GPT.embedding_params() + GPT.norm_params
    assert root > unit  # GPT-2's 50,257-token embedding outweighs a 1,024-wide layer
    mem = st.memory[0]
    assert mem.weight_state_bytes == pytest.approx(18 * params / 8)
    assert mem.working_bytes == pytest.approx((root + 2 * unit) * W + root * G)
    kept, _, _ = priced(fsdp(fsdp_reshard_after_forward="never"))
    assert kept.memory[0].working_bytes == pytest.approx(params * W + root * G)
    # a pipeline's middle stage holds no root unit: two layers and one layer's gradient
    mid = run_structure(GPT, fsdp(pipeline_model_parallel_size=4, fsdp_reshard_after_forward="always"), A100, COMM)
    assert mid.memory[1].working_bytes == pytest.approx(unit * (2 * W + G))
    # several micro-batches: the stage's unsharded gradients wait for the last one, P g, held from
    # the first backward on (autograd allocates them), not in the working set, whose larger moment is
    # then the loss's: the gathered weights beside its transient, the 16-bit logits (`loss_ops`)
    accumulating, _, _ = priced(fsdp(global_batch_size=32))
    logits = GPT.seq_length * GPT.padded_vocab_size(1)
    assert accumulating.memory[0].working_bytes == pytest.approx((root + 2 * unit) * W + 2 * logits)
    assert accumulating.memory[0].lazy_gradient_bytes_per_chunk == pytest.approx([params * G])


def test_hybrid_sharding_shards_inside_a_node_and_all_reduces_each_shard_over_the_replicas():
    """16 ranks on two 8-GPU nodes, shard 8 x replicate 2: state / 8; each bucket a
    reduce-scatter inside the node, then its 1/8 all-reduced over the 2 nodes."""
    s = fsdp(data_parallel_size=16, global_batch_size=16, data_parallel_shard_degree=8)
    assert (sharding_group_size(s), replicate_degree(s)) == (8, 2)
    st, _, _ = priced(s)
    params = st.rank_params[0]
    assert st.memory[0].weight_state_bytes == pytest.approx(18 * params / 8)
    bucket = params / GPT.num_layers * G
    one = (COMM.time_s("reduce_scatter", bucket, Group(8, 1))
           + COMM.time_s("all_reduce", bucket / 8, Group(2, 2)))
    assert st.grad_sync[0].bucket_s == pytest.approx([one] * GPT.num_layers)
    assert st.fsdp is not None
    assert st.fsdp.layer_gather_s == pytest.approx(COMM.time_s("all_gather", GPT.layer_params * W, Group(8, 1)))
    full, _, _ = priced(replace(s, data_parallel_shard_degree=0))  # FSDP over all 16
    assert full.memory[0].weight_state_bytes == pytest.approx(18 * params / 16)


def test_megatron_optimizer_instances_shard_the_optimizer_inside_each_instance():
    s = RunSettings(data_parallel_size=16, micro_batch_size=1, global_batch_size=16, use_distributed_optimizer=True,
                    num_distributed_optimizer_instances=2)
    st = run_structure(GPT, s, A100, COMM)
    params = st.rank_params[0]
    assert st.memory[0].weight_state_bytes == pytest.approx((2 + 4 + 12 / 8) * params)
    # the weights are all-gathered inside the instance after the step
    assert st.after_sync_comm_s[0] == pytest.approx(COMM.time_s("all_gather", params * W, Group(8, 1)))


def test_zero3_with_experts_shards_them_over_the_expert_data_parallel_group():
    model = PRESETS["mixtral-8x7b"]
    s = fsdp(expert_model_parallel_size=2)  # 8 ranks: EP 2 x expert-DP 4
    st = run_structure(model, s, load_cluster("dgx-h100"), COMM)
    experts = st.expert_rank_params
    assert experts is not None
    dense = st.rank_params[0]
    expected = W * (dense / 8 + experts[0] / 4) + G * (dense / 8 + experts[0] / 4) + 12 * (dense / 8 + experts[0] / 4)
    assert st.memory[0].weight_state_bytes == pytest.approx(expected)
    unit_experts = model.num_experts * model.expert_params / 2
    unit_dense = model.moe_layer_params - model.num_experts * model.expert_params
    assert st.fsdp is not None
    assert st.fsdp.moe_layer_gather_s == pytest.approx(COMM.time_s("all_gather", unit_dense * W, Group(8, 1))
                                                       + COMM.time_s("all_gather", unit_experts * W, Group(4, 1)))


def test_hybrid_sharding_splits_the_experts_over_edp_over_r_and_all_reduces_each_shard_over_the_replicas():
    """16 ranks on two 8-GPU nodes, EP 2: the expert-data-parallel group is 8 ranks, every
    2nd (0, 2, ..., 14); shard 8 x replicate 2 splits it into 2 copies of a 4-rank shard
    group (ranks 0-6, one node) whose replicas sit 8 ranks apart (the other node), as
    Megatron-Core's intra- and inter-partial expert-data-parallel groups. The experts'
    state is / 4, their gathers over the 4 ranks, their gradient buckets reduce-scattered
    over them and each 1/4 all-reduced over the 2 nodes."""
    model = PRESETS["mixtral-8x7b"]
    s = fsdp(data_parallel_size=16, global_batch_size=16, data_parallel_shard_degree=8, expert_model_parallel_size=2)
    assert s.expert_data_parallel_size == 8 and s.expert_optimizer_shards == 4
    s.check(model)
    st = run_structure(model, s, A100, COMM)
    experts, dense = st.expert_rank_params, st.rank_params[0]
    assert experts is not None
    assert st.memory[0].weight_state_bytes == pytest.approx((W + G + 12) * (dense / 8 + experts[0] / 4))
    assert st.fsdp is not None and st.fsdp.expert_ranks == 4
    unit_experts = model.num_experts * model.expert_params / 2
    unit_dense = model.moe_layer_params - model.num_experts * model.expert_params
    assert st.fsdp.moe_layer_gather_s == pytest.approx(COMM.time_s("all_gather", unit_dense * W, Group(8, 1))
                                                       + COMM.time_s("all_gather", unit_experts * W, Group(4, 1)))
    bucket = experts[0] / model.num_layers * G  # one MoE layer's experts: one FSDP unit's bucket
    one = COMM.time_s("reduce_scatter", bucket, Group(4, 1)) + COMM.time_s("all_reduce", bucket / 4, Group(2, 2))
    assert np.sum(np.isclose(st.grad_sync[0].bucket_s, one, rtol=1e-12)) == model.num_layers
    # without the replicas the experts are split over all 8 expert-data-parallel ranks
    whole = run_structure(model, replace(s, data_parallel_shard_degree=0), A100, COMM)
    assert whole.memory[0].weight_state_bytes == pytest.approx((W + G + 12) * (dense / 16 + experts[0] / 8))


def test_megatron_optimizer_instances_split_the_experts_optimizer_inside_each_instance():
    """Megatron-Core's distributed optimizer with 2 instances, EP 2 on 16 ranks: the experts'
    Adam state over EDP / 2 = 4 ranks (the intra-partial expert-data-parallel group), and
    after the step their weights all-gathered over those 4 (one node), beside the dense
    weights' over 8."""
    model = PRESETS["mixtral-8x7b"]
    s = RunSettings(data_parallel_size=16, micro_batch_size=1, global_batch_size=16, use_distributed_optimizer=True,
                    num_distributed_optimizer_instances=2, expert_model_parallel_size=2)
    st = run_structure(model, s, A100, COMM)
    experts, dense = st.expert_rank_params, st.rank_params[0]
    assert experts is not None
    assert st.memory[0].weight_state_bytes == pytest.approx((2 + 4) * (dense + experts[0])
                                                            + 12 * (dense / 8 + experts[0] / 4))
    assert st.after_sync_comm_s[0] == pytest.approx(COMM.time_s("all_gather", dense * W, Group(8, 1))
                                                    + COMM.time_s("all_gather", experts[0] * W, Group(4, 1)))


def test_experts_on_one_expert_data_parallel_rank_are_neither_gathered_nor_held_unsharded():
    """EP 8 over the 8 data-parallel ranks: every rank holds its own experts whole, so a
    MoE unit gathers only its non-expert part and the accumulated unsharded gradients
    of several micro-batches are the dense ones alone."""
    model = PRESETS["mixtral-8x7b"]
    s = fsdp(expert_model_parallel_size=8, global_batch_size=16)  # 2 micro-batches
    st = run_structure(model, s, load_cluster("dgx-h100"), COMM)
    assert st.fsdp is not None and st.fsdp.expert_ranks == 1
    moe_dense = model.moe_layer_params - model.num_experts * model.expert_params
    assert st.fsdp.unit_params == pytest.approx(moe_dense)
    root = model.embedding_params() + model.output_params()  # embedding; final norm and LM head
    dense = st.rank_params[0]
    logits = model.seq_length * model.padded_vocab_size(1)  # the loss's moment: its 16-bit logits beside them
    assert st.memory[0].working_bytes == pytest.approx((root + 2 * moe_dense) * W + 2 * logits)
    assert st.memory[0].lazy_gradient_bytes_per_chunk == pytest.approx([dense * G])


@pytest.mark.parametrize(("kw", "message"), [
    ({"data_parallel_shard_degree": 4, "data_parallel_replicate_degree": 4},
     "data_parallel_shard_degree x data_parallel_replicate_degree = 4 x 4 is not data_parallel_size 8"),
    ({"data_parallel_shard_degree": 3}, "data_parallel_shard_degree 3 does not divide data_parallel_size 8"),
    ({"zero_stage": 0, "data_parallel_shard_degree": 4},
     "data_parallel_shard_degree / data_parallel_replicate_degree 4 / 2 need sharded state: a zero_stage "
     "(torchtitan's FSDP is zero_stage 3) or use_distributed_optimizer"),
    ({"zero_stage": 0, "num_distributed_optimizer_instances": 2},
     "num_distributed_optimizer_instances > 1 needs use_distributed_optimizer (Megatron-LM shards one optimizer "
     "instance per replica)"),
    ({"zero_stage": 1, "fsdp_reshard_after_forward": "never"},
     "fsdp_reshard_after_forward never needs zero_stage 3 (sharded weights), got zero_stage 1"),
    ({"zero_stage": 1, "sharded_grad_reduce": "last_microbatch"},
     "sharded_grad_reduce last_microbatch needs sharded gradients (zero_stage 2 or 3), got zero_stage 1"),
    ({"zero_stage": 2, "data_parallel_replicate_degree": 2},
     "sharded_grad_reduce every_microbatch with hybrid sharding or mixture-of-experts layers is not modelled"),
])
def test_sharding_settings_are_checked(kw, message):
    with pytest.raises(StrategyError) as err:
        fsdp(**kw).check(GPT)
    assert str(err.value).startswith(message)


def test_zero3_runs_with_pipeline_parallelism_as_fsdp2_does():
    """Accepted, not resharded after the forward (torchtitan's default under pipelines), and
    each stage's state sharded over its 8 data-parallel ranks: stage 0 holds 4 layers and
    the embeddings, stage 1 4 layers, the final norm and the untied head (padded vocabulary)."""
    s = fsdp(pipeline_model_parallel_size=2)
    s.check(GPT)
    st = run_structure(GPT, s, A100, COMM)
    assert st.fsdp is not None and not st.fsdp.reshard_after_forward and st.fsdp.shard_ranks == 8
    half = 4 * GPT.layer_params
    stages = [half + GPT.embedding_params(), half + GPT.norm_params + GPT.padded_vocab_size() * GPT.hidden_size]
    assert [m.weight_state_bytes for m in st.memory] == pytest.approx([(W + G + 12) * p / 8 for p in stages],
                                                                      rel=1e-12)


def _table(tmp_path, extra_header: str, extra_cells: str):
    path = tmp_path / "runs.csv"
    path.write_text("num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,tensor_model_parallel_size,"
                    f"pipeline_model_parallel_size,data_parallel_size,global_batch_size,{extra_header}\n"
                    f"8,1024,16,1024,50257,1,1,8,8,{extra_cells}\n", encoding="utf-8")
    return path


def test_run_table_reads_torchtitan_and_megatron_fsdp_names(tmp_path):
    _, rows = read_run_table(_table(tmp_path, "data_parallel_sharding_strategy,data_parallel_shard_degree,"
                                    "fsdp_reshard_after_forward", "optim_grads_params,4,never"))
    s = rows[0].settings
    assert (s.zero_stage, s.data_parallel_shard_degree, s.fsdp_reshard_after_forward) == (3, 4, "never")
    assert (sharding_group_size(s), replicate_degree(s)) == (4, 2)


def test_run_table_refuses_a_sharding_strategy_that_contradicts_zero_stage(tmp_path):
    path = _table(tmp_path, "data_parallel_sharding_strategy,zero_stage", "optim,3")
    with pytest.raises(InputFileError) as err:
        read_run_table(path)
    assert str(err.value) == (f"{path}:2: column 'data_parallel_sharding_strategy': data_parallel_sharding_strategy "
                              "optim is zero_stage 1, but zero_stage is 3")


def test_more_shards_hold_less_state_per_rank():
    """Each rank holds 1/k of every parameter's bf16 weight, fp32 gradient and fp32 Adam state
    (master copy, two moments): (2 + 4 + 12) bytes per parameter over a shard group of k."""
    params = GPT.layer_params * GPT.num_layers + GPT.embedding_params() + GPT.norm_params
    per_rank = [run_structure(GPT, fsdp(data_parallel_size=16, global_batch_size=16, data_parallel_shard_degree=k),
                              A100, COMM).memory[0].weight_state_bytes for k in (2, 4, 8, 16)]
    assert per_rank == pytest.approx([(W + G + 12) * params / k for k in (2, 4, 8, 16)], rel=1e-12)


def test_explain_puts_what_the_gathers_add_under_dp_comm_and_sums_to_the_iteration():
    """With no host time the host part is 0: the exposed and overlapped gathers are all
    `dp_comm`, and the parts still add up to the iteration."""
    from paraplan.predict.explain import explain_run

    s = fsdp(data_parallel_size=16, global_batch_size=16)  # FSDP over two nodes: the gathers show
    breakdown = explain_run(GPT, s, A100, COMM, EFF)
    assert breakdown.total_s == pytest.approx(breakdown.iteration_s, rel=1e-9)
    assert breakdown.seconds["host"] == pytest.approx(0.0, abs=1e-12)
    _, times, em = priced(s)
    st = run_structure(GPT, s, A100, COMM)
    assert st.fsdp is not None
    a, root = st.fsdp.layer_gather_s, float(st.fsdp.root_gather_s[0])
    g_f, g_b = times.device_s[0], times.device_s[1] + times.device_s[2]
    n = GPT.num_layers
    across = 32 / 108  # over two nodes: 32 CTAs
    assert st.overlap_shares.fsdp == across
    added = n * (paired_s(a, g_f, across) - g_f + paired_s(a, g_b, across) - g_b) + 2 * (a + root)
    reduced = float(em.grad_sync[0].bucket_s.sum())  # beside the backward, past it where it outlasts it
    assert breakdown.seconds["dp_comm"] >= added - 1e-12
    assert breakdown.seconds["dp_comm"] <= added + reduced + 1e-12
