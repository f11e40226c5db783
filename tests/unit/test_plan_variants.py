"""The transformer planner's post-pass (`paraplan.plan.transformer.variants`): DualPipe and
the overlap flags tried on the best plans only where Megatron-LM, Megatron-Core,
Transformer Engine and DualPipe run them; every row names the flags it assumed, and
`paraplan predict` on the plan CSV reproduces each row's prediction to the digit."""

import csv
from dataclasses import replace

import numpy as np
import pytest

from paraplan.cli.main import main
from paraplan.clusters import load_cluster
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.output import PLAN_COLUMNS
from paraplan.plan.transformer.request import TransformerPlanRequest
from paraplan.plan.transformer.retime import busy_lower_bound_s
from paraplan.plan.transformer.search import search
from paraplan.plan.transformer.space import SearchSpace
from paraplan.plan.transformer.variants import (
    a2a_overlap_runs,
    dualpipe_runs,
    flag_variants,
    shared_overlap_runs,
    tp_comm_overlap_runs,
)
from paraplan.predict.build import build_execution
from paraplan.predict.calibration import calibration_for
from paraplan.predict.runtable import KNOWN
from paraplan.sim.execution import run_iteration

H100, A100 = load_cluster("dgx-h100"), load_cluster("dgx-a100")
MOE = TransformerModel("moe", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                       vocab_size=32000, swiglu=True, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=1024,
                       moe_shared_expert_intermediate_size=1024)
TP4 = RunSettings(tensor_model_parallel_size=4, pipeline_model_parallel_size=2, data_parallel_size=2,
                  global_batch_size=32, sequence_parallel=True, expert_model_parallel_size=8,
                  expert_tensor_parallel_size=1)


def test_tp_comm_overlap_only_where_transformer_engine_runs_it():
    assert tp_comm_overlap_runs(TP4, H100)
    assert not tp_comm_overlap_runs(TP4, A100)  # compute capability 8.0: UB_SKIPMC's unmeasured fallback
    assert not tp_comm_overlap_runs(replace(TP4, sequence_parallel=False), H100)  # Megatron-LM's assert
    assert not tp_comm_overlap_runs(replace(TP4, tensor_model_parallel_size=1), H100)
    assert not tp_comm_overlap_runs(replace(TP4, tensor_model_parallel_size=16), H100)  # TP across nodes
    assert tp_comm_overlap_runs(TP4, load_cluster("gh200-alps"))


def test_moe_overlaps_follow_megatron_core():
    interleaved = replace(TP4, virtual_pipeline_model_parallel_size=2)
    assert not a2a_overlap_runs(TP4, MOE)  # pipelines need the interleaved schedule
    assert a2a_overlap_runs(interleaved, MOE) and a2a_overlap_runs(replace(TP4, pipeline_model_parallel_size=1), MOE)
    for bad in (replace(interleaved, expert_model_parallel_size=1), replace(interleaved, recompute_granularity="full"),
                replace(interleaved, dtype="fp32"), replace(interleaved, moe_shared_expert_overlap=True)):
        assert not a2a_overlap_runs(bad, MOE)
    assert not a2a_overlap_runs(interleaved, replace(MOE, mtp_num_layers=2))
    assert shared_overlap_runs(TP4, MOE)
    assert not shared_overlap_runs(TP4, replace(MOE, moe_shared_expert_intermediate_size=0))
    assert not shared_overlap_runs(replace(TP4, overlap_moe_expert_parallel_comm=True), MOE)
    # on H100: tp_comm_overlap x {none, all-to-all overlap, shared-expert overlap}, less the settings themselves
    variants = flag_variants(interleaved, MOE, H100, SearchSpace())
    flags = {(v.tp_comm_overlap, v.overlap_moe_expert_parallel_comm, v.moe_shared_expert_overlap) for v in variants}
    assert flags == {(False, True, False), (False, False, True), (True, False, False), (True, True, False),
                     (True, False, True)}
    off = SearchSpace(tp_comm_overlap=(False,), overlap_moe_expert_parallel_comm=(False,),
                      moe_shared_expert_overlap=(False,))
    assert flag_variants(interleaved, MOE, H100, off) == []
    assert {v.tp_comm_overlap for v in flag_variants(TP4, MOE, A100, SearchSpace())} == {False}


