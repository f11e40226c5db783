"""Context parallelism (Megatron-Core's `context_parallel_size`, `cp_comm_type`): ring
attention and Ulysses against their closed forms, activations / CP, the dp-cp group,
Megatron's rules, and the planner finding CP where nothing without it fits."""

from dataclasses import replace

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel, InputFileError, StrategyError
from paraplan.core.comm import Group, ring_time_s
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.output import describe, plan_rows
from paraplan.plan.transformer.request import TransformerPlanRequest
from paraplan.plan.transformer.search import search
from paraplan.plan.transformer.space import SearchSpace, enumerate_candidates
from paraplan.predict.build import PassCost, placement, run_structure
from paraplan.predict.calibration import load_calibration
from paraplan.predict.cp_ops import CP_GROUP, CP_RING
from paraplan.predict.edge_ops import embedding_work, head_work
from paraplan.predict.explain import PARTS, explain_run
from paraplan.predict.models import load_model
from paraplan.predict.ops import ATTENTION, layer_activation_bytes, layer_work
from paraplan.predict.predictor import predict_settings
from paraplan.predict.runtable import read_run_table
from paraplan.report.summary import _layout

CAL = load_calibration()
# GQA like Llama: 32 query heads, 8 key/value heads of 128
LONG = TransformerModel("long", num_layers=4, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                        ffn_hidden_size=14336, swiglu=True, seq_length=32768, vocab_size=32000,
                        normalization="RMSNorm", position_embedding_type="rope", add_bias_linear=False,
                        hidden_dropout=0.0, attention_dropout=0.0)
B, S, T, D, E = 1, 32768, 2, 128, 2
HEADS, GROUPS = 32 / T, 8 / T  # per tensor-parallel rank
CAUSAL_FWD_FLOPS = 4.0 * B * HEADS * S * S * D * 0.5


def settings(cp: int, comm_type: str = "p2p", **extra) -> RunSettings:
    return RunSettings(tensor_model_parallel_size=T, context_parallel_size=cp, cp_comm_type=comm_type,
                       micro_batch_size=B, global_batch_size=B, **extra)  # type: ignore[arg-type]


def attention_flops(work) -> np.ndarray:
    return work.kernels.flops[work.kernels.kind == ATTENTION]


def cp_collectives(work):
    return [(c.collective, c.nbytes, c.hidden_by >= 0, c.group) for c in work.collectives if c.group != "tp"]


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_ring_attention_passes_kv_blocks_in_cp_minus_one_steps_beside_equal_attention_steps(cp):
    work = layer_work(LONG, settings(cp))
    kv_bytes = 2 * (S / cp) * B * GROUPS * D * E  # keys and values of the s / c local tokens
    assert cp_collectives(work.forward) == [("send_recv", kv_bytes, True, CP_RING)] * (cp - 1)
    # causal load balancing: c equal steps, together 1 / c of the causal attention
    steps = attention_flops(work.forward)
    assert len(steps) == cp and np.allclose(steps, CAUSAL_FWD_FLOPS / cp**2)
    assert steps.sum() == pytest.approx(CAUSAL_FWD_FLOPS / cp)
    # each transfer runs beside an attention step
    kinds = work.forward.kernels.kind
    assert all(kinds[c.hidden_by] == ATTENTION for c in work.forward.collectives if c.group == CP_RING)
    # backward: keys, values and their gradients travel; flash backward is 2.5 x the forward
    assert cp_collectives(work.backward) == [("send_recv", 2 * kv_bytes, True, CP_RING)] * (cp - 1)
    assert attention_flops(work.backward).sum() == pytest.approx(2.5 * CAUSAL_FWD_FLOPS / cp)


