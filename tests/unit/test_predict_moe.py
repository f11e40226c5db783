"""Mixture-of-experts layers in the execution model: the all-to-all volume, tokens per
expert, expert weight shards, Megatron-Core's EP/ETP rules, per-kind stage sums, and
the planner's EP/ETP search end to end."""

import csv
from dataclasses import replace

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.request import TransformerPlanRequest
from paraplan.plan.transformer.search import search
from paraplan.plan.transformer.space import SCHEDULES, SearchSpace, enumerate_candidates
from paraplan.predict.build import (
    kernel_times_by_pass,
    moe_layers_per_virtual_stage,
    placement,
    price,
    run_structure,
)
from paraplan.predict.calibration import load_calibration
from paraplan.predict.device_model import host_bound_s
from paraplan.predict.models import PRESETS
from paraplan.predict.moe_ops import moe_layer_work
from paraplan.predict.moe_shape import moe_shape
from paraplan.predict.ops import GEMM
from paraplan.predict.pass_times import pass_times

CAL = load_calibration()
H100 = load_cluster("dgx-h100")
MIXTRAL = PRESETS["mixtral-8x7b"]  # h 4096, 8 experts of 14336, top-2, 32 MoE layers, s 4096


def settings(**kw) -> RunSettings:
    base = dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, data_parallel_size=8,
                global_batch_size=8, micro_batch_size=1)
    return RunSettings(**{**base, **kw})


def test_dispatch_and_combine_all_to_all_carry_tokens_x_topk_x_hidden_bytes():
    s = settings(expert_model_parallel_size=8)
    work = moe_layer_work(MIXTRAL, s)
    a2a = [c for c in work.forward.collectives if c.group == "ep"]
    tokens = 1 * 4096  # b s on one rank (TP 1)
    # the token counts' all-gather (8 ranks x 8 experts, int64), dispatch, the probabilities (fp32), combine
    assert [c.collective for c in a2a] == ["all_gather", "all_to_all", "all_to_all", "all_to_all"]
    assert [c.nbytes for c in a2a] == [8 * 8 * 8, tokens * 2 * 4096 * 2, tokens * 2 * 4, tokens * 2 * 4096 * 2]
    assert len([c for c in work.backward.collectives if c.group == "ep"]) == 3
    # sequence parallelism routes each TP rank's b s / t tokens; the imbalance scales the busiest rank's share
    sp = moe_shape(MIXTRAL, settings(tensor_model_parallel_size=2, data_parallel_size=4, sequence_parallel=True,
                                     expert_model_parallel_size=4, expert_tensor_parallel_size=1,
                                     moe_load_imbalance=1.5))
    assert sp.a2a_bytes == 4096 / 2 * 2 * 4096 * 2 * 1.5
    # EP 1: no all-to-all at all
    assert not [c for c in moe_layer_work(MIXTRAL, settings()).forward.collectives if c.group == "ep"]


@pytest.mark.parametrize(("kw", "factor"), [
    ({"moe_load_imbalance": 1.4}, 1.4),
    ({"moe_load_imbalance": 1.4, "moe_expert_capacity_factor": 1.25}, 1.25),  # tokens above capacity dropped
    ({"moe_load_imbalance": 1.1, "moe_expert_capacity_factor": 1.25}, 1.1),
    ({"moe_expert_capacity_factor": 1.25, "moe_pad_expert_input_to_capacity": True}, 1.25),  # padded
])
def test_the_busiest_rank_carries_the_imbalance_capped_by_the_capacity_factor(kw, factor):
    m = moe_shape(MIXTRAL, settings(expert_model_parallel_size=8, **kw))
    assert m.a2a_bytes == pytest.approx(4096 * 2 * 4096 * 2 * factor, rel=1e-12)
    assert m.tokens_per_expert == pytest.approx(4096 * 2 * factor, rel=1e-12)