def test_dualpipe_runs_as_the_repository_asserts():
    one = replace(TP4, schedule="dualpipe", micro_batch_size=1, data_parallel_size=2)  # M = 16 >= 2 x 2
    assert dualpipe_runs(one)
    assert not dualpipe_runs(replace(one, pipeline_model_parallel_size=3))  # p even
    assert not dualpipe_runs(replace(one, global_batch_size=6))  # M = 3: even, >= 2p
    assert not dualpipe_runs(replace(one, recompute_granularity="full"))
    assert not dualpipe_runs(replace(one, zero_stage=2))


def test_dualpipe_lower_bound_holds():
    """The bound that lets the post-pass skip DualPipe runs is below the engine's iteration."""
    cal = calibration_for(H100)
    for p, b in ((2, 1), (4, 1), (4, 2)):
        s = replace(TP4, schedule="dualpipe", pipeline_model_parallel_size=p, data_parallel_size=8 // p,
                    micro_batch_size=b, global_batch_size=64)
        execution = build_execution(MOE, s, H100, cal.comm_model(H100), cal.efficiency)
        assert 0 < busy_lower_bound_s(execution) <= run_iteration(execution, timeline=False).iteration_s


def test_post_pass_only_improves_and_schedules_are_kept_out():
    cal = calibration_for(H100)
    comm = cal.comm_model(H100)
    request = TransformerPlanRequest(MOE, H100, 16, 64)
    plain = search(replace(request, space=SearchSpace(
        schedules=("1f1b", "interleaved_1f1b", "zb_h1", "gpipe"), tp_comm_overlap=(False,),
        overlap_moe_expert_parallel_comm=(False,), moe_shared_expert_overlap=(False,))), comm, cal.efficiency)
    full = search(request, comm, cal.efficiency)
    assert full.post_pass > 0 and plain.post_pass == 0
    assert full.plans[0].iteration_s <= plain.plans[0].iteration_s
    assert all(p.settings.pipeline_schedule != "dualpipe" and not p.settings.tp_comm_overlap for p in plain.plans)
    times = [p.iteration_s for p in full.plans]
    assert times == sorted(times) and all(p.fits_memory for p in full.plans)


def _planned_rows_repriced(tmp_path, args: list[str], top_k: int) -> list[dict[str, str]]:
    """`paraplan plan ARGS` on dgx-h100 (top_k rows), then `paraplan predict` on its CSV as
    it is: every row is priced again to the digit and nothing is left for predict to
    choose. Returns the plan's rows."""
    plans, again = tmp_path / "plans.csv", tmp_path / "again.csv"
    assert main(["plan", *args, "--cluster", "dgx-h100", "--top-k", str(top_k), "-o", str(plans), "--no-track"]) == 0
    assert main(["predict", str(plans), "--cluster", "dgx-h100", "-o", str(again), "--no-track"]) == 0
    with plans.open() as a, again.open() as b:
        planned, predicted = list(csv.DictReader(a)), list(csv.DictReader(b))
    assert len(planned) == len(predicted) == top_k
    for row, pred in zip(planned, predicted, strict=True):
        for column in ("predicted_iteration_s", "predicted_peak_memory_bytes", "predicted_mfu", "fits_memory"):
            assert pred[column] == row[column], column
        assert pred["chosen"] == ""  # nothing left for predict to choose
    return planned


def test_plan_csv_round_trips_through_predict(tmp_path):
    """Every row of `paraplan plan`'s CSV, given to `paraplan predict` as it is, is
    predicted again to the digit (its flags and schedule are columns of the row)."""
    assert set(PLAN_COLUMNS) <= set(KNOWN)
    planned = _planned_rows_repriced(tmp_path, ["--model", "qwen3-30b-a3b", "--seq-length", "4096", "--gpus", "64",
                                                "--global-batch-size", "256"], 8)
    schedules = {r["schedule"] for r in planned}
    flags = {r["tp_comm_overlap"] for r in planned} | {r["overlap_moe_expert_parallel_comm"] for r in planned}
    assert "true" in flags or "dualpipe" in schedules  # the post-pass is in the answer