def test_ulysses_all_to_alls_q_k_v_before_and_the_output_after_attention():
    cp = 4
    work = layer_work(LONG, settings(cp, "a2a"))
    qkv = (S / cp) * B * (HEADS + 2 * GROUPS) * D * E
    out = (S / cp) * B * HEADS * D * E
    assert cp_collectives(work.forward) == [("all_to_all", qkv, False, CP_GROUP), ("all_to_all", out, False, CP_GROUP)]
    assert cp_collectives(work.backward) == [("all_to_all", out, False, CP_GROUP), ("all_to_all", qkv, False, CP_GROUP)]
    assert attention_flops(work.forward).tolist() == [pytest.approx(CAUSAL_FWD_FLOPS / cp)]
    # priced as all-to-alls over the CP group (4 ranks on one node)
    comm = ConstantBandwidthModel(100e9, 20e9, 1e-6, 5e-6)
    cost = PassCost.of(work.forward, comm, Group(T, 1), {CP_GROUP: Group(cp, 1), CP_RING: Group(2, 1)})
    tp = sum(ring_time_s(c.collective, c.nbytes, T, 1e-6, 100e9) for c in work.forward.collectives
             if c.group == "tp" and c.hidden_by < 0)
    assert cost.blocking_comm_s == pytest.approx(tp + ring_time_s("all_to_all", qkv, cp, 1e-6, 100e9)
                                                 + ring_time_s("all_to_all", out, cp, 1e-6, 100e9))
    assert dict(cost.other_blocking_s)["cp"] == pytest.approx(cost.blocking_comm_s - tp)


def test_all_gather_cp_gathers_the_sequences_keys_and_values_and_reduce_scatters_their_gradients():
    cp = 16
    work = layer_work(LONG, settings(cp, "all_gather"))
    kv = 2 * B * S * GROUPS * D * E  # keys and values of the whole sequence, gathered
    assert cp_collectives(work.forward) == [("all_gather", kv, False, CP_GROUP)]
    assert cp_collectives(work.backward) == [("all_gather", kv, False, CP_GROUP),
                                            ("reduce_scatter", kv, False, CP_GROUP)]
    assert attention_flops(work.forward).tolist() == [pytest.approx(CAUSAL_FWD_FLOPS / cp)]
    assert attention_flops(work.backward).tolist() == [pytest.approx(2.5 * CAUSAL_FWD_FLOPS / cp)]


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("sp", [False, True])
def test_activation_memory_is_divided_by_cp(recompute, sp):
    one = settings(1, recompute_granularity=recompute, sequence_parallel=sp)
    for cp in (2, 8):
        split = replace(one, context_parallel_size=cp)
        assert layer_activation_bytes(LONG, split) == pytest.approx(layer_activation_bytes(LONG, one) / cp)
        assert head_work(LONG, split).activation_bytes == pytest.approx(head_work(LONG, one).activation_bytes / cp)
        assert embedding_work(LONG, split).activation_bytes == pytest.approx(
            embedding_work(LONG, one).activation_bytes / cp)


def test_gemms_per_rank_shrink_with_cp_and_flash_attention_never_materialises_scores():
    one, four = layer_work(LONG, settings(1)), layer_work(LONG, settings(4))
    gemm = lambda w: w.kernels.flops[w.kernels.kind == 0].sum()  # noqa: E731
    assert gemm(four.forward) == pytest.approx(gemm(one.forward) / 4)
    # from 32K to 1M tokens the flash path's activations grow linearly (nothing s x s);
    # the unfused path keeps the score matrices, priced as such: (s^2) x heads x 2 bytes
    million = replace(LONG, seq_length=1 << 20)
    assert layer_activation_bytes(million, settings(1)) == pytest.approx(32 * layer_activation_bytes(LONG, settings(1)))
    unfused = replace(settings(1), use_flash_attn=False)
    scores = layer_activation_bytes(million, unfused) - layer_activation_bytes(million, settings(1))
    assert scores == pytest.approx(E * HEADS * (1 << 20) ** 2 - 4 * HEADS * (1 << 20))  # less flash's fp32 stats


def test_rank_order_tp_cp_dp_pp_sets_the_groups_spans():
    # 8 GPUs a node: TP 2 x CP 4 fill one node; TP 8 x CP 4 puts each CP rank on its own node
    inside = placement(RunSettings(tensor_model_parallel_size=2, context_parallel_size=4, data_parallel_size=4,
                                   pipeline_model_parallel_size=2), 8)
    assert (inside.tp_nodes, inside.cp_nodes, inside.dp_nodes, inside.pp_cross_node) == (1, 1, 4, True)
    across = placement(RunSettings(tensor_model_parallel_size=8, context_parallel_size=4, data_parallel_size=2), 8)
    assert (across.tp_nodes, across.cp_nodes, across.dp_nodes) == (1, 4, 8)