def test_each_expert_gets_tokens_x_topk_x_ep_over_experts():
    # TP 1, EP 4: each rank holds 2 of the 8 experts, each gets T k EP / E = 4096 x 2 x 4 / 8 tokens
    m = moe_shape(MIXTRAL, settings(expert_model_parallel_size=4))
    assert m.local_experts == 2 and m.tokens_per_expert == 4096 * 2 * 4 / 8
    gemms = moe_layer_work(MIXTRAL, settings(expert_model_parallel_size=4)).forward.kernels
    grouped = (gemms.kind == GEMM) & (gemms.batch == 2)
    assert list(gemms.m[grouped]) == [4096.0, 4096.0]  # fc1 and fc2 of the local experts, one grouped GEMM each
    assert list(gemms.n[grouped]) == [2 * 14336, 4096]  # SwiGLU's gate and up projections, then down
    # ETP 2 with sequence parallelism: the dispatched tokens of the 2 expert-tensor ranks are gathered
    m2 = moe_shape(MIXTRAL, settings(tensor_model_parallel_size=2, data_parallel_size=4, sequence_parallel=True,
                                     expert_model_parallel_size=2, expert_tensor_parallel_size=2))
    assert m2.tokens_per_expert == (4096 / 2) * 2 * 2 * 2 / 8 and m2.expert_ffn == 14336 / 2


def test_expert_weights_and_state_shard_over_ep_etp_and_the_expert_data_parallel_group():
    s = settings(data_parallel_size=16, global_batch_size=16, expert_model_parallel_size=8,
                 use_distributed_optimizer=True)
    st = run_structure(MIXTRAL, s, H100, CAL.comm_model(H100))
    experts = 32 * 8 * MIXTRAL.expert_params / 8  # EP 8 x ETP 1
    assert st.expert_rank_params[0] == pytest.approx(experts, rel=1e-12)
    dense = MIXTRAL.num_parameters - 32 * 8 * MIXTRAL.expert_params  # everything else, on every rank (TP 1)
    padded_vocab = MIXTRAL.padded_vocab_size(1) - MIXTRAL.vocab_size
    assert st.rank_params[0] == pytest.approx(dense + 2 * padded_vocab * 4096, rel=1e-12)
    mem = st.memory[0]
    assert mem.weights_bytes == pytest.approx(2 * (st.rank_params[0] + experts), rel=1e-12)
    # Adam state: the dense weights' over DP 16, the experts' over t d / (EP ETP) = 2
    assert mem.optimizer_bytes == pytest.approx(12 * (st.rank_params[0] / 16 + experts / 2), rel=1e-12)
    assert s.expert_data_parallel_size == 2
    # context parallelism: the expert grid spans the stage's t x c x d ranks
    assert replace(s, data_parallel_size=8, context_parallel_size=2).expert_data_parallel_size == 2


def test_expert_parallel_group_spans_nodes_in_megatron_order():
    # 8 GPUs a node, TP 8: EP 4 takes every 8th rank (expert tensor rank fastest, ETP 8), so 4 nodes
    s = settings(tensor_model_parallel_size=8, data_parallel_size=4, sequence_parallel=True,
                 expert_model_parallel_size=4)
    place = placement(s, 8)
    assert (place.etp_nodes, place.ep_nodes, place.edp_nodes) == (1, 4, 1)
    # ETP 1: the 8 EP ranks are the node's 8 GPUs; their copies sit on the other 3 nodes
    place1 = placement(replace(s, expert_model_parallel_size=8, expert_tensor_parallel_size=1), 8)
    assert (place1.etp_nodes, place1.ep_nodes, place1.edp_nodes) == (1, 1, 4)


