"""`paraplan predict --explain`: where an iteration's time goes, parts that sum to the
predicted iteration time, and closed forms on small cases."""

import csv
from dataclasses import replace

import pytest

from paraplan.cli.main import main
from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import OPTIMIZER_KERNELS, build_execution, kernel_times_by_pass, run_structure
from paraplan.predict.calibration import load_calibration
from paraplan.predict.device_model import DeviceEfficiency, memory_time_s
from paraplan.predict.explain import EXPLAIN_COLUMNS, PARTS, explain_run
from paraplan.sim.execution import run_iteration

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