def test_gradients_reduce_and_optimizer_state_shards_over_the_dp_cp_group():
    cluster = load_cluster("dgx-h100")
    comm = ConstantBandwidthModel(100e9, 20e9)
    base = RunSettings(tensor_model_parallel_size=2, global_batch_size=8, micro_batch_size=1,
                       use_distributed_optimizer=True, overlap_grad_reduce=True)
    dp4 = run_structure(LONG, replace(base, data_parallel_size=4), cluster, comm)
    dp2cp2 = run_structure(LONG, replace(base, data_parallel_size=2, context_parallel_size=2), cluster, comm)
    # the same 4 ranks hold each weight: same buckets, same group, same optimizer shard
    assert np.allclose(dp4.grad_sync[0].bucket_s, dp2cp2.grad_sync[0].bucket_s)
    assert dp2cp2.memory[0].optimizer_bytes == pytest.approx(dp4.memory[0].optimizer_bytes)
    assert dp2cp2.settings.num_gpus == 2 * 2 * 2


@pytest.mark.parametrize(("extra", "message"), [
    ({"context_parallel_size": 3}, "context_parallel_size 3 needs seq_length 32768 divisible by 2 x "
                                   "context_parallel_size = 6 (causal load balancing)"),
    ({"context_parallel_size": 2, "use_flash_attn": False}, "context_parallel_size 2 needs use_flash_attn"),
    ({"context_parallel_size": 8, "cp_comm_type": "a2a"}, "cp_comm_type a2a splits heads over context_parallel_size "
                                                          "8: num_query_groups 8 / tensor_model_parallel_size 2 = 4 "
                                                          "is not divisible by 8"),
    ({"context_parallel_size": 0}, "context_parallel_size must be an integer >= 1, got 0"),
    ({"cp_comm_type": "ring"}, "cp_comm_type 'ring' is not one of p2p, all_gather, a2a, torch_allgather, "
                               "torch_alltoall"),
])
def test_megatron_rules_are_errors_naming_the_setting(extra, message):
    s = replace(RunSettings(tensor_model_parallel_size=2), **extra)
    with pytest.raises(StrategyError) as err:
        s.check(LONG)
    assert message in str(err.value)


def test_explain_has_a_cp_part_and_the_parts_still_sum():
    cluster = load_cluster("dgx-h100")
    comm = CAL.comm_model(cluster)
    s = RunSettings(tensor_model_parallel_size=8, context_parallel_size=4, pipeline_model_parallel_size=2,
                    data_parallel_size=1, global_batch_size=4, micro_batch_size=1, sequence_parallel=True)
    breakdown = explain_run(LONG, s, cluster, comm, CAL.efficiency)
    assert "cp_comm" in PARTS and breakdown.seconds["cp_comm"] > 0
    assert breakdown.total_s == pytest.approx(breakdown.iteration_s, rel=1e-9)
    none = explain_run(LONG, replace(s, context_parallel_size=1), cluster, comm, CAL.efficiency)
    assert none.seconds["cp_comm"] == 0.0


def test_cp_is_searched_only_for_long_sequences():
    short = enumerate_candidates(replace(LONG, seq_length=4096), 64, 64, 8, SearchSpace())
    assert set(short.cp.tolist()) == {1}
    long = enumerate_candidates(LONG, 64, 64, 8, SearchSpace())
    assert set(long.cp.tolist()) == {1, 2, 4, 8, 16}  # 32K tokens: chunks of s / 2c >= 1,024 tokens
    assert np.all(long.t * long.cp * long.p * long.d == 64)
    only = enumerate_candidates(LONG, 64, 64, 8, SearchSpace(context_parallel_sizes=(1,)))
    assert set(only.cp.tolist()) == {1}