@pytest.mark.parametrize(("kw", "message"), [
    ({"expert_model_parallel_size": 3, "data_parallel_size": 3, "global_batch_size": 3},
     "num_experts 8 is not divisible by expert_model_parallel_size 3"),
    ({"expert_model_parallel_size": 8, "data_parallel_size": 4, "global_batch_size": 4},
     "expert_model_parallel_size x expert_tensor_parallel_size = 8 x 1 does not divide the tensor x data-parallel "
     "ranks of a pipeline stage, 1 x 4"),
    ({"expert_model_parallel_size": 8, "data_parallel_size": 2, "context_parallel_size": 2, "global_batch_size": 2},
     "expert_model_parallel_size x expert_tensor_parallel_size = 8 x 1 does not divide the tensor x context x "
     "data-parallel ranks of a pipeline stage, 1 x 2 x 2"),
    ({"tensor_model_parallel_size": 2, "data_parallel_size": 4, "expert_model_parallel_size": 2},
     "expert_model_parallel_size 2 / expert_tensor_parallel_size 2 with tensor_model_parallel_size 2 need "
     "sequence_parallel"),
    ({"zero_stage": 3, "data_parallel_size": 4, "expert_model_parallel_size": 4, "global_batch_size": 4,
      "data_parallel_replicate_degree": 2},
     "the replicate degree 2 does not divide the expert-data-parallel size 1 \\(t c d / \\(EP ETP\\)\\): each "
     "replica must hold whole expert shards"),
    ({"moe_load_imbalance": 0.5}, "moe_load_imbalance must be a number in [1, 64]"),
    ({"moe_pad_expert_input_to_capacity": True}, "moe_pad_expert_input_to_capacity needs a "
                                                 "moe_expert_capacity_factor"),
])
def test_expert_settings_are_checked_with_megatron_rules(kw, message):
    with pytest.raises(StrategyError, match=message.replace("[", r"\[").replace("]", r"\]")):
        settings(**kw).check(MIXTRAL)


def test_dense_models_refuse_expert_settings():
    dense = TransformerModel("d", num_layers=4, hidden_size=512, num_attention_heads=8, seq_length=128,
                             vocab_size=1000)
    with pytest.raises(StrategyError,
                       match="expert_model_parallel_size 2 needs a mixture-of-experts model; 'd' has no experts"):
        settings(expert_model_parallel_size=2).check(dense)
    assert len(run_structure(dense, settings(), H100, CAL.comm_model(H100)).passes) == 7  # no MoE passes


HALF_MOE = TransformerModel("half", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                            vocab_size=32000, swiglu=True, num_experts=8, moe_router_topk=2,
                            moe_ffn_hidden_size=1024, moe_layer_freq=2)


def test_layer_kinds_are_counted_per_virtual_stage():
    first_dense = replace(HALF_MOE, moe_layer_freq=(0, 0, 0, 1, 1, 1, 1, 1))
    assert list(moe_layers_per_virtual_stage(first_dense, np.array([2, 2, 2, 2]))) == [0, 1, 2, 2]
    assert list(moe_layers_per_virtual_stage(HALF_MOE, np.array([3, 3, 2]))) == [2, 1, 1]


def test_a_stage_op_is_the_sum_of_its_layers_kinds():
    s = settings(pipeline_model_parallel_size=2, data_parallel_size=4, global_batch_size=8,
                 expert_model_parallel_size=4)
    comm = CAL.comm_model(H100)
    st = run_structure(HALF_MOE, s, H100, comm)
    ks = kernel_times_by_pass([st], CAL.efficiency)[0]
    t = pass_times(st, ks, CAL.efficiency)
    dev, host = t.device_s, t.host_s
    eff = CAL.efficiency
    # each stage: 2 dense + 2 MoE layers; the embedding on the first, the head on the last
    fwd_dev = np.array([2 * dev[0] + 2 * dev[7] + dev[3], 2 * dev[0] + 2 * dev[7] + dev[5]])
    fwd_host = np.array([2 * host[0] + 2 * host[7] + host[3], 2 * host[0] + 2 * host[7] + host[5]])
    fwd_host += eff.host_microbatch_s
    model = price(st, ks, eff)
    # 1F1B: stage 0's forward waits for its blocking send and the host synchronisation
    # after it (`batch_p2p_sync`)
    sent = np.array([st.send_s[0] + eff.host_kernel_s, 0.0])
    assert model.costs.fwd_s == pytest.approx(host_bound_s(fwd_dev, fwd_host, eff) + sent, rel=1e-12)
    assert dev[7] > dev[0]  # the MoE layer here does more (2 experts of f = h, a router, all-to-alls)


