"""The transformer planner's closed-form estimate prices what the engine charges
(`paraplan.plan.transformer.overlap_terms`, `estimate._pipeline_s`, y3): the contention of
overlapped pipeline transfers and of `overlap_param_gather`'s all-gathers, the first
rank's exposed first gather, ZB-H1's and the interleaved schedule's fill and drain, and the
second rank's reduction. Before, the estimate sat 5-11% below the engine on the best plans
(GPT-3 175B on 1,024 A100: 0.941 on its best plan)."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core.comm import Group
from paraplan.core.glossary import EventKindCode
from paraplan.core.run_settings import RunSettings
from paraplan.plan.transformer import estimate as est_mod
from paraplan.plan.transformer.estimate import _StageTimes, estimate
from paraplan.plan.transformer.overlap_terms import p2p_crosses_nodes, p2p_share, sender_contention_s
from paraplan.plan.transformer.pipeline_estimate import pipeline_s
from paraplan.plan.transformer.request import TransformerPlanRequest
from paraplan.plan.transformer.space import RECOMPUTE, SCHEDULES, enumerate_candidates
from paraplan.predict.build import kernel_times_by_pass, price, run_structure
from paraplan.predict.calibration import calibration_for
from paraplan.predict.models import PRESETS
from paraplan.predict.overlap_share import NCCL_INTER_NODE_CTAS, NCCL_INTRA_NODE_CTAS
from paraplan.predict.pipeline_p2p import boundary_crosses_nodes
from paraplan.sim.engine import PipelineCosts, execute
from paraplan.sim.execution import rank_ends, run_iteration
from paraplan.sim.schedules import cached_orders


def test_sender_contention_closed_form():
    """share x min(transfer, op): a 1 ms transfer beside a 20 ms op at share 0.25 takes
    0.25 ms; a transfer longer than its op takes share x the op."""
    got = sender_contention_s(np.array([0.001, 0.5]), np.array([0.02, 0.1]), np.array([0.25, 0.25]))
    assert got == pytest.approx([0.00025, 0.025], rel=1e-12)


def test_p2p_crossing_and_share_match_the_engine():
    """Whether any pipeline boundary crosses nodes, as `boundary_crosses_nodes(...).any()`
    (8 GPUs a node), and the transfers' occupancy share on a 132-SM H100: 32 CTAs across
    nodes, 24 inside one, none where the transfers block."""
    rows = [(t, d, p, v) for t in (1, 2, 4, 8) for d in (1, 2, 3) for p in (2, 3, 4, 8) for v in (1, 2)]
    t, d, p, v = (np.array(x, dtype=float) for x in zip(*rows, strict=True))
    cols = SimpleNamespace(t=t, c=np.ones_like(t), d=d, p=p, v=v)
    engine = [bool(boundary_crosses_nodes(RunSettings(tensor_model_parallel_size=int(a), data_parallel_size=int(b),
                                                      pipeline_model_parallel_size=int(c),
                                                      virtual_pipeline_model_parallel_size=int(e)), 8).any())
              for a, b, c, e in rows]
    crosses = p2p_crosses_nodes(cols, 8)  # type: ignore[arg-type]
    assert crosses.tolist() == engine
    overlapped = v > 1
    share = p2p_share(cols, overlapped, 132, 8, 0.85)  # type: ignore[arg-type]
    expected = np.where(overlapped, np.where(crosses, NCCL_INTER_NODE_CTAS, NCCL_INTRA_NODE_CTAS) / 132, 0.0)
    assert share == pytest.approx(expected, rel=1e-12)


def _uniform(p: float, m: float, v: float, schedule: str, fb: float, wgt: float = 0.0, fwd: float = 0.0) -> tuple:
    cols = SimpleNamespace(p=np.array([p]), m=np.array([m]), v=np.array([v]), schedule=np.array([schedule]),
                           single=np.array([False]))
    one, w, f = np.array([fb]), np.array([wgt]), np.array([fwd])
    st = _StageTimes(mid=one, middle_sum=(p - 2) * one, first=one, last=one, whole=one, weight_grad_first=w,
                     chunk_first=one, chunk_last=one, first_rank_forward=one, weight_grad_mid=w,
                     forward_mid=f, first_fwd=f, first_bwd=one - f, last_fwd=f, last_bwd=one - f,
                     middle_fwd=f[:, None], middle_bwd=(one - f)[:, None], middle_count=np.array([[p - 2.0]]),
                     middle_low=np.array([[1.0]]), middle_high=np.array([[p - 2.0]]))
    return cols, st


@pytest.mark.parametrize(("p", "m", "wgt"), [(4, 8, 0.95), (8, 8, 0.95), (8, 4, 0.95), (16, 48, 0.95), (4, 8, 1.5),
                                             (8, 4, 1.5)])
def test_zb_h1_closed_form_is_the_engines(p, m, wgt):
    """ZB-H1 with uniform stages (F 1, B 1.05 s, W as given): 1F1B's (p + M - 1)(F + B + W)
    less (p - 1) W + min(M - 1, p - 1) min(W, F): 2 (p - 1) W where W <= F and M >= p (Qi et
    al. 2023: bubble (p - 1)(F + B - W) for 1F1B's (p - 1)(F + B + W)); the drain's weight
    gradients fill gaps of one forward; as the engine runs the schedule's op order."""
    F, B, W = 1.0, 1.05, wgt
    cols, st = _uniform(p, m, 1, "zb_h1", F + B + W, W, F)
    pipe, _ = pipeline_s(cols, st, np.zeros(1))  # type: ignore[arg-type]
    saved = (p - 1) * W + min(m - 1, p - 1) * min(W, F)
    assert pipe[0] == pytest.approx((p + m - 1) * (F + B + W) - saved, rel=1e-12)
    run = execute(cached_orders("zb_h1", p, m), PipelineCosts.uniform(p, F, B, W), m)
    assert pipe[0] == pytest.approx(run.makespan_s, rel=1e-12)


@pytest.mark.parametrize(("p", "v", "m"), [(4, 4, 16), (4, 20, 16), (8, 12, 24), (2, 8, 16)])
def test_interleaved_transfers_on_the_critical_path(p, v, m):
    """Interleaved with uniform chunks (F + B = 3 s) and a 10 ms transfer per boundary:
    (M v + p - 1) chunks + 2 (p v - 1) transfers, as the engine runs Megatron's op order
    (the first forward and the last backward cross every virtual stage; was 2 (p - 1))."""
    cols, st = _uniform(p, m, v, "interleaved_1f1b", 3.0)
    send = 0.01
    pipe, _ = pipeline_s(cols, st, np.array([send]))  # type: ignore[arg-type]
    assert pipe[0] == pytest.approx((m * v + p - 1) * 3.0 + 2 * (p * v - 1) * send, rel=1e-12)
    run = execute(cached_orders("interleaved_1f1b", p, m, 1, v), PipelineCosts.uniform(p * v, 1.0, 2.0, 0.0, send), m)
    assert pipe[0] == pytest.approx(run.end_s[run.device == 0].max(), rel=1e-9)


def _gpt3():
    cluster = load_cluster("dgx-a100")
    cal = calibration_for(cluster)
    request = TransformerPlanRequest(PRESETS["gpt3-175b"], cluster, 1024, 1536)
    base = request.base_settings()
    cand = enumerate_candidates(request.model, 1024, 1536, cluster.devices_per_node, request.space,
                                base.use_flash_attn)
    return request, cluster, cal.comm_model(cluster), cal.efficiency, base, cand


def _pick(cand, t, p, d, b, v, schedule, zero, recompute="none"):
    hit = np.flatnonzero((cand.t == t) & (cand.p == p) & (cand.d == d) & (cand.b == b) & (cand.v == v)
                         & (cand.schedule == SCHEDULES.index(schedule)) & (cand.zero == zero) & (cand.sp == 1)
                         & (cand.recompute == RECOMPUTE.index(recompute)) & (cand.acc == 0) & (cand.first == 0))
    return int(hit[0])


def test_param_gather_closed_form(monkeypatch):
    """GPT-3 175B, TP 4, PP 8, DP 32, v 12, M 24, distributed optimizer on 1,024 A100 (108
    SMs): the interleaved schedule gathers chunk by chunk over the 32 data-parallel ranks
    (across nodes: 32 CTAs, share 32/108). The first rank waits for chunk 0's (the embedding
    and one layer) before its first forward; each later chunk's (one layer) runs beside the
    p = 8 forwards of the chunk before it, so adds share x min(gather, 8 g / v), g the
    rank's forwards of one micro-batch; equal to what the engine's run adds to the first rank
    (`paraplan.sim.param_gather_run`)."""
    request, cluster, comm, eff, base, cand = _gpt3()
    i = _pick(cand, 4, 8, 32, 2, 12, "interleaved_1f1b", 1)
    seen = {}
    original = est_mod.param_gather_s

    def spy(cols, params, embedding, comm_, prec, megatron, share, forward_s, timed):
        out = original(cols, params, embedding, comm_, prec, megatron, share, forward_s, timed)
        seen.update(first=float(params.first[0]), embedding=float(embedding[0]), forward=float(forward_s[0]),
                    share=float(share[0]), out=float(out[0]))
        return out

    monkeypatch.setattr(est_mod, "param_gather_s", spy)
    estimate(request.model, cand.take(np.array([i])), base, cluster, comm, eff)
    settings = cand.settings(i, base)
    group = Group(32, 16)  # every 4th rank: 32 ranks on 16 nodes of 8
    layer = (seen["first"] - seen["embedding"]) / 12
    chunk0 = comm.time_s("all_gather", (seen["embedding"] + layer) * 2, group)
    later = comm.time_s("all_gather", layer * 2, group)
    g, share = seen["forward"], seen["share"]
    assert share == pytest.approx(NCCL_INTER_NODE_CTAS / 108)
    assert later < 8 * g / 12  # each later chunk's gather fits beside the 8 forwards before it
    assert seen["out"] == pytest.approx(chunk0 + 11 * share * later, rel=1e-12)
    st = run_structure(request.model, settings, cluster, comm)
    engine = price(st, kernel_times_by_pass([st], eff)[0], eff)
    forwards = engine.costs.fwd_s.reshape(12, 8)[:, 0].sum()
    assert g == pytest.approx(forwards, rel=0.01)  # the first rank's forwards of one micro-batch
    assert st.chunk_gather_s[0] == pytest.approx([chunk0] + [later] * 11, rel=0.01)
    # the engine's run: a little of the later gathers falls in gaps between the forwards (the
    # micro-batches coming round), where it slows nothing: 1.7% less than the closed form
    assert rank_ends(engine).param_gather_s[0] == pytest.approx(seen["out"], rel=0.02)
    assert rank_ends(engine).param_gather_s[0] <= seen["out"]
    timeline = run_iteration(engine).timeline
    assert timeline is not None and int((timeline.kind == EventKindCode.ALLGATHER).sum()) == 8 * 12  # one per chunk


# GPT-3 175B on 1,024 A100 (`a100-vtrain`): the best plans of `paraplan plan` and the other
# schedules' best (TP, PP, DP, micro-batch, v, schedule, ZeRO); estimate / engine measured
# 0.999-1.016 over the 128 candidates the search re-times (before: 0.896-1.058, the best plan
# 0.941), 0.999-1.007 on these; without the param-gather term 0.985-1.000, without the p2p
# contention 0.986-1.007, without the straggler factor 0.977-0.983
GPT3_ROWS = [(4, 8, 32, 2, 12, "interleaved_1f1b", 1), (4, 8, 32, 2, 12, "interleaved_1f1b", 3),
             (4, 8, 32, 2, 6, "interleaved_1f1b", 1), (2, 16, 32, 1, 6, "interleaved_1f1b", 1),
             (2, 16, 32, 1, 1, "zb_h1", 1), (4, 8, 32, 1, 1, "zb_h1", 3)]
WITHIN = 0.01


def test_estimate_tracks_the_engine_on_gpt3_plans():
    """The estimate within 1% of the engine's iteration on those plans (each term it lost
    moves some of them by 1.3-2.3%: a lost term fails)."""
    request, cluster, comm, eff, base, cand = _gpt3()
    ratio = _ratios(request, cluster, comm, eff, base, cand.take(np.array([_pick(cand, *row) for row in GPT3_ROWS])))
    assert ratio.shape == (len(GPT3_ROWS),) and np.all(np.abs(ratio - 1.0) < WITHIN), ratio


def _ratios(request, cluster, comm, eff, base, rows) -> np.ndarray:
    est = estimate(request.model, rows, base, cluster, comm, eff).iteration_s
    engine = []
    for i in range(len(rows)):
        st = run_structure(request.model, rows.settings(i, base), cluster, comm)
        engine.append(run_iteration(price(st, kernel_times_by_pass([st], eff)[0], eff), timeline=False).iteration_s)
    return est / np.array(engine)


@pytest.mark.parametrize(("p", "d", "ep", "schedule"), [(16, 32, 8, "1f1b"), (8, 64, 16, "1f1b"), (8, 64, 16, "zb_h1")])
def test_estimate_times_deepseek_v3_stages_by_their_own_layers(p, d, ep, schedule):
    """DeepSeek-V3 (4,096 tokens) on 2,048 H100, TP 4, the distributed optimizer: its first
    stage holds the 3 dense layers, the middle and last stages MoE layers only (PP 8: 61
    layers as 8 x 5 + 7 x 3, the 5 stages of 8 the first), each stage timed from its own
    count of each kind (`stage_kinds`), and the later of the first and the second rank's
    ends (the second's experts' reduction ends the iteration there). Within 0.5% of the
    engine (at the model's mean layer: PP 16 0.990, PP 8 0.973-0.974)."""
    cluster = load_cluster("dgx-h100")
    cal = calibration_for(cluster)
    model = replace(PRESETS["deepseek-v3"], seq_length=4096)
    request = TransformerPlanRequest(model, cluster, 2048, 4096)
    base = request.base_settings()
    cand = enumerate_candidates(model, 2048, 4096, 8, request.space, base.use_flash_attn)
    hit = np.flatnonzero((cand.t == 4) & (cand.p == p) & (cand.d == d) & (cand.ep == ep) & (cand.b == 1)
                         & (cand.schedule == SCHEDULES.index(schedule)) & (cand.zero == 1) & (cand.sp == 1)
                         & (cand.recompute == 0) & (cand.acc == 0) & (cand.first == 0) & (cand.etp == 1))
    assert hit.size
    ratio = _ratios(request, cluster, cal.comm_model(cluster), cal.efficiency, base, cand.take(hit[:1]))
    assert ratio.shape == (1,) and abs(ratio[0] - 1.0) < 0.005, ratio
