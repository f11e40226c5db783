"""Tensor/sequence-parallel collectives, ZeRO and distributed-optimizer memory,
interleaving and the execution model's tail, against hand-derived values."""

from dataclasses import replace

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import Precision, build_execution, placement, run_structure
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.ops import layer_work
from paraplan.sim.engine import PipelineCosts
from paraplan.sim.execution import (
    ExecutionModel,
    GradSync,
    RankMemory,
    iteration_time_s,
    run_iteration,
)

GPT = TransformerModel("gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                       vocab_size=50257)


def collectives(work):
    return [(c.collective, c.nbytes, c.hidden_by >= 0) for c in work.collectives]


def test_megatron_layer_has_two_all_reduces_each_way():
    s = RunSettings(tensor_model_parallel_size=4, micro_batch_size=2, global_batch_size=2)
    work = layer_work(GPT, s)
    act = 2 * 1024 * 1024 * 2  # b s h x 2 bytes
    assert collectives(work.forward) == [("all_reduce", act, False)] * 2
    # backward: input gradients of QKV and fc1, beside their weight gradients
    assert collectives(work.backward) == [("all_reduce", act, True)] * 2


def test_sequence_parallelism_replaces_each_all_reduce_by_reduce_scatter_and_all_gather():
    s = RunSettings(tensor_model_parallel_size=4, micro_batch_size=2, global_batch_size=2, sequence_parallel=True)
    work = layer_work(GPT, s)
    fwd = [c for c, _, _ in collectives(work.forward)]
    assert fwd == ["all_gather", "reduce_scatter", "all_gather", "reduce_scatter"]
    bwd = [c for c, _, _ in collectives(work.backward)]
    assert sorted(bwd) == ["all_gather"] * 4 + ["reduce_scatter"] * 2
    full = layer_work(GPT, replace(s, recompute_granularity="full"))
    assert collectives(full.recompute) == collectives(full.forward)


def test_no_tensor_parallelism_no_collectives():
    work = layer_work(GPT, RunSettings(micro_batch_size=1, global_batch_size=1))
    assert not work.forward.collectives and not work.backward.collectives


@pytest.mark.parametrize(("dtype", "plain", "distributed"), [
    ("bf16", 18, (6, 12)), ("fp16", 20, (4, 16)), ("fp32", 16, (8, 8)),
])
def test_bytes_per_parameter_match_megatron_distributed_optimizer_table(dtype, plain, distributed):
    p = Precision.of(dtype)
    assert p.weight_bytes + p.grad_bytes + p.optimizer_bytes == plain
    assert (p.weight_bytes + p.grad_bytes, p.optimizer_bytes) == distributed


@pytest.mark.parametrize(("zero_stage", "distributed", "per_param"), [
    (0, False, 2 + 4 + 12), (0, True, 2 + 4 + 12 / 8), (1, False, 2 + 4 + 12 / 8),
    (2, False, 2 + (4 + 12) / 8), (3, False, (2 + 4 + 12) / 8),
])
def test_zero_stages_shard_what_they_say(zero_stage, distributed, per_param):
    cluster = load_cluster("dgx-a100")
    s = RunSettings(data_parallel_size=8, micro_batch_size=1, global_batch_size=8, zero_stage=zero_stage,
                    use_distributed_optimizer=distributed)
    comm = ConstantBandwidthModel(100e9, 20e9)
    st = run_structure(GPT, s, cluster, comm)
    mem = st.memory[0]
    params = st.rank_params[0]
    assert mem.weight_state_bytes == pytest.approx(per_param * params)


def test_megatron_rank_order_places_tensor_ranks_in_a_node():
    s = RunSettings(tensor_model_parallel_size=8, pipeline_model_parallel_size=4, data_parallel_size=2,
                    global_batch_size=8, micro_batch_size=1)
    place = placement(s, 8)
    assert (place.tp_nodes, place.dp_nodes, place.pp_cross_node) == (1, 2, True)
    small = placement(replace(s, tensor_model_parallel_size=2, data_parallel_size=2), 8)
    assert (small.tp_nodes, small.dp_nodes, small.pp_cross_node) == (1, 1, False)


def test_interleaving_shrinks_the_bubble_to_p_minus_1_over_v_m():
    """Uniform stages, free communication, no host or latency: 1F1B takes (M + p - 1)
    stage-times and interleaving with v chunks (M + (p - 1) / v)."""
    m = TransformerModel("uniform", num_layers=16, hidden_size=1024, num_attention_heads=16, seq_length=512,
                         vocab_size=128)
    cluster = load_cluster("dgx-a100")
    free = ConstantBandwidthModel(1e30, 1e30)
    eff = DeviceEfficiency(kernel_latency_s=0.0)
    p, mb = 4, 8
    base = RunSettings(pipeline_model_parallel_size=p, global_batch_size=mb, micro_batch_size=1)
    one = build_execution(m, base, cluster, free, eff)
    stage = float(one.costs.fwd_s[1] + one.costs.bwd_s[1])
    t1 = iteration_time_s(replace(one, after_sync_s=np.zeros(p)))
    assert t1 == pytest.approx((mb + p - 1) * stage, rel=0.02)  # embedding and head: the rest
    inter = build_execution(m, replace(base, virtual_pipeline_model_parallel_size=2), cluster, free, eff)
    t2 = iteration_time_s(replace(inter, after_sync_s=np.zeros(p)))
    assert t2 == pytest.approx((mb + (p - 1) / 2) * stage, rel=0.02)


def _single_rank(buckets, fractions, overlap, after=0.25):
    costs = PipelineCosts.uniform(1, 1.0, 2.0)
    sync = GradSync(np.array(buckets, float), np.zeros(len(buckets), dtype=np.int64), np.array(fractions, float))
    mem = RankMemory(10.0, 20.0, 30.0, np.array([5.0]), 1.0)
    return ExecutionModel("1f1b", 1, 1, 2, costs, (sync,), overlap, np.array([after]), (mem,), 2, 2)


def test_gradient_reduction_after_the_last_backward_or_beside_it():
    # two micro-batches of F = 1, B = 2: compute ends at 6; buckets of 1 s
    assert iteration_time_s(_single_rank([1.0, 1.0], [0.5, 1.0], overlap=False)) == pytest.approx(6 + 2 + 0.25)
    # overlapped: the first bucket is ready half-way through the last backward (at 5)
    result = run_iteration(_single_rank([1.0, 1.0], [0.5, 1.0], overlap=True))
    assert result.iteration_s == pytest.approx(7 + 0.25)
    assert result.exposed_sync_s[0] == pytest.approx(1.0)
    # weights + grads + optimizer + one micro-batch of activations (F, B, F, B) + working set
    assert result.peak_memory_bytes[0] == pytest.approx(60 + 5 + 1)