def test_shared_expert_overlap_hides_the_all_to_alls_beside_its_gemms():
    qwen2_moe = replace(HALF_MOE, moe_shared_expert_intermediate_size=2048, moe_layer_freq=1)
    s = settings(expert_model_parallel_size=8)
    plain = moe_layer_work(qwen2_moe, s).forward
    beside = moe_layer_work(qwen2_moe, replace(s, moe_shared_expert_overlap=True)).forward
    tokens = [c for c in plain.collectives if c.group == "ep" and c.nbytes == moe_shape(qwen2_moe, s).a2a_bytes]
    assert [c.hidden_by for c in tokens] == [-1, -1]
    hidden = [c.hidden_by for c in beside.collectives if c.group == "ep" and c.nbytes == tokens[0].nbytes]
    assert len(hidden) == 2 and all(i >= 0 and beside.kernels.kind[i] == GEMM for i in hidden)
    assert plain.kernels.total_flops == beside.kernels.total_flops  # the same work, reordered


def test_planner_searches_expert_parallelism():
    cand = enumerate_candidates(MIXTRAL, 64, 256, 8, SearchSpace())
    assert set(np.unique(cand.ep)) == {1, 2, 4, 8}
    etp = np.where(cand.etp > 0, cand.etp, cand.t)
    assert not np.any((cand.t * cand.d) % (cand.ep * etp))
    # ZeRO-3 with experts only under pipelines (`space.ZERO3_PIPELINED`), no ZeRO-2
    assert np.any(cand.zero == 3) and not np.any((cand.zero == 3) & (cand.p == 1)) and not np.any(cand.zero == 2)


def test_planner_answer_equals_exhaustive_exact_evaluation_for_a_small_moe_model():
    from paraplan.predict.predictor import predict_settings, summarize

    # the enumerated space alone (no post-pass of DualPipe and overlap flags): the search's
    # pruning and ranking must find exactly the exhaustive optimum
    enumerated = SearchSpace(schedules=SCHEDULES, tp_comm_overlap=(False,), overlap_moe_expert_parallel_comm=(False,),
                             moe_shared_expert_overlap=(False,))
    request = TransformerPlanRequest(replace(HALF_MOE, moe_layer_freq=1), H100, 8, 32, space=enumerated)
    comm = CAL.comm_model(H100)
    cand = enumerate_candidates(request.model, 8, 32, 8, request.space)
    base = request.base_settings()
    pool = [cand.settings(i, base) for i in range(len(cand))]
    preds = [summarize(request.model, s, r, H100) for r, s in predict_settings(request.model, pool, H100, comm,
                                                                                CAL.efficiency)]
    best = min((p for p in preds if p.fits_memory), key=lambda p: p.iteration_s)
    result = search(request, comm, CAL.efficiency)
    assert result.plans[0].iteration_s == pytest.approx(best.iteration_s, rel=1e-12)
    # the default space adds the post-pass, which only ever keeps a faster plan
    full = search(replace(request, space=SearchSpace()), comm, CAL.efficiency)
    assert full.plans[0].iteration_s <= best.iteration_s


def test_plan_mixtral_on_64_h100_end_to_end(tmp_path):
    from paraplan.cli.main import main

    out = tmp_path / "plans.csv"
    code = main(["plan", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64",
                 "--global-batch-size", "256", "--top-k", "3", "-o", str(out), "--no-track"])
    assert code == 0
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 3
    for r in rows:
        t, p, d, ep, etp = (int(r[k]) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                "data_parallel_size", "expert_model_parallel_size",
                                                "expert_tensor_parallel_size"))
        assert t * p * d == 64 and 8 % ep == 0 and (t * d) % (ep * etp) == 0
        # the device's usable memory (84.6 GB of an H100's 85.0), what fits_memory checks
        assert r["fits_memory"] == "true"
        assert float(r["predicted_peak_memory_bytes"]) <= H100.device.usable_memory_bytes