def test_a_deepseek_v3_plan_carries_its_router_and_round_trips_through_predict(tmp_path):
    """DeepSeek-V3's own router (sigmoid, expert bias, weights scaled by 2.5) is planned and
    written in every row; `paraplan predict` prices the rows again to the digit."""
    planned = _planned_rows_repriced(tmp_path, ["--model", "deepseek-v3", "--seq-length", "4096", "--gpus", "1024",
                                                "--global-batch-size", "1024"], 2)
    routers = {(r["moe_router_score_function"], r["moe_router_enable_expert_bias"],
                r["moe_router_topk_scaling_factor"], r["moe_router_pre_softmax"]) for r in planned}
    assert routers == {("sigmoid", "true", "2.5", "false")}


def test_zero3_pipeline_plan_round_trips_through_predict(tmp_path):
    """Llama 3 405B on 16,384 H100s: the best plan is ZeRO-3 under pipelines as Meta ran it
    (weights gathered once per iteration, gradients reduce-scattered after the last
    micro-batch) with the embedding and loss counted as layers; its row names those
    settings, and `paraplan predict` on the CSV prices every row again to the digit."""
    planned = _planned_rows_repriced(tmp_path, ["--model", "llama3-405b", "--gpus", "16384",
                                                "--global-batch-size", "2048"], 3)
    best = planned[0]
    assert int(best["pipeline_model_parallel_size"]) > 1 and best["zero_stage"] == "3"
    assert (best["fsdp_reshard_after_forward"], best["sharded_grad_reduce"]) == ("never", "last_microbatch")
    assert best["account_for_embedding_in_pipeline_split"] == best["account_for_loss_in_pipeline_split"] == "true"


