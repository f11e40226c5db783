"""Collectives the engine overlaps with compute pay the contention rule of every
overlapped collective (`paraplan.sim.overlap_cost`): a collective of time c beside
compute of time g takes max(c, g) + share x min(c, g). The data-parallel gradient
buckets (`sim.execution`, DualPipe's `sim.dualpipe_iteration`), the sharded optimizer's
all-gathers under `overlap_param_gather` (`predict.param_gather`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel
from paraplan.core.comm import Group
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict import overlap_share
from paraplan.predict.build import kernel_times_by_pass, price, run_structure
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.explain import explain_run
from paraplan.predict.overlap_share import OverlapShares
from paraplan.predict.param_gather import param_gather_added_s
from paraplan.sim.engine import PipelineCosts
from paraplan.sim.execution import ExecutionModel, GradSync, RankMemory, iteration_time_s, rank_ends, run_iteration
from paraplan.sim.overlap_cost import overlap_with_ops_s, pair_added_s

F, B = 1.0, 2.0  # one micro-batch's forward and backward


def one_rank(buckets_s: list[float], ready: list[float], share: float, overlap: bool = True,
             microbatches: int = 1, schedule: str = "1f1b") -> ExecutionModel:
    n = len(buckets_s)
    return ExecutionModel(
        schedule=schedule, pipeline_stages=1, virtual_stages=1, microbatches=microbatches,
        costs=PipelineCosts.uniform(1, F, B),
        grad_sync=(GradSync(np.array(buckets_s), np.zeros(n, dtype=np.int64), np.array(ready)),),
        overlap_grad_reduce=overlap, after_sync_s=np.zeros(1),
        memory=(RankMemory(0.0, 0.0, 0.0, np.zeros(1)),), samples_per_iteration=microbatches, num_devices=1,
        grad_bucket_overlap_share=share)


def test_the_pair_rule_less_the_compute_is_what_a_collective_adds():
    assert pair_added_s(1.0, 3.0, 0.85) == pytest.approx(0.85)  # hidden: only its contention
    assert pair_added_s(3.0, 1.0, 0.85) == pytest.approx(2.0 + 0.85)  # outlasts the compute
    assert pair_added_s(np.array([1.0, 3.0]), 2.0, 0.0).tolist() == [0.0, 1.0]  # share 0: the old free overlap


def test_the_overlap_is_the_time_buckets_spend_beside_an_op():
    ops_start, ops_end = np.array([0.0, 3.0, 6.0]), np.array([2.0, 5.0, 7.0])
    # [1, 4) covers 1 s of the first op and 1 s of the second; [5.5, 8) the last op's 1 s
    assert overlap_with_ops_s(np.array([1.0, 5.5]), np.array([4.0, 8.0]), ops_start, ops_end) == pytest.approx(3.0)
    assert overlap_with_ops_s(np.array([7.0]), np.array([9.0]), ops_start, ops_end) == 0.0


@pytest.mark.parametrize("c", [0.5, 2.0, 3.5])
def test_one_bucket_beside_the_whole_backward_is_a_pair(c):
    # ready at the backward's start: the backward (g = B) and the bucket (c) run side by side
    got = iteration_time_s(one_rank([c], [0.0], 0.85))
    assert got == pytest.approx(F + max(c, B) + 0.85 * min(c, B))


def test_share_zero_is_the_free_overlap_and_no_overlap_has_nothing_beside_it():
    assert iteration_time_s(one_rank([1.5], [0.0], 0.0)) == pytest.approx(F + B)
    assert iteration_time_s(one_rank([1.5], [0.0], 0.85, overlap=False)) == pytest.approx(F + B + 1.5)


def test_buckets_ready_during_the_backward_count_only_their_time_beside_it():
    # two buckets of 0.8 s ready at 50% and 100% of the backward [1, 3): [2, 2.8) beside it, [3, 3.8) after
    ends = rank_ends(one_rank([0.8, 0.8], [0.5, 1.0], 0.5))
    assert ends.compute_end_s[0] == pytest.approx(F + B)
    assert ends.sync_end_s[0] == pytest.approx(3.8 + 0.5 * 0.8)
    result = run_iteration(one_rank([0.8, 0.8], [0.5, 1.0], 0.5))
    assert result.exposed_sync_s[0] == pytest.approx(0.8 + 0.5 * 0.8)


def test_with_several_micro_batches_only_the_last_backward_is_beside_the_buckets():
    # M = 3: the buckets wait for the last micro-batch's backward, [3 F + 2 B, 3 F + 3 B)
    got = iteration_time_s(one_rank([1.0], [0.0], 0.85, microbatches=3))
    assert got == pytest.approx(3 * (F + B) + 0.85 * 1.0)


def test_a_no_flush_schedules_reduction_pairs_with_the_next_iteration():
    # 2BW: period = F + B per micro-batch; the reduction runs beside the next iteration
    free = one_rank([1.0], [1.0], 0.0, microbatches=2, schedule="2bw")
    period = run_iteration(free, timeline=False).iteration_s
    got = run_iteration(replace(free, grad_bucket_overlap_share=0.85), timeline=False).iteration_s
    assert got == pytest.approx(period + 0.85 * min(1.0, period))


# -- overlap_param_gather: the Megatron-Core H100 table's 1.7B model (README, commit 937571cf)
GPT = TransformerModel("gpt", num_layers=24, hidden_size=2048, num_attention_heads=16, seq_length=4096,
                       vocab_size=131072, untie_embeddings_and_output_weights=True)
H100 = load_cluster("dgx-h100")
COMM = ConstantBandwidthModel(300e9, 40e9)


def free_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Collectives that hold no SMs: the overlaps outside tensor parallelism are free
    (their occupancy share is CTAs / SMs, `overlap_share`)."""
    monkeypatch.setattr(overlap_share, "NCCL_INTRA_NODE_CTAS", 0)
    monkeypatch.setattr(overlap_share, "NCCL_INTER_NODE_CTAS", 0)