def test_a_moe_model_that_fits_nowhere_says_so_with_its_expert_state():
    model = PRESETS["qwen3-235b-a22b"]
    request = TransformerPlanRequest(replace(model, seq_length=4096), H100, 32, 256)
    with pytest.raises(StrategyError) as err:
        search(request, CAL.comm_model(H100), CAL.efficiency)
    text = str(err.value)
    # the model state alone (235.1B x 18 bytes over 32 GPUs) does not fit: said first, with the GPUs it would take
    assert text.startswith("qwen3-235b-a22b fits nowhere on 32 x H100-SXM5-80GB at global batch 256: its weights, "
                           "gradients and optimizer state alone are 4.23 TB (235.1B parameters x 18 bytes, bf16), "
                           "132.2 GB per GPU even sharded over all 32, against 84.6 GB usable of 85.0 GB each; the "
                           "smallest plan needs ")
    assert text.endswith("). It takes at least 51 GPUs (the model state alone, before activations), a smaller model "
                         "or a device with more memory")
    assert "EP " in text
    need_gb = float(text.split("needs ")[1].split(" GB")[0])
    # the routed experts alone, split over all 32 ranks (EP x ETP = t d) with no expert-data-parallel
    # copies left to shard their state over: 18 bytes per parameter
    experts_gb = model.num_moe_layers * model.num_experts * model.expert_params / 32 * 18 / 1e9
    assert experts_gb == pytest.approx(127.8, abs=0.1) and need_gb > experts_gb


def test_a_run_table_with_expert_settings_for_a_dense_model_is_one_line_error(tmp_path, capsys):
    from paraplan.cli.main import main

    runs = tmp_path / "runs.csv"
    runs.write_text("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,"
                    "tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,global_batch_size,"
                    "expert_model_parallel_size\n"
                    "a,4,512,8,128,1000,1,1,2,2,2\n")
    out = tmp_path / "out.csv"
    assert main(["predict", str(runs), "--cluster", "dgx-h100", "-o", str(out), "--no-track"]) == 2
    err = capsys.readouterr().err
    assert ("runs.csv:2: impossible run: expert_model_parallel_size 2 needs a mixture-of-experts model; 'a' has no "
            "experts") in err
    assert "Traceback" not in err and not out.exists()


def test_explain_splits_a_moe_run_into_parts_that_sum_to_its_iteration():
    from paraplan.predict.explain import explain_run

    s = settings(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, data_parallel_size=4,
                 global_batch_size=16, sequence_parallel=True, expert_model_parallel_size=8,
                 expert_tensor_parallel_size=1, use_distributed_optimizer=True, recompute_granularity="full")
    b = explain_run(MIXTRAL, s, H100, CAL.comm_model(H100), CAL.efficiency)
    assert b.total_s == pytest.approx(b.iteration_s, rel=1e-9)
    assert b.seconds["ep_comm"] > 0 and b.seconds["tp_comm"] > 0


def test_dense_layer_factors_never_scale_a_moe_layer():
    from paraplan.predict.layer_factors import layer_shape_key

    dense = replace(MIXTRAL, num_experts=0, moe_ffn_hidden_size=0, moe_layer_freq=1)  # Mistral 7B's widths
    s = settings()
    assert layer_shape_key(MIXTRAL, s, "H100") != layer_shape_key(dense, s, "H100")
    assert layer_shape_key(MIXTRAL, s, "H100").startswith(layer_shape_key(dense, s, "H100"))


