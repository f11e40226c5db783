"""`paraplan predict --explain`: where an iteration's time goes, parts that sum to the
predicted iteration time, and closed forms on small cases."""

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from paraplan.cli.main import main
from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import OPTIMIZER_KERNELS, build_execution, kernel_times_by_pass, run_structure
from paraplan.predict.calibration import load_calibration
from paraplan.predict.device_model import DeviceEfficiency, memory_time_s
from paraplan.predict.explain import EXPLAIN_COLUMNS, PARTS, explain_run, idle_split
from paraplan.predict.runtable import KNOWN, read_run_table
from paraplan.sim import PipelineCosts, execute, get_schedule
from paraplan.sim.execution import rank_ends, run_iteration

GPT = TransformerModel("gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                       vocab_size=50257)
CLUSTER = load_cluster("dgx-a100")
CAL = load_calibration()


def total(b):
    return sum(b.seconds[k] for k in PARTS)


@pytest.mark.parametrize("settings", [
    RunSettings(micro_batch_size=2, global_batch_size=8),
    RunSettings(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, data_parallel_size=2,
                global_batch_size=16, micro_batch_size=1, sequence_parallel=True, use_distributed_optimizer=True),
    RunSettings(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2, data_parallel_size=2,
                global_batch_size=16, micro_batch_size=1, recompute_granularity="selective"),
    RunSettings(tensor_model_parallel_size=4, pipeline_model_parallel_size=2, global_batch_size=8, micro_batch_size=1,
                schedule="zb_h1", zero_stage=1, data_parallel_size=1),
])
def test_parts_sum_to_the_predicted_iteration(settings):
    comm = CAL.comm_model(CLUSTER)
    b = explain_run(GPT, settings, CLUSTER, comm, CAL.efficiency)
    iteration = run_iteration(build_execution(GPT, settings, CLUSTER, comm, CAL.efficiency), timeline=False)
    assert total(b) == pytest.approx(iteration.iteration_s, rel=1e-12)
    assert min(b.seconds.values()) >= -1e-12


def test_one_device_closed_form():
    """One GPU, no host cost: M x (forward + backward) kernels, then the optimizer; no
    communication and no bubble."""
    eff = DeviceEfficiency(host_kernel_s=0.0, host_collective_s=0.0, host_microbatch_s=0.0)
    s = RunSettings(micro_batch_size=2, global_batch_size=8)
    b = explain_run(GPT, s, CLUSTER, ConstantBandwidthModel(1e11, 1e11, 0.0, 0.0), eff)
    assert b.rank == 0
    assert b.seconds["tp_comm"] == b.seconds["dp_comm"] == b.seconds["pp_comm"] == 0.0
    assert b.seconds["bubble"] == pytest.approx(0.0, abs=1e-12) and b.seconds["host"] == pytest.approx(0.0, abs=1e-12)
    st = run_structure(GPT, s, CLUSTER, ConstantBandwidthModel(1e11, 1e11, 0.0, 0.0))
    k = [x.sum() for x in kernel_times_by_pass([st], eff)[0]]
    kernels = 4 * (8 * (k[0] + k[1] + k[2]) + sum(k[3:]))
    assert b.seconds["gemm"] + b.seconds["attention"] + b.seconds["memory"] == pytest.approx(kernels, rel=1e-12)
    step_bytes = st.rank_params[0] * st.precision.optimizer_step_bytes
    assert b.seconds["optimizer"] == pytest.approx(memory_time_s(step_bytes, st.speed, eff, OPTIMIZER_KERNELS))


def test_exposed_tensor_parallel_collectives_are_the_tp_part():
    """Blocking forward all-reduces and fully contended backward ones: per layer and
    micro-batch 4 all-reduces of b s h x 2 bytes, on 1 stage of 8 layers, M = 4."""
    comm = ConstantBandwidthModel(1e11, 1e11, 0.0, 0.0)
    eff = DeviceEfficiency(comm_overlap_contention=1.0, host_kernel_s=0.0, host_collective_s=0.0,
                           host_microbatch_s=0.0)
    s = RunSettings(tensor_model_parallel_size=2, micro_batch_size=1, global_batch_size=4)
    b = explain_run(GPT, s, CLUSTER, comm, eff)
    from paraplan.core.comm import Group

    one = comm.time_s("all_reduce", 1024 * 1024 * 2, Group(2, 1))
    head = 3 * comm.time_s("all_reduce", 4 * 1024, Group(2, 1)) + comm.time_s("all_reduce", 1024 * 1024 * 2,
                                                                               Group(2, 1))
    embedding = comm.time_s("all_reduce", 1024 * 1024 * 2, Group(2, 1))
    assert b.seconds["tp_comm"] == pytest.approx(4 * (8 * 4 * one + head + embedding))
    free = explain_run(GPT, s, CLUSTER, comm, replace(eff, comm_overlap_contention=0.0))
    assert free.seconds["tp_comm"] < b.seconds["tp_comm"]


def test_pipeline_bubble_and_transfers():
    """1F1B on p stages: the transfers on the fill and drain path are 2 (p - 1) sends, the
    last rank's M blocking sends of its backward (or the first's of its forward), plus the
    tied-embedding gradient all-reduce of the first and last stage."""
    comm = CAL.comm_model(CLUSTER)
    s = RunSettings(pipeline_model_parallel_size=4, global_batch_size=8, micro_batch_size=1)
    b = explain_run(GPT, s, CLUSTER, comm, CAL.efficiency)
    structure = run_structure(GPT, s, CLUSTER, comm)
    exchange, send = structure.embedding_exchange_s, structure.send_s[0]  # tied embedding: first and last stage
    assert b.rank in (0, 3) and exchange > 0 and send > 0
    assert b.seconds["pp_comm"] == pytest.approx((6 + 8) * send + exchange)
    assert b.seconds["bubble"] > 0
    assert b.total_s == pytest.approx(b.iteration_s)


def test_interleaved_fill_and_drain_transfers_cross_every_virtual_stage():
    """Interleaved 1F1B, p = 4, v = 2, M = 8, transfers overlapped: the first micro-batch's
    forward and the last one's backward wait for every one of the p v - 1 = 7 boundaries'
    transfers (`tests/unit/test_sim_schedules.py`), so `pp_comm` holds 2 x 7 of them (not
    1F1B's 2 (p - 1) = 6), what the overlapped sends take from the rank's own ops, and the
    tied-embedding gradient all-reduce; the bubble the rest of the idle time."""
    comm = CAL.comm_model(CLUSTER)
    s = RunSettings(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2, global_batch_size=8,
                    micro_batch_size=1)
    b = explain_run(GPT, s, CLUSTER, comm, CAL.efficiency)
    structure = run_structure(GPT, s, CLUSTER, comm)
    costs = build_execution(GPT, s, CLUSTER, comm, CAL.efficiency).costs
    send = structure.send_s[0]
    assert structure.send_s.shape == (7,) and (structure.send_s == send).all() and send > 0
    assert costs.contended_fwd_s is not None and costs.contended_bwd_s is not None
    mine = [b.rank, 4 + b.rank]
    contended = 8 * float(costs.contended_fwd_s[mine].sum() + costs.contended_bwd_s[mine].sum())
    exchange = structure.embedding_exchange_s if b.rank in (0, 3) else 0.0
    assert b.seconds["pp_comm"] == pytest.approx(14 * send + contended + exchange, rel=1e-9)
    assert b.seconds["bubble"] > 0 and b.total_s == pytest.approx(b.iteration_s)


def _engine_split(p, m, v, fwd_s, bwd_s, send_s):
    """The engine on per-virtual-stage costs (transfers beside the ops, as
    `simulate_pipeline` runs them): the rank that ends last and its idle time's split."""
    nv = p * v
    fwd, bwd = np.broadcast_to(np.asarray(fwd_s, float), (nv,)), np.broadcast_to(np.asarray(bwd_s, float), (nv,))
    sends = np.full(nv - 1, send_s)
    run = execute(get_schedule("interleaved_1f1b" if v > 1 else "1f1b").orders(p, m, 1, v),
                  PipelineCosts(fwd.copy(), bwd.copy(), np.zeros(nv), sends, sends), m)
    busy = run.busy_s()
    ends = np.array([run.end_s[run.device == r].max() for r in range(p)])
    rank = int(np.argmax(ends))
    return rank, idle_split(float(ends[rank] - busy[rank]), 2 * (nv - 1) * send_s, busy, rank)


@pytest.mark.parametrize(("p", "m", "v", "c"), [(4, 8, 2, 0.25), (8, 16, 2, 0.25), (4, 8, 4, 0.25), (4, 8, 1, 0.0),
                                                (2, 6, 1, 0.0)])
def test_equal_stages_have_no_imbalance_and_the_textbook_bubble(p, m, v, c):
    """Equal stages, t_f = 1 and t_b = 2 per rank (1 / v and 2 / v per chunk): the first
    rank ends last, its transfers are the 2 (p v - 1) c of the fill and drain path, no
    rank is busier than it, and the bubble is (p - 1)(t_f + t_b) / v
    (`tests/unit/test_sim_schedules.py`'s interleaved closed forms)."""
    rank, (transfers, imbalance, bubble) = _engine_split(p, m, v, 1.0 / v, 2.0 / v, c)
    assert rank == 0
    assert transfers == pytest.approx(2 * (p * v - 1) * c)
    assert imbalance == 0.0
    assert bubble == pytest.approx((p - 1) * 3.0 / v)


@pytest.mark.parametrize(("v", "deficit"), [(1, 1.5), (2, 2.25)])
def test_a_lighter_first_stage_waits_its_deficit_times_m(v, deficit):
    """p = 4, M = 8, t_f = 1 and t_b = 2 per chunk, free transfers; the first rank's first
    chunk is lighter by d (1F1B: costs 0.5 and 1, d = 1.5; interleaved, v = 2: 0.25 and
    0.5, d = 2.25). The busiest ranks set the pace, so the first waits M d = 12 (18) while
    they compute, and its bubble is the fill and drain through the others,
    (p - 1)(t_f + t_b) less the d its own short chunk saves: 9 - 1.5 (9 - 2.25)."""
    fwd, bwd = np.ones(4 * v), np.full(4 * v, 2.0)
    fwd[0], bwd[0] = 1.0 - deficit / 3, 2.0 - 2 * deficit / 3
    rank, (transfers, imbalance, bubble) = _engine_split(4, 8, v, fwd, bwd, 0.0)
    assert rank == 0 and transfers == 0.0
    assert imbalance == pytest.approx(8 * deficit)
    assert bubble == pytest.approx(9.0 - deficit)


def test_imbalance_is_the_busiest_ranks_extra_ops_on_a_real_model():
    """GPT, 10 layers on p = 4 with `decoder_first_pipeline_num_layers` 1 (the embedding
    and 1 layer, then 3, 3, and 3 with the output layer and loss), M = 8, no host cost:
    the last rank is the busiest, so the first waits M (T_3 - T_0) for it (T: one
    micro-batch's ops per rank, its blocking transfers included), and the bubble is the
    fill and drain through ranks 0-2, T_0 + T_1 + T_2, less the 2 (p - 1) transfers of
    that path that `pp_comm` counts."""
    model = replace(GPT, num_layers=10)
    eff = DeviceEfficiency(host_kernel_s=0.0, host_collective_s=0.0, host_microbatch_s=0.0)
    comm = ConstantBandwidthModel(1e11, 1e11, 0.0, 0.0)
    s = RunSettings(pipeline_model_parallel_size=4, global_batch_size=8, micro_batch_size=1,
                    decoder_first_pipeline_num_layers=1)
    b = explain_run(model, s, CLUSTER, comm, eff)
    costs = build_execution(model, s, CLUSTER, comm, eff).costs
    op_s = costs.fwd_s + costs.bwd_s + costs.wgt_s
    send = run_structure(model, s, CLUSTER, comm).send_s[0]
    assert b.rank == 0 and int(np.argmax(op_s)) == 3
    assert b.seconds["imbalance"] == pytest.approx(8 * (op_s[3] - op_s[0]), rel=1e-12)
    assert b.seconds["bubble"] == pytest.approx(op_s[:3].sum() - 6 * send, rel=1e-9)
    assert b.total_s == pytest.approx(b.iteration_s, rel=1e-12)


def test_an_embedding_only_chunk_is_imbalance_not_bubble():
    """Llama 3's layout on a small GPT: 6 layers + the embedding and the loss as slots,
    one per chunk on p = 4, v = 2 (`account_for_embedding/loss_in_pipeline_split`). The
    first rank holds the embedding alone and one layer, ranks 1-2 two layers, the last
    one layer and the output layer and loss (the busiest here). The rank that ends last
    waits M x (the busiest rank's ops - its own) for the others: `imbalance`, apart from
    the bubble. The engine's busy time is the sum of the ops the schedule gives each rank."""
    model = replace(GPT, num_layers=6)
    comm = CAL.comm_model(CLUSTER)
    s = RunSettings(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2, global_batch_size=8,
                    micro_batch_size=1, account_for_embedding_in_pipeline_split=True,
                    account_for_loss_in_pipeline_split=True)
    b = explain_run(model, s, CLUSTER, comm, CAL.efficiency)
    execution = build_execution(model, s, CLUSTER, comm, CAL.efficiency)
    costs = execution.costs
    per_rank = 8 * (costs.fwd_s + costs.bwd_s + costs.wgt_s).reshape(2, 4).sum(axis=0)
    assert rank_ends(execution).busy_s == pytest.approx(per_rank, rel=1e-12)
    assert b.seconds["imbalance"] == pytest.approx(per_rank.max() - per_rank[b.rank], rel=1e-9)
    assert b.seconds["imbalance"] > b.seconds["bubble"] > 0
    assert b.total_s == pytest.approx(b.iteration_s, rel=1e-12)


def test_llama3_405b_first_rank_waits_for_its_embedding_only_chunk(tmp_path):
    """Llama 3 405B on 16,384 H100 (`benchmarks/data/llama3_405b_table4.csv`, row 2: TP 8,
    PP 16, v = 8, M = 16, one slot per chunk, micro-batch 1 as the predictor picks): every
    chunk is one layer's ops but the first rank's first, the embedding alone, and the last
    rank's last, the output layer and loss; the busiest ranks hold 8 layers, so the first
    rank waits 16 x (a layer chunk's ops - the embedding's) while the others compute
    (0.570 s, docs/pipeline-schedules.md#where-the-interleaved-bubble-goes); the bubble is
    what is left of the idle time, the fill and drain."""
    table = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "llama3_405b_table4.csv"
    with table.open(newline="") as handle:
        row = next(r for r in csv.DictReader(handle) if r["name"] == "llama3-405b 16384 GPUs seq 8192")
    runs = tmp_path / "runs.csv"
    with runs.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[k for k in row if k in KNOWN])
        writer.writeheader()
        writer.writerow({k: v for k, v in row.items() if k in KNOWN})
    run = read_run_table(runs)[1][0]
    cluster = load_cluster("dgx-h100")
    calibration = load_calibration("h100-transfer")
    comm = calibration.comm_model(cluster)
    assert run.settings.micro_batch_size == 1 and run.settings.num_microbatches == 16
    b = explain_run(run.model, run.settings, cluster, comm, calibration.efficiency)
    costs = build_execution(run.model, run.settings, cluster, comm, calibration.efficiency).costs
    op_s = (costs.fwd_s + costs.bwd_s + costs.wgt_s).reshape(8, 16)  # (chunk, rank)
    layers = np.delete(op_s.ravel(), [0, op_s.size - 1])  # all but the embedding's and the loss's chunks
    assert layers.max() == pytest.approx(layers.min(), rel=1e-12)
    # q9: with the chunk gathers where the schedule launches them, the second rank ends last
    # (its chunk-0 gather, a layer's, outlasts micro-batch 0's arrival); it is one of the
    # busiest, so it has no imbalance, and the first rank's 16 x (layer chunk - embedding) is
    # what the first rank's end trails it by at most
    ends = rank_ends(build_execution(run.model, run.settings, cluster, comm, calibration.efficiency))
    assert b.rank == 1 and b.seconds["imbalance"] == pytest.approx(0.0, abs=1e-9)
    assert ends.busy_s.max() - ends.busy_s[0] == pytest.approx(16 * (op_s[0, 1] - op_s[0, 0]), rel=1e-9)
    assert b.seconds["bubble"] > 0
    assert b.total_s == pytest.approx(b.iteration_s, rel=1e-12)


def test_cli_explain_columns_sum_and_figure(tmp_path):
    runs = tmp_path / "runs.csv"
    runs.write_text("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,tensor_model_parallel_size,"
                    "pipeline_model_parallel_size,data_parallel_size,global_batch_size,micro_batch_size\n"
                    "a,24,2048,16,2048,50257,2,2,2,64,2\nb,24,2048,16,2048,50257,8,1,1,16,1\n")
    out = tmp_path / "out.csv"
    assert main(["predict", str(runs), "--cluster", "dgx-a100", "-o", str(out), "--no-track", "--explain"]) == 0
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        parts = sum(float(row[c]) for c in EXPLAIN_COLUMNS)
        assert parts == pytest.approx(float(row["predicted_iteration_s"]), rel=1e-5)  # 6 significant digits each
    assert (tmp_path / "runs_explain.png").stat().st_size > 0 and (tmp_path / "runs_explain.pdf").exists()