def mcore(**kw) -> RunSettings:
    base = dict(data_parallel_size=48, micro_batch_size=4, global_batch_size=192, use_distributed_optimizer=True,
                overlap_grad_reduce=True, overlap_param_gather=True)
    return RunSettings(**{**base, **kw})


def test_the_gathers_after_the_first_run_beside_the_first_ranks_forward():
    st = run_structure(GPT, mcore(), H100, COMM)
    embedding = GPT.vocab_size * GPT.hidden_size + GPT.seq_length * GPT.hidden_size
    whole = COMM.time_s("all_gather", st.rank_params[0] * 2, Group(48, 6))
    first = COMM.time_s("all_gather", embedding * 2, Group(48, 6))
    assert st.hidden_gather_s is not None
    assert st.hidden_gather_s[0] == pytest.approx(whole - first)
    two = run_structure(GPT, mcore(pipeline_model_parallel_size=2, data_parallel_size=24, micro_batch_size=1),
                        H100, COMM)
    assert two.hidden_gather_s is not None and two.hidden_gather_s[1] == 0.0  # beside the pipeline's fill
    assert run_structure(GPT, mcore(overlap_param_gather=False), H100, COMM).hidden_gather_s is None


def test_the_hidden_gathers_add_the_pair_rule_after_the_step():
    eff = DeviceEfficiency()
    st = run_structure(GPT, mcore(), H100, COMM)
    kernel_s = kernel_times_by_pass([st], eff)[0]
    priced = price(st, kernel_s, eff)
    free = price(replace(st, overlap_shares=OverlapShares(0.0, 0.0, 0.0)), kernel_s, eff)
    g, fwd = float(st.hidden_gather_s[0]), float(priced.costs.fwd_s[0])
    share = st.overlap_shares.param_gather
    assert share == 32 / 132  # z14: a 48-rank gather over 6 nodes holds 32 of the H100's 132 SMs
    assert priced.after_sync_s[0] - free.after_sync_s[0] == pytest.approx(max(g - fwd, 0.0) + share * min(g, fwd))
    assert param_gather_added_s(np.array([3.0, 0.0]), np.array([1.0, 5.0]), 0.5).tolist() == [2.5, 0.0]