def test_planner_finds_cp_for_llama3_70b_at_128k_tokens_where_nothing_without_it_fits():
    """64 A100 40 GB: without CP the smallest plan needs 47.6 GB per GPU (TP 8, PP 8,
    full recomputation: the layer inputs of 128K tokens); CP splits them."""
    model = load_model("llama3-70b", seq_length=131072)
    cluster = load_cluster("dgx-a100-40gb")
    comm = CAL.comm_model(cluster)
    without = TransformerPlanRequest(model, cluster, 64, 32, space=SearchSpace(context_parallel_sizes=(1,)))
    with pytest.raises(StrategyError, match=r"^llama3-70b fits nowhere on 64 x A100-SXM4-40GB at global batch 32: "
                                            r"the smallest plan needs 47.6 GB per device \(.*\), against 41.9 GB "
                                            r"usable of 42.3 GB each; more GPUs, a smaller model or a device with more "
                                            r"memory would do$"):
        search(without, comm, CAL.efficiency)
    result = search(replace(without, space=SearchSpace()), comm, CAL.efficiency)
    best = result.plans[0]
    assert best.fits_memory and best.settings.context_parallel_size > 1
    assert all(p.settings.context_parallel_size > 1 for p in result.plans)
    row = plan_rows(model, result, "cal", CAL.efficiency)[0]
    c = best.settings.context_parallel_size
    assert (row["context_parallel_size"], row["cp_comm_type"]) == (str(c), "p2p")
    assert f"CP {c} (p2p)" in describe(best)
    assert _layout(row).endswith(f" CP {c}") and _layout({**row, "context_parallel_size": "1"}).count("CP") == 0


@pytest.mark.parametrize("memory_gb", [80, 1.75])
def test_search_with_cp_equals_exhaustive_exact_evaluation(memory_gb):
    model = TransformerModel("small", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=32768,
                             vocab_size=32000)
    cluster = load_cluster("dgx-a100")
    cluster = replace(cluster, device=replace(cluster.device, memory_bytes=memory_gb * 1e9, reserved_bytes=0.0))
    request = TransformerPlanRequest(model, cluster, 8, 8, space=SearchSpace(schedules=("1f1b",)), retime=10_000)
    comm = CAL.comm_model(cluster)
    base = request.base_settings()
    cand = enumerate_candidates(model, 8, 8, 8, request.space)
    assert set(cand.cp.tolist()) == {1, 2, 4, 8}
    runs = predict_settings(model, [cand.settings(i, base) for i in range(len(cand))], cluster, comm, CAL.efficiency)
    fitting = [(r.iteration_s, s) for r, s in runs if r.peak_memory_bytes.max() <= cluster.device.memory_bytes]
    best_s, best = min(fitting, key=lambda x: x[0])
    plan = search(request, comm, CAL.efficiency).plans[0]
    assert plan.iteration_s == pytest.approx(best_s, rel=1e-9)
    if memory_gb < 2:  # without CP the smallest plan needs 1.81 GB: only CP plans fit (ZeRO-2 holds its
        # unsharded gradients in flight, `unsharded_grad_params`, and CP its attention's buffers, `cp_memory`:
        # the smallest needs 1.69 GB)
        assert best.context_parallel_size > 1
        assert all(s.context_parallel_size > 1 for _, s in fitting)


RUNS_HEADER = ("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,tensor_model_parallel_size,"
               "pipeline_model_parallel_size,data_parallel_size,global_batch_size,context_parallel_size,cp_comm_type,"
               "num_gpus")


@pytest.mark.parametrize(("cells", "message"), [
    ("x,24,2048,16,32768,50257,2,2,2,8,4,p2p,16",
     "runs.csv:2: column 'num_gpus': 16 is not tensor x context x pipeline x data parallel size = 2 x 4 x 2 x 2 = 32"),
    ("x,24,2048,16,32768,50257,2,2,2,8,4,ring,32",
     "runs.csv:2: column 'cp_comm_type': expected one of p2p, all_gather, a2a, torch_allgather, "
     "torch_alltoall, got 'ring'"),
    ("x,24,2048,16,1004,50257,2,2,2,8,4,p2p,32",
     "runs.csv:2: impossible run: context_parallel_size 4 needs seq_length 1004 divisible by 2 x "
     "context_parallel_size = 8 (causal load balancing)"),
])
def test_run_table_cp_columns_and_their_errors(tmp_path, cells, message):
    path = tmp_path / "runs.csv"
    path.write_text(f"{RUNS_HEADER}\n{cells}\n")
    with pytest.raises(InputFileError) as err:
        read_run_table(path)
    assert str(err.value) == f"{path}:{message.removeprefix('runs.csv:')}"


def test_run_table_reads_cp(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text(f"{RUNS_HEADER}\nx,24,2048,16,32768,50257,2,2,2,8,4,a2a,32\n")
    (row,) = read_run_table(path)[1]
    assert (row.settings.context_parallel_size, row.settings.cp_comm_type, row.settings.num_gpus) == (4, "a2a", 32)