def test_plan_command_search_options(tmp_path, capsys):
    out = tmp_path / "p.csv"
    args = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--global-batch-size", "64",
            "--seq-length", "2048", "-o", str(out), "--no-track"]
    assert main([*args, "--schedules", "1f1b,zigzag"]) == 2
    assert "--schedules" in capsys.readouterr().err and not out.exists()
    assert main([*args, "--schedules", "dualpipe"]) == 2
    assert "dualpipe needs 1f1b beside it" in capsys.readouterr().err
    assert main([*args, "--schedules", "1f1b", "--no-overlap-flags"]) == 0
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["schedule"] for r in rows} == {"1f1b"}
    assert {r["tp_comm_overlap"] for r in rows} == {"false"}
    assert np.all([r["overlap_p2p_comm"] == "false" for r in rows])  # Megatron's: only the interleaved one
    assert main(["plan", "--profile", "data/pipedream-profiles/vgg-19-pbs-32.txt", "--schedules", "1f1b",
                 "-o", str(tmp_path / "v.csv"), "--no-track"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "paraplan plan: error: option --schedules: is for a transformer (--model), not a layer profile")


@pytest.mark.parametrize("device", ["H100-SXM5-80GB", "H200-SXM-141GB", "GH200-96GB", "B200-SXM-180GB"])
def test_hopper_and_newer_devices_are_recognised(device):
    from paraplan.plan.transformer.variants import userbuffers_multicast

    assert userbuffers_multicast(device)
    assert not userbuffers_multicast("A100-SXM4-80GB") and not userbuffers_multicast("MI300X-192GB")


def test_predict_refuses_the_all_to_all_overlap_where_megatron_core_does():
    from paraplan.core.errors import StrategyError

    overlapped = replace(TP4, overlap_moe_expert_parallel_comm=True, moe_shared_expert_overlap=False)
    with pytest.raises(StrategyError, match=r"needs the interleaved schedule with pipelines"):
        overlapped.check(MOE)
    replace(overlapped, virtual_pipeline_model_parallel_size=2).check(MOE)
    replace(overlapped, pipeline_model_parallel_size=1, data_parallel_size=4).check(MOE)
    with pytest.raises(StrategyError, match=r"needs at most one multi-token-prediction layer"):
        replace(overlapped, pipeline_model_parallel_size=1, data_parallel_size=4).check(replace(MOE, mtp_num_layers=2))


def test_block_recomputation_is_tried_on_plans_that_recompute_every_layer():
    """Llama 3 8B on 8 H100s searched with full recomputation only: the post-pass tries
    recomputing only the first N layers of each chunk, and the exact engine keeps the
    fastest that fits (faster than recomputing all, still fitting)."""
    from paraplan.plan.transformer.variants import block_recompute_variants
    from paraplan.predict.models import PRESETS

    model = replace(PRESETS["llama3-8b"], seq_length=8192)
    full = RunSettings(data_parallel_size=8, global_batch_size=128, recompute_granularity="full", zero_stage=3)
    space = SearchSpace()
    assert [v.recompute_num_layers for v in block_recompute_variants(full, model, space)] == [8, 16, 24, 31]
    assert all(v.recompute_method == "block" for v in block_recompute_variants(full, model, space))
    assert block_recompute_variants(full, model, replace(space, recompute_block=(False,))) == []
    assert block_recompute_variants(replace(full, recompute_granularity="selective"), model, space) == []
    cal = calibration_for(H100)
    comm = cal.comm_model(H100)
    only_full = SearchSpace(tensor_sizes=(1,), recompute=("full",), schedules=("1f1b",), tp_comm_overlap=(False,))
    request = TransformerPlanRequest(model, H100, 8, 128, space=only_full)
    blocks = search(request, comm, cal.efficiency)
    every = search(replace(request, space=replace(only_full, recompute_block=(False,))), comm, cal.efficiency)
    best = blocks.plans[0]
    assert best.settings.recompute_method == "block" and best.fits_memory
    assert best.iteration_s < every.plans[0].iteration_s
    assert all(p.settings.recompute_method == "" for p in every.plans)


def test_a_flex_dispatcher_plan_searches_only_the_layouts_its_kernels_were_measured_at(tmp_path, capsys):
    """DeepSeek-V3 on 1,024 H100s with DeepEP: every plan's expert layout is one DeepEP was
    measured at (ETP 1; EP 8 inside a node, or 16, 32, 64 across nodes), its row names the
    dispatcher, and `paraplan predict` prices every row again to the digit."""
    planned = _planned_rows_repriced(tmp_path, ["--model", "deepseek-v3", "--seq-length", "4096", "--gpus", "1024",
                                                "--global-batch-size", "1024", "--moe-token-dispatcher-type", "flex"],
                                     3)
    assert {r["moe_token_dispatcher_type"] for r in planned} == {"flex"}
    assert {r["moe_flex_dispatcher_backend"] for r in planned} == {"deepep"}
    assert {r["expert_tensor_parallel_size"] for r in planned} == {"1"}
    assert {int(r["expert_model_parallel_size"]) for r in planned} <= {8, 16, 32, 64}
    out = tmp_path / "x.csv"
    args = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "8",
            "-o", str(out), "--no-track"]
    assert main([*args, "--moe-token-dispatcher-type", "flex"]) == 2
    assert "--moe-token-dispatcher-type: needs a mixture-of-experts model" in capsys.readouterr().err
    assert main([*args, "--moe-flex-dispatcher-backend", "hybridep"]) == 2
    assert "needs --moe-token-dispatcher-type flex" in capsys.readouterr().err and not out.exists()


def test_flex_layouts_follow_the_measured_kernels():
    from paraplan.plan.transformer.experts import flex_layouts
    from paraplan.predict.models import PRESETS

    qwen = PRESETS["qwen3-30b-a3b"]
    base = RunSettings(moe_token_dispatcher_type="flex")
    deepep = flex_layouts(qwen, base, H100)
    assert deepep is not None
    assert [ep for ep in (2, 4, 8, 16, 32, 64, 128) if deepep(ep, 1)] == [8, 16, 32, 64]
    assert not deepep(16, 2)  # ETP 2: the flex dispatcher runs ETP 1 only
    assert deepep(1, 1)  # EP 1 sends nothing
    hybrid = flex_layouts(qwen, replace(base, moe_flex_dispatcher_backend="hybridep"), H100)
    assert hybrid is not None and [ep for ep in (8, 16, 32, 64) if hybrid(ep, 1)] == [16, 32, 64]
    assert flex_layouts(qwen, RunSettings(), H100) is None