def test_explain_puts_the_contention_of_the_reduction_and_gathers_in_dp_comm(monkeypatch):
    eff = DeviceEfficiency()
    s = mcore()
    priced = explain_run(GPT, s, H100, COMM, eff)
    free_nccl(monkeypatch)
    free = explain_run(GPT, s, H100, COMM, eff)
    assert priced.total_s == pytest.approx(priced.iteration_s)
    added = priced.iteration_s - free.iteration_s
    assert added > 0
    assert priced.seconds["dp_comm"] - free.seconds["dp_comm"] == pytest.approx(added)


def test_dualpipe_ranks_pay_the_contention_of_the_buckets_beside_their_compute():
    from paraplan.sim.dualpipe import execute as dualpipe_execute
    from paraplan.sim.dualpipe_iteration import _tails

    layers = TransformerModel("gpt", num_layers=8, hidden_size=2048, num_attention_heads=16, seq_length=2048,
                              vocab_size=32000)
    s = RunSettings(pipeline_model_parallel_size=4, data_parallel_size=8, global_batch_size=64, micro_batch_size=1,
                    schedule="dualpipe", overlap_grad_reduce=True)
    st, eff = run_structure(layers, s, H100, COMM), DeviceEfficiency()
    model = price(st, kernel_times_by_pass([st], eff)[0], eff)
    assert model.dualpipe is not None
    run = dualpipe_execute(model.schedule, 4, model.microbatches, model.dualpipe)
    _, free_end, events = _tails(replace(model, grad_bucket_overlap_share=0.0), run)
    _, priced_end, _ = _tails(model, run)
    share = model.grad_bucket_overlap_share
    assert share == 24 / 132  # z14: the buckets' occupancy share (DP 8 inside a node: 24 CTAs of 132 SMs)
    for r in range(4):
        spans = np.array([(a, b) for rank, _, a, b in events if rank == r])
        mine = run.rank == r
        beside = overlap_with_ops_s(spans[:, 0], spans[:, 1], run.start_s[mine], run.end_s[mine])
        assert beside > 0
        assert priced_end[r] == pytest.approx(free_end[r] + share * beside)


def test_a_run_whose_gathers_run_beside_the_forward_is_priced_run_by_run():
    from paraplan.predict.kernel_batch import KernelBatch
    from paraplan.predict.price_batch import PlainRuns, is_plain

    s = RunSettings(data_parallel_size=8, micro_batch_size=1, global_batch_size=32, use_distributed_optimizer=True,
                    overlap_param_gather=True)  # reduced after the backward, gathered beside the forward
    st = run_structure(GPT, s, H100, COMM)
    assert st.hidden_gather_s is not None and not is_plain(st)
    eff = DeviceEfficiency()
    kernel_s, sums = KernelBatch.of([st]).priced(eff)
    got = PlainRuns.of([st]).iteration_s(eff, kernel_s, sums)
    assert got.tolist() == [iteration_time_s(price(st, kernel_s[0], eff, sums[0]))]


def test_dualpipe_sends_take_the_contention_share_from_the_op_that_sent_them(monkeypatch):
    from paraplan.predict.build import build_execution

    layers = TransformerModel("gpt", num_layers=8, hidden_size=2048, num_attention_heads=16, seq_length=2048,
                              vocab_size=32000)
    s = RunSettings(pipeline_model_parallel_size=4, data_parallel_size=8, global_batch_size=64, micro_batch_size=1,
                    schedule="dualpipe")
    eff = DeviceEfficiency()
    priced = build_execution(layers, s, H100, COMM, eff).dualpipe
    explained = explain_run(layers, s, H100, COMM, eff)
    free_nccl(monkeypatch)
    free = build_execution(layers, s, H100, COMM, eff).dualpipe
    assert priced is not None and free is not None and free.contended_s is None
    share, send = 32 / 132, free.send_s  # z14: stages 8 ranks apart cross nodes: 32 CTAs of 132 SMs
    assert (send > 0).all()
    assert priced.fwd_s - free.fwd_s == pytest.approx(np.append(share * np.minimum(send, free.fwd_s[:-1]), 0.0))
    assert priced.bwd_s - free.bwd_s == pytest.approx(np.insert(share * np.minimum(send, free.bwd_s[1:]), 0, 0.0))
    assert priced.contended_s == pytest.approx((priced.fwd_s - free.fwd_s) + (priced.bwd_s - free.bwd_s))
    assert explained.total_s == pytest.approx(explained.iteration_s)
