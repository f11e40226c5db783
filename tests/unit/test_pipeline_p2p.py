"""Pipeline transfers as Megatron runs them (`paraplan.predict.pipeline_p2p`): blocking
without `overlap_p2p_comm`, beside the compute with it (interleaved only)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core.comm import Group
from paraplan.core.errors import StrategyError
from paraplan.core.glossary import EventKindCode, StreamCode
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import build_execution, run_structure
from paraplan.predict.calibration import load_calibration
from paraplan.predict.explain import explain_run
from paraplan.predict.pipeline_p2p import (
    blocking_per_microbatch_s,
    boundary_crosses_nodes,
    exchange_s,
    overlap_contention_s,
    p2p_charges,
    pipeline_gather_s,
    pipeline_send_s,
    sync_s,
)
from paraplan.predict.runtable import read_run_table
from paraplan.sim.engine import PipelineCosts, execute, execute_flushed
from paraplan.sim.execution import iteration_time_s, run_iteration
from paraplan.sim.schedules import get_schedule

T = 0.25
SEND = np.full(3, T)  # four virtual stages


def test_megatron_overlaps_p2p_by_default_with_model_chunks_only():
    assert RunSettings().overlap_p2p_comm is True
    assert RunSettings(pipeline_model_parallel_size=4).p2p_overlapped is False  # 1F1B: Megatron turns it off
    assert RunSettings(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2).p2p_overlapped
    assert not RunSettings(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                           overlap_p2p_comm=False).p2p_overlapped


def test_one_chunk_sends_block_the_sending_op():
    c = p2p_charges(RunSettings(pipeline_model_parallel_size=4), SEND)
    assert c.fwd_s.tolist() == [T, T, T, 0.0]  # the last stage sends no activation
    assert c.bwd_s.tolist() == [0.0, T, T, T]  # the first sends no gradient
    assert not c.send_fwd_s.any() and not c.send_bwd_s.any()


def test_interleaved_without_overlap_pays_one_exchange_per_backward():
    s = RunSettings(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, overlap_p2p_comm=False)
    c = p2p_charges(s, SEND)
    assert c.bwd_s.tolist() == [T] * 4 and not c.fwd_s.any()
    assert c.send_fwd_s.tolist() == [T] * 3 and not c.send_bwd_s.any()
    overlapped = p2p_charges(replace(s, overlap_p2p_comm=True), SEND)
    assert not overlapped.blocking and overlapped.send_fwd_s.tolist() == overlapped.send_bwd_s.tolist() == [T] * 3


@pytest.mark.parametrize("m", [2, 4, 7])
def test_two_stage_1f1b_with_blocking_sends_takes_m_plus_1_times_f_b_t(m):
    """With two stages each pays one transfer per micro-batch (stage 0 after its forward,
    stage 1 after its backward, the two halves of one exchange): (M + 1)(F + B + T)."""
    f, b = 1.0, 2.0
    c = p2p_charges(RunSettings(pipeline_model_parallel_size=2), np.array([T]))
    costs = PipelineCosts(np.full(2, f) + c.fwd_s, np.full(2, b) + c.bwd_s, np.zeros(2), c.send_fwd_s, c.send_bwd_s)
    orders = get_schedule("1f1b").orders(2, m, 1, 1)
    assert execute(orders, costs, m).makespan_s == pytest.approx((m + 1) * (f + b + T))
    assert execute_flushed(2, m, costs).makespan_s == pytest.approx((m + 1) * (f + b + T))


def test_blocking_transfers_slow_a_predicted_pipeline_by_at_most_their_time():
    model = TransformerModel("gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                             vocab_size=50257)
    cluster, cal = load_cluster("dgx-a100"), load_calibration()
    comm = cal.comm_model(cluster)
    s = RunSettings(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2, global_batch_size=8)
    send = run_structure(model, s, cluster, comm).send_s[0]
    free = replace(cal.efficiency, comm_overlap_contention=0.0)  # overlapped transfers hidden for free
    overlapped = iteration_time_s(build_execution(model, s, cluster, comm, free))
    blocking_run = replace(s, overlap_p2p_comm=False, batch_p2p_sync=False)  # the transfers alone
    blocking = iteration_time_s(build_execution(model, blocking_run, cluster, comm, free))
    assert send > 0
    # one exchange per forward/backward pair: M v of them on a rank, at most
    assert 0 < blocking - overlapped <= 8 * 2 * send + 1e-12


def test_an_overlapped_transfer_takes_the_contention_share_from_the_op_beside_it():
    # z12: NCCL's send/recv are SM kernels: each op that sends gains share x min(transfer, op)
    s = RunSettings(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, global_batch_size=4)
    send, fwd, bwd = np.array([0.5, 3.0, 0.5]), np.full(4, 2.0), np.full(4, 4.0)
    got = overlap_contention_s(s, send, fwd, bwd, 0.85)
    assert got is not None
    assert got[0] == pytest.approx([0.85 * 0.5, 0.85 * 2.0, 0.85 * 0.5, 0.0])  # the last sends nothing on
    assert got[1] == pytest.approx([0.0, 0.85 * 0.5, 0.85 * 3.0, 0.85 * 0.5])  # the first sends nothing back
    assert overlap_contention_s(s, send, fwd, bwd, 0.0) is None
    assert overlap_contention_s(replace(s, overlap_p2p_comm=False), send, fwd, bwd, 0.85) is None


def test_overlapped_transfers_cost_a_predicted_pipeline_their_contention(monkeypatch):
    from paraplan.predict import overlap_share

    model = TransformerModel("gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                             vocab_size=50257)
    cluster, cal = load_cluster("dgx-a100"), load_calibration()
    comm = cal.comm_model(cluster)
    s = RunSettings(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2, global_batch_size=8)
    priced = build_execution(model, s, cluster, comm, cal.efficiency)
    parts = explain_run(model, s, cluster, comm, cal.efficiency)  # the contention is pp_comm, not host
    st = run_structure(model, s, cluster, comm)
    share, send = st.overlap_shares.p2p, st.send_s
    assert share == 24 / 108  # z14: transfers inside a DGX A100 node hold 24 of its 108 SMs
    for name in ("NCCL_INTRA_NODE_CTAS", "NCCL_INTER_NODE_CTAS"):  # NCCL kernels holding no SM: free
        monkeypatch.setattr(overlap_share, name, 0)
    free = build_execution(model, s, cluster, comm, cal.efficiency)
    assert priced.costs.contended_fwd_s is not None and priced.costs.contended_bwd_s is not None
    assert priced.costs.fwd_s - free.costs.fwd_s == pytest.approx(np.append(share * send, 0.0))
    assert priced.costs.bwd_s - free.costs.bwd_s == pytest.approx(np.insert(share * send, 0, 0.0))
    assert iteration_time_s(priced) > iteration_time_s(free)
    assert parts.total_s == pytest.approx(parts.iteration_s)
    assert parts.seconds["host"] == pytest.approx(explain_run(model, s, cluster, comm, cal.efficiency).seconds["host"])


def test_planner_closed_form_counts_the_blocking_exchanges():
    got = blocking_per_microbatch_s(np.array([1, 3, 3]), np.array([False, False, True]), np.full(3, T))
    assert got.tolist() == [2 * T, 3 * T, 0.0]


def test_run_table_reads_overlap_p2p_comm(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,"
                    "tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,global_batch_size,"
                    "virtual_pipeline_model_parallel_size,overlap_p2p_comm\n"
                    "a,8,1024,16,1024,50257,1,4,1,8,2,false\nb,8,1024,16,1024,50257,1,4,1,8,2,\n")
    _, rows = read_run_table(path)
    assert [r.settings.overlap_p2p_comm for r in rows] == [False, True]


def test_explain_puts_blocking_exchanges_under_pp_comm():
    """Interleaved without overlap: the last rank's M v exchanges (one per backward) are
    pipeline communication, their host synchronisations host time, and the parts still
    sum to the iteration."""
    model = TransformerModel("gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                             vocab_size=50257)
    cluster, cal = load_cluster("dgx-a100"), load_calibration()
    comm = cal.comm_model(cluster)
    s = RunSettings(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2, global_batch_size=8,
                    overlap_p2p_comm=False)
    send = run_structure(model, s, cluster, comm).send_s[0]
    blocking = explain_run(model, s, cluster, comm, cal.efficiency)
    overlapped = explain_run(model, replace(s, overlap_p2p_comm=True), cluster, comm, cal.efficiency)
    assert blocking.total_s == pytest.approx(blocking.iteration_s)
    assert blocking.seconds["pp_comm"] >= 8 * 2 * send
    # the host synchronisation after each exchange is the GPU waiting for the host
    assert blocking.seconds["host"] == pytest.approx(overlapped.seconds["host"] + 8 * 2 * cal.efficiency.host_kernel_s)


def test_only_the_boundaries_between_nodes_cross_them():
    # t c d = 2 ranks per stage on 8-GPU nodes: stages 0-3 on node 0, 4-7 on node 1
    s = RunSettings(pipeline_model_parallel_size=8, data_parallel_size=2, global_batch_size=16)
    assert np.flatnonzero(boundary_crosses_nodes(s, 8)).tolist() == [3]
    # with two chunks the wrap from rank 7 back to rank 0 crosses too
    s2 = replace(s, virtual_pipeline_model_parallel_size=2)
    assert np.flatnonzero(boundary_crosses_nodes(s2, 8)).tolist() == [3, 7, 11]
    # 3 ranks per stage: stage 1 (ranks 3-5) to stage 2 (6-8) has a pair across nodes
    s3 = RunSettings(pipeline_model_parallel_size=4, data_parallel_size=3, global_batch_size=12)
    assert boundary_crosses_nodes(s3, 8).tolist() == [False, True, True]
    # a stage of a whole node or more: every boundary
    assert boundary_crosses_nodes(replace(s, tensor_model_parallel_size=4), 8).all()


def test_a_pipeline_priced_per_boundary():
    model = TransformerModel("gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                             vocab_size=50257)
    comm = load_calibration().comm_model(load_cluster("dgx-a100"))
    s = RunSettings(pipeline_model_parallel_size=8, data_parallel_size=2, global_batch_size=16)
    send = pipeline_send_s(model, s, comm, 8)
    nbytes = 1024 * 1024 * 2  # b s h x 2 bytes (bf16), t = c = 1
    inside, across = comm.time_s("send_recv", nbytes, Group(2, 1)), comm.time_s("send_recv", nbytes, Group(2, 2))
    assert across > inside
    assert send.tolist() == pytest.approx([inside] * 3 + [across] + [inside] * 3)


def test_an_exchange_takes_the_slower_of_a_ranks_two_neighbours():
    send = np.array([1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0])  # p 4, v 2: rank j -> j + 1 costs 1, 2, 3, 4
    assert exchange_s(send, 4).tolist() == [4.0, 2.0, 3.0, 4.0] * 2


def test_megatron_refuses_interleaving_two_ranks_without_overlap():
    model = TransformerModel("gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                             vocab_size=50257)
    s = RunSettings(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, global_batch_size=8)
    s.check(model)  # with overlap (Megatron's default) two ranks are enough
    with pytest.raises(StrategyError, match=r"^virtual_pipeline_model_parallel_size > 1 needs "
                                            r"pipeline_model_parallel_size >= 3 without overlap_p2p_comm$"):
        replace(s, overlap_p2p_comm=False).check(model)


def test_the_timeline_draws_blocking_sends_after_the_compute_they_follow():
    model = TransformerModel("gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                             vocab_size=50257)
    cluster, cal = load_cluster("dgx-a100"), load_calibration()
    comm = cal.comm_model(cluster)
    s = RunSettings(pipeline_model_parallel_size=4, global_batch_size=8)  # 1F1B: blocking
    execution = build_execution(model, s, cluster, comm, cal.efficiency)
    tl = run_iteration(execution).timeline
    assert tl is not None
    send = run_structure(model, s, cluster, comm).send_s[0]
    sends = (tl.kind == EventKindCode.SEND) & (tl.stream == StreamCode.COMM)
    # 8 micro-batches: 3 stages send each activation on, 3 each gradient back
    assert int(sends.sum()) == 2 * 3 * 8
    assert (tl.end_s[sends] - tl.start_s[sends]) == pytest.approx(np.full(48, send))
    fwd = (tl.kind == EventKindCode.FWD) & (tl.device == 0)
    assert (tl.end_s[fwd] - tl.start_s[fwd]) == pytest.approx(np.full(8, execution.costs.fwd_s[0] - send))


G = 0.125  # one received transfer's all-gather
S = 0.0625  # one host synchronisation


def test_scatter_gather_adds_the_receivers_gather_and_the_sync_beside_each_transfer():
    c = p2p_charges(RunSettings(pipeline_model_parallel_size=4), SEND, G, S)
    assert c.fwd_s.tolist() == [T + G, T + G, T + G, 0.0]  # each gets the next gradient back
    assert c.bwd_s.tolist() == [0.0, T + G, T + G, T + G]  # and the next activation
    assert c.sync_fwd_s is not None and c.sync_fwd_s.tolist() == [S, S, S, 0.0]
    assert c.sync_bwd_s is not None and c.sync_bwd_s.tolist() == [0.0, S, S, S]
    fwd, bwd = c.on_ops(np.ones(4), np.full(4, 2.0))
    assert fwd.tolist() == [1 + T + G + S] * 3 + [1.0] and bwd.tolist() == [2.0] + [2 + T + G + S] * 3


def test_interleaved_exchanges_gather_both_inputs_and_overlap_gathers_before_the_consumer():
    s = RunSettings(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, overlap_p2p_comm=False)
    c = p2p_charges(s, SEND, G, S)
    assert c.bwd_s.tolist() == [T + G, T + 2 * G, T + 2 * G, T + G] and not c.fwd_s.any()
    assert c.sync_bwd_s is not None and c.sync_bwd_s.tolist() == [S] * 4
    over = p2p_charges(replace(s, overlap_p2p_comm=True), SEND, G, sync_s(replace(s, overlap_p2p_comm=True), S))
    assert over.fwd_s.tolist() == [0.0, G, G, G] and over.bwd_s.tolist() == [G, G, G, 0.0]
    assert over.sync_bwd_s is None or not over.sync_bwd_s.any()


def test_the_sync_costs_one_host_kernel_issue_only_where_megatron_synchronises():
    one_chunk = RunSettings(pipeline_model_parallel_size=4)
    assert sync_s(one_chunk, 7e-5) == 7e-5
    assert sync_s(replace(one_chunk, batch_p2p_sync=False), 7e-5) == 0.0  # DeepSpeed's engine
    assert sync_s(RunSettings(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2), 7e-5) == 0.0


_GPT = TransformerModel("gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                        vocab_size=50257)


def test_scatter_gather_sends_one_tp_share_and_gathers_the_whole_activation():
    comm = load_calibration().comm_model(load_cluster("dgx-a100"))
    assert not RunSettings().scatter_gather_tensors_in_pipeline  # Megatron-Core's behaviour by default
    s = RunSettings(tensor_model_parallel_size=4, pipeline_model_parallel_size=2, global_batch_size=8,
                    scatter_gather_tensors_in_pipeline=True)  # Megatron-LM 2021-2022
    whole = 1024 * 1024 * 2  # b s h x 2 bytes (bf16)
    assert pipeline_send_s(_GPT, s, comm, 8).tolist() == [comm.time_s("send_recv", whole / 4, Group(2, 1))]
    assert pipeline_gather_s(_GPT, s, comm, 1) == comm.time_s("all_gather", whole, Group(4, 1))
    core = replace(s, scatter_gather_tensors_in_pipeline=False)  # Megatron-Core: whole activations
    assert pipeline_send_s(_GPT, core, comm, 8).tolist() == [comm.time_s("send_recv", whole, Group(2, 1))]
    assert pipeline_gather_s(_GPT, core, comm, 1) == 0.0
    sp = replace(core, sequence_parallel=True)  # already split along the sequence, either way
    assert pipeline_send_s(_GPT, sp, comm, 8).tolist() == [comm.time_s("send_recv", whole / 4, Group(2, 1))]
    assert pipeline_gather_s(_GPT, replace(sp, scatter_gather_tensors_in_pipeline=True), comm, 1) == 0.0
    assert pipeline_gather_s(_GPT, replace(s, tensor_model_parallel_size=1), comm, 1) == 0.0


def test_the_sync_lengthens_each_exchanging_op_by_one_host_kernel_issue():
    cluster, cal = load_cluster("dgx-a100"), load_calibration()
    comm = cal.comm_model(cluster)
    s = RunSettings(pipeline_model_parallel_size=4, global_batch_size=8)
    synced = build_execution(_GPT, s, cluster, comm, cal.efficiency).costs
    plain = build_execution(_GPT, replace(s, batch_p2p_sync=False), cluster, comm, cal.efficiency).costs
    k = cal.efficiency.host_kernel_s
    assert k > 0
    assert (synced.fwd_s - plain.fwd_s).tolist() == pytest.approx([k, k, k, 0.0])
    assert (synced.bwd_s - plain.bwd_s).tolist() == pytest.approx([0.0, k, k, k])


def test_planner_closed_form_adds_gathers_and_syncs():
    got = blocking_per_microbatch_s(np.array([1, 3, 3]), np.array([False, False, True]), np.full(3, T), G, S)
    assert got.tolist() == [2 * (T + S) + 2 * G, 3 * (T + S) + 6 * G, 6 * G]


def test_run_table_reads_the_transfer_columns(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,"
                    "tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,global_batch_size,"
                    "scatter_gather_tensors_in_pipeline,batch_p2p_sync\n"
                    "a,8,1024,16,1024,50257,2,4,1,8,false,false\nb,8,1024,16,1024,50257,2,4,1,8,,\n")
    _, rows = read_run_table(path)
    assert [(r.settings.scatter_gather_tensors_in_pipeline, r.settings.batch_p2p_sync) for r in rows] == [
        (False, False), (False, True)]