def test_planner_memory_estimate_counts_the_stages_own_layer_kinds():
    from paraplan.plan.transformer.estimate import estimate
    from paraplan.predict.predictor import predict_settings

    first_dense = replace(HALF_MOE, moe_layer_freq=(0, 0, 0, 0, 1, 1, 1, 1), num_experts=64)
    request = TransformerPlanRequest(first_dense, H100, 8, 32)
    comm = CAL.comm_model(H100)
    base = request.base_settings()
    cand = enumerate_candidates(first_dense, 8, 32, 8, request.space)
    pick = np.flatnonzero((cand.p == 2) & (cand.v == 1) & (cand.ep == 1) & (cand.t == 1) & (cand.b == 1)
                          & (cand.zero == 1) & (cand.recompute == 2))[0]  # the last stage holds all 4 MoE layers
    est = estimate(first_dense, cand.take(np.array([pick])), base, H100, comm, CAL.efficiency)
    exact = predict_settings(first_dense, [cand.settings(int(pick), base)], H100, comm, CAL.efficiency)[0][0]
    assert float(est.peak_memory_bytes[0]) == pytest.approx(float(exact.peak_memory_bytes.max()), rel=0.02)


def test_deepseek_v3_does_not_fit_64_h100_and_plans_with_expert_parallelism_on_1024():
    model = replace(PRESETS["deepseek-v3"], seq_length=4096)
    comm = CAL.comm_model(H100)
    with pytest.raises(StrategyError, match=r"^deepseek-v3 fits nowhere on 64 x H100-SXM5-80GB at global batch 1024: "
                                            r"its weights, gradients and optimizer state alone are 12.29 TB \(682.6B "
                                            r"parameters, 11.6B of them multi-token prediction, x 18 bytes, "
                                            r"bf16\), 192.0 GB per GPU even sharded over all "
                                            r"64, against 84.6 GB usable of 85.0 GB each; the smallest plan needs .*"
                                            r"\. It takes at least 146 GPUs \(the model state alone, before "
                                            r"activations\), a smaller model or a device with more memory$"):
        search(TransformerPlanRequest(model, H100, 64, 1024), comm, CAL.efficiency)
    best = search(TransformerPlanRequest(model, H100, 1024, 1024), comm, CAL.efficiency).plans[0]
    assert best.fits_memory and best.settings.expert_model_parallel_size > 1


def test_deepseek_v3_mtp_layer_is_a_moe_layer_whose_experts_shard_over_ep():
    from paraplan.predict.mtp_ops import last_stage_work

    model = replace(PRESETS["deepseek-v3"], seq_length=4096)
    s = settings(tensor_model_parallel_size=4, pipeline_model_parallel_size=16, data_parallel_size=16,
                 global_batch_size=1024, sequence_parallel=True, expert_model_parallel_size=8,
                 expert_tensor_parallel_size=1)
    st = run_structure(model, s, H100, CAL.comm_model(H100))
    # 61 layers on 16 stages: the last holds layers 58-60 (MoE), then the MTP layer (MoE too)
    assert st.expert_rank_params[-1] == pytest.approx((3 + 1) * 256 * model.expert_params / 8, rel=1e-12)
    mtp = last_stage_work(model, s).forward.collectives
    assert [c.collective for c in mtp if c.group == "ep"] == ["all_gather", "all_to_all", "all_to_all", "all_to_all"]


def test_layer_table_probes_sharing_their_dense_passes_price_as_whole_structures(monkeypatch):
    import paraplan.plan.transformer.layer_table as space

    model = replace(HALF_MOE, moe_layer_freq=1, mtp_num_layers=1)  # a MoE MTP layer in the head pass too
    request = TransformerPlanRequest(model, H100, 16, 32)
    cand = enumerate_candidates(model, 16, 32, 8, request.space)
    comm = CAL.comm_model(H100)
    shared = space.layer_table(model, cand, request.base_settings(), H100, comm, CAL.efficiency)
    monkeypatch.setattr(space, "probe_structures",
                        lambda m, probes, cluster, c: [run_structure(m, s, cluster, c) for s in probes])
    whole = space.layer_table(model, cand, request.base_settings(), H100, comm, CAL.efficiency)
    assert len({k[5:] for k in shared.index}) > 3  # several (EP, ETP) per (t, b, sp, recompute, cp)
    for name in ("fwd_dev", "fwd_host", "bwd_dev", "bwd_host", "head_fwd", "head_bwd", *space.KIND_COLUMNS):
        assert np.array_equal(getattr(shared, name), getattr(whole, name)), name
