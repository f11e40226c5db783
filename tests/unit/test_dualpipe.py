"""DualPipe and DualPipeV (`paraplan.sim.dualpipe`) against the DeepSeek-V3 report's
Table 2 and the DualPipe repository's schedule."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.core.errors import StrategyError
from paraplan.sim import dualpipe as dp
from paraplan.sim.dualpipe import DualOp


def idle_s(schedule: str, ranks: int, microbatches: int, costs: dp.DualPipeCosts) -> np.ndarray:
    run = dp.execute(schedule, ranks, microbatches, costs)
    return run.makespan_s - run.busy_s()


@pytest.mark.parametrize("ranks, microbatches", [(4, 8), (6, 12), (8, 20), (16, 40), (16, 120)])
@pytest.mark.parametrize("fwd, pair", [(1.0, 2.0), (1.0, 2.5), (1.0, 3.0), (2.0, 5.0), (0.5, 1.2)])
def test_table2_bubble_with_w_equal_f(ranks: int, microbatches: int, fwd: float, pair: float) -> None:
    """Table 2: DualPipe's bubble is (p/2 - 1)(F&B + B - 3W); with W = F and B = 2F (the
    whole backward twice the forward) the busiest ranks, the two in the middle, idle
    exactly that long, the others less."""
    costs = dp.DualPipeCosts.uniform(ranks, fwd, 2 * fwd, fwd, pair)
    idle = idle_s("dualpipe", ranks, microbatches, costs)
    table2 = (ranks / 2 - 1) * (pair + 2 * fwd - 3 * fwd)
    assert dp.table2_bubble_s(ranks, fwd, 2 * fwd, fwd, pair) == pytest.approx(table2)
    assert idle.max() == pytest.approx(table2)
    assert idle[ranks // 2 - 1] == pytest.approx(table2) and idle[ranks // 2] == pytest.approx(table2)
    assert (idle <= table2 + 1e-9).all()


def test_table2_is_exact_only_with_w_equal_f() -> None:
    """With W = B/4 the event-level bubble is below the formula: 8 ranks, F 1, B 2, W 0.5,
    F&B 2.5 idle 8 time units in the middle, Table 2 says 3 x 3 = 9."""
    costs = dp.DualPipeCosts.uniform(8, 1.0, 2.0, 0.5, 2.5)
    assert idle_s("dualpipe", 8, 20, costs).max() == pytest.approx(8.0)
    assert dp.table2_bubble_s(8, 1.0, 2.0, 0.5, 2.5) == pytest.approx(9.0)


def test_makespan_closed_form() -> None:
    """Every rank runs M/2 forwards and backwards of each chunk: with F 1, B 2, W 1 and no
    overlap gain (F&B = 3), 8 ranks, 20 micro-batches: 20 x 3 of work plus the bubble
    (8/2 - 1)(3 + 2 - 3) = 6."""
    run = dp.execute("dualpipe", 8, 20, dp.DualPipeCosts.uniform(8, 1.0, 2.0, 1.0, 3.0))
    assert run.makespan_s == pytest.approx(20 * 3 + 6)
    assert run.busy_s() == pytest.approx(np.full(8, 60.0))


@pytest.mark.parametrize("ranks, microbatches", [(4, 8), (8, 20), (4, 10)])
def test_dualpipev_bubble(ranks: int, microbatches: int) -> None:
    """DualPipeV over D ranks has DualPipe's bubble for PP = 2D stages (the README's table)."""
    costs = dp.DualPipeCosts.uniform(2 * ranks, 1.0, 2.0, 1.0, 2.5)
    idle = idle_s("dualpipev", ranks, microbatches, costs)
    assert idle.max() == pytest.approx(dp.table2_bubble_s(2 * ranks, 1.0, 2.0, 1.0, 2.5))


@pytest.mark.parametrize("ranks, microbatches", [(2, 4), (4, 8), (8, 20), (16, 120)])
def test_activation_memory_is_pp_plus_one(ranks: int, microbatches: int) -> None:
    """Table 2: activations of PP + 1 micro-batch chunks per rank (1F1B: PP)."""
    assert (dp.inflight_peak("dualpipe", ranks, microbatches) == ranks + 1).all()
    assert (dp.inflight_peak("dualpipev", ranks, microbatches) == 2 * ranks + 1).all()


def test_orders_follow_the_repository_steps() -> None:
    """Rank 0 of 4 with 8 micro-batches: nF0 (2), nF0F1 (1 each), nB1W1F1 (1), then the
    main step's pairs, nB1F1B0, nB1B0, nWB0, nW."""
    order = dp.orders("dualpipe", 4, 8)[0]
    letters = ["FBIWP"[op.kind] + str(op.chunk) + (str(op.chunk2) if op.kind == DualOp.P else "") for op in order]
    assert letters == ["F0", "F0", "F0", "F1", "I1", "W1", "F1", "P01", "P10", "B1", "P10", "B1", "I0", "W0",
                       "I0", "W0"]
    every = dp.orders("dualpipe", 4, 8)
    for order in every:  # each rank runs every micro-batch of each chunk forward and backward once
        f = sum(op.kind in (DualOp.F, DualOp.P) for op in order)
        b = sum(op.kind in (DualOp.B, DualOp.I, DualOp.P) for op in order)
        w = sum(op.kind == DualOp.W for op in order)
        assert f == b == 8 and w == sum(op.kind == DualOp.I for op in order)


def test_pair_and_weight_rows() -> None:
    """A pair is two rows (forward, then backward) over its shares; W rows follow their I."""
    costs = dp.DualPipeCosts.uniform(4, 1.0, 2.0, 1.0, 2.4)
    run = dp.execute("dualpipe", 4, 8, costs)
    pair_f = run.pair & (run.kind == DualOp.F)
    assert (run.end_s[pair_f] - run.start_s[pair_f]) == pytest.approx(np.full(int(pair_f.sum()), 0.8))
    assert run.bubble_s().min() >= 0
    start, end = run.last_weight_grad(0, 0)
    assert end - start == pytest.approx(1.0)  # rank 0's chunk 0 ends with a deferred W
    start, end = run.last_weight_grad(0, 1)
    assert end - start == pytest.approx(2.0)  # its chunk 1 with a whole backward (step nB1B0)


@pytest.mark.parametrize("schedule, ranks, microbatches, message", [
    ("dualpipe", 3, 12, "schedule dualpipe needs an even pipeline_model_parallel_size >= 2 (each rank pairs with "
                        "rank p - 1 - r), got 3"),
    ("dualpipe", 4, 9, "schedule dualpipe needs an even number of micro-batches (half fed from each end), got 9"),
    ("dualpipe", 8, 14, "schedule dualpipe needs at least twice as many micro-batches as pipeline ranks: "
                        "14 micro-batches < 2 x 8"),
    ("dualpipev", 4, 6, "schedule dualpipev needs at least twice as many micro-batches as pipeline ranks: "
                        "6 micro-batches < 2 x 4"),
])
def test_invalid_requests(schedule: str, ranks: int, microbatches: int, message: str) -> None:
    with pytest.raises(StrategyError) as err:
        dp.orders(schedule, ranks, microbatches)
    assert str(err.value) == message


def test_costs_must_match_the_stages() -> None:
    with pytest.raises(StrategyError, match="dualpipev over 4 ranks runs 8 stages; the costs describe 4"):
        dp.execute("dualpipev", 4, 8, dp.DualPipeCosts.uniform(4, 1.0, 2.0))


def test_transfers_delay_consumers() -> None:
    """Two ranks, 4 micro-batches: a transfer of 10 on the only boundary delays each
    micro-batch's first forward on the far rank; nothing charges the sender."""
    free = dp.execute("dualpipe", 2, 4, dp.DualPipeCosts.uniform(2, 1.0, 2.0, 1.0))
    slow = dp.execute("dualpipe", 2, 4, dp.DualPipeCosts.uniform(2, 1.0, 2.0, 1.0, send_s=10.0))
    assert free.makespan_s == pytest.approx(12.0)
    assert slow.makespan_s > free.makespan_s + 10.0
    assert slow.busy_s() == pytest.approx(free.busy_s())


# -- the run-table schedule: `paraplan.predict.dualpipe_build`, `paraplan.sim.dualpipe_iteration`

def _run(model_name: str, **kw: object) -> tuple[object, object, object]:
    from dataclasses import replace

    from paraplan.clusters import load_cluster
    from paraplan.core.run_settings import RunSettings
    from paraplan.predict.build import build_execution
    from paraplan.predict.calibration import calibration_for
    from paraplan.predict.models import PRESETS

    cluster = load_cluster("dgx-h800")
    cal = calibration_for(cluster, None)
    model = replace(PRESETS[model_name], seq_length=4096)
    settings = RunSettings(**kw)  # type: ignore[arg-type]
    settings.check(model)
    one = build_execution(model, replace(settings, schedule="1f1b"), cluster, cal.comm_model(cluster),
                          cal.efficiency)
    dual = build_execution(model, settings, cluster, cal.comm_model(cluster), cal.efficiency)
    return one, dual, cal


DENSE = {"pipeline_model_parallel_size": 4, "data_parallel_size": 2, "tensor_model_parallel_size": 8,
         "sequence_parallel": True, "global_batch_size": 16, "micro_batch_size": 1, "schedule": "dualpipe",
         "use_distributed_optimizer": True}


def test_each_rank_holds_stage_r_and_stage_p_minus_1_minus_r() -> None:
    """Weights and gradients of two stages (2x over the pipeline), the optimizer state
    sharded over both copies' ranks (the 1F1B total), activations of both chunks."""
    one, dual, _ = _run("llama3-70b", **DENSE)
    for r in range(4):
        a, b, m = one.memory[r], one.memory[3 - r], dual.memory[r]
        assert m.weights_bytes == pytest.approx(a.weights_bytes + b.weights_bytes)
        assert m.gradients_bytes == pytest.approx(a.gradients_bytes + b.gradients_bytes)
        assert m.optimizer_bytes == pytest.approx((a.optimizer_bytes + b.optimizer_bytes) / 2)
        assert m.activation_bytes_per_chunk.tolist() == pytest.approx(
            [a.activation_bytes_per_chunk[0], b.activation_bytes_per_chunk[0]])
    weights = sum(m.weights_bytes for m in dual.memory)
    assert weights == pytest.approx(2 * sum(m.weights_bytes for m in one.memory))


def test_the_iteration_runs_the_dualpipe_engine() -> None:
    """A dense model's pair is its forward and backward back to back (no all-to-all to
    hide); the iteration is the engine's makespan plus the exposed reduction and the
    tail; each rank holds p + 1 micro-batch chunks at its peak."""
    from paraplan.sim.execution import iteration_time_s, rank_ends, run_iteration

    _, dual, _ = _run("llama3-70b", **DENSE)
    c = dual.dualpipe
    assert c is not None
    assert c.pair_fwd_s == pytest.approx(c.fwd_s) and c.pair_bwd_s == pytest.approx(c.bwd_s)
    assert (c.wgt_s > 0).all() and (c.wgt_s < c.bwd_s).all()
    res = run_iteration(dual)
    ends = rank_ends(dual)
    assert res.iteration_s == pytest.approx(float(ends.end_s.max()))
    assert iteration_time_s(dual) == pytest.approx(res.iteration_s)
    assert dp.execute("dualpipe", 4, 8, c).makespan_s == pytest.approx(float(ends.compute_end_s.max()))
    assert res.inflight_microbatches.tolist() == [5, 5, 5, 5]
    assert res.timeline is not None and res.timeline.schedule == "dualpipe"


def test_a_pair_hides_part_of_the_all_to_alls() -> None:
    """With experts over EP 8 ranks a pair's passes are cheaper than the passes alone:
    each of a MoE layer's four token transfers (c) runs beside a module of the other pass
    (g) and takes max(c, g) + share x min(c, g) instead of c in series, so a layer hides
    the sum of (1 - share) x min(c, g); a stage's op hides its MoE layers' worth of
    device time, seen through the smooth maximum with its host time (`host_bound_s`)."""
    from dataclasses import replace

    from paraplan.clusters import load_cluster
    from paraplan.core.run_settings import RunSettings
    from paraplan.predict.build import StageLayers, kernel_times_by_pass, op_device_s, op_host_s, run_structure
    from paraplan.predict.device_model import host_bound_s, kernel_times_s
    from paraplan.predict.models import PRESETS
    from paraplan.predict.pass_cost import PassCost
    from paraplan.predict.pass_times import Pass, pass_times

    kw = {"pipeline_model_parallel_size": 2, "data_parallel_size": 8, "expert_model_parallel_size": 8,
          "global_batch_size": 32, "micro_batch_size": 1, "schedule": "dualpipe"}
    _, dual, cal = _run("qwen3-30b-a3b", **kw)
    c = dual.dualpipe  # type: ignore[attr-defined]
    assert c is not None
    assert (c.pair_fwd_s < c.fwd_s).all() and (c.pair_bwd_s < c.bwd_s).all()

    cluster, eff = load_cluster("dgx-h800"), cal.efficiency  # type: ignore[attr-defined]
    st = run_structure(replace(PRESETS["qwen3-30b-a3b"], seq_length=4096), RunSettings(**kw), cluster,  # type: ignore[arg-type]
                       cal.comm_model(cluster))  # type: ignore[attr-defined]
    assert st.paired_moe_passes is not None

    def device_s(cost: PassCost) -> float:
        return cost.device_s(kernel_times_s(cost.kernels, st.speed, eff), eff)

    closed_form = 0.0
    for cost in st.paired_moe_passes:
        kernel_s = kernel_times_s(cost.kernels, st.speed, eff)
        assert cost.hidden_part is not None and cost.hidden_span is not None and cost.hidden_share is not None
        assert cost.hidden_comm_s.size == 2 and (cost.hidden_part == "ep").all()  # 2 transfers beside each pass
        ends = np.concatenate(([0.0], np.cumsum(kernel_s)))
        beside = ends[cost.hidden_by + cost.hidden_span] - ends[cost.hidden_by]
        closed_form += float(((1 - cost.hidden_share) * np.minimum(cost.hidden_comm_s, beside)).sum())
    paired_fwd, paired_bwd = st.paired_moe_passes
    hidden_fwd = device_s(st.passes[Pass.MOE_LAYER_FWD]) - device_s(paired_fwd)
    hidden_bwd = device_s(st.passes[Pass.MOE_LAYER_BWD]) - device_s(paired_bwd)
    assert closed_form > 0
    assert hidden_fwd + hidden_bwd == pytest.approx(closed_form, rel=1e-12)

    times = pass_times(st, kernel_times_by_pass([st], eff)[0], eff)
    layers = StageLayers.of(st)
    assert layers.moe is not None and layers.moe.tolist() == [24, 24]  # 48 MoE layers over 2 stages
    factor = eff.layer_time_factors.factor(st.layer_key)
    fwd_dev, bwd_dev = op_device_s(st, times, layers, eff)
    fwd_host, bwd_host = op_host_s(times, layers, eff)
    hidden_stage = (host_bound_s(fwd_dev, fwd_host, eff) - host_bound_s(fwd_dev - layers.moe * factor * hidden_fwd,
                                                                         fwd_host, eff)
                    + host_bound_s(bwd_dev, bwd_host, eff) - host_bound_s(bwd_dev - layers.moe * factor * hidden_bwd,
                                                                          bwd_host, eff))
    # the sends' contention is the same beside a pair (each send is shorter than either op)
    assert (c.fwd_s + c.bwd_s - c.pair_fwd_s - c.pair_bwd_s).tolist() == pytest.approx(hidden_stage.tolist(),
                                                                                        rel=1e-9)
    assert (hidden_stage < layers.moe * factor * closed_form).all()  # the host time takes its part


@pytest.mark.parametrize("kw, message", [
    ({"pipeline_model_parallel_size": 3, "data_parallel_size": 1, "global_batch_size": 12},
     "schedule dualpipe needs an even pipeline_model_parallel_size >= 2 (each rank pairs with rank p - 1 - r), got 3"),
    ({"pipeline_model_parallel_size": 4, "data_parallel_size": 1, "global_batch_size": 6},
     "schedule dualpipe needs at least twice as many micro-batches as pipeline ranks: 6 micro-batches < 2 x 4"),
    ({"pipeline_model_parallel_size": 2, "data_parallel_size": 1, "global_batch_size": 5},
     "schedule dualpipe needs an even number of micro-batches (half fed from each end), got 5"),
    ({"pipeline_model_parallel_size": 2, "data_parallel_size": 2, "global_batch_size": 8, "zero_stage": 3},
     "schedule dualpipe with zero_stage 3 (weights gathered per layer) is not modelled"),
    ({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2, "global_batch_size": 8},
     "virtual_pipeline_model_parallel_size 2 needs schedule interleaved_1f1b, got dualpipe"),
])
def test_run_settings_rules(kw: dict[str, int], message: str) -> None:
    from paraplan.core.run_settings import RunSettings
    from paraplan.predict.models import PRESETS

    with pytest.raises(StrategyError) as err:
        RunSettings(schedule="dualpipe", **kw).check(PRESETS["llama3-8b"])  # type: ignore[arg-type]
    assert str(err.value) == message


def test_explain_splits_the_dualpipe_iteration() -> None:
    """`paraplan predict --explain`: the latest rank's parts (its two stages' ops, M/2 each,
    minus what the pairs hide) sum to the iteration time."""
    from dataclasses import replace

    from paraplan.clusters import load_cluster
    from paraplan.core.run_settings import RunSettings
    from paraplan.predict.calibration import calibration_for
    from paraplan.predict.explain import explain_run
    from paraplan.predict.models import PRESETS
    from paraplan.sim.execution import rank_ends

    cluster = load_cluster("dgx-h800")
    cal = calibration_for(cluster, None)
    model = replace(PRESETS["qwen3-30b-a3b"], seq_length=4096)
    settings = RunSettings(pipeline_model_parallel_size=2, data_parallel_size=8, expert_model_parallel_size=8,
                           global_batch_size=32, micro_batch_size=1, schedule="dualpipe")
    parts = explain_run(model, settings, cluster, cal.comm_model(cluster), cal.efficiency)
    _, dual, _ = _run("qwen3-30b-a3b", pipeline_model_parallel_size=2, data_parallel_size=8,
                      expert_model_parallel_size=8, global_batch_size=32, micro_batch_size=1, schedule="dualpipe")
    assert parts.total_s == pytest.approx(parts.iteration_s)
    assert parts.iteration_s == pytest.approx(float(rank_ends(dual).end_s.max()))
    assert parts.seconds["ep_comm"] > 0 and parts.seconds["bubble"] >= 0


@pytest.mark.parametrize("schedule, ranks, expected", [
    ("dualpipe", 4, {(0, 0): (0, 0), (0, 3): (3, 0), (1, 0): (3, 1), (1, 3): (0, 1)}),
    ("dualpipev", 4, {(0, 0): (0, 0), (0, 3): (3, 0), (0, 4): (3, 1), (0, 7): (0, 1)}),
])
def test_layout_places_each_stage_and_back(schedule, ranks, expected):
    """DualPipe runs pipeline 1 in reverse (stage g on rank p-1-g, chunk 1); DualPipeV
    folds one 2p-stage pipeline into a V (stage g >= p on rank 2p-1-g, chunk 1). Every
    (pipeline, stage) maps to a (rank, chunk) that `place` maps back."""
    layout = dp.Layout(schedule, ranks, 4 * ranks)
    for (pipe, stage), (rank, chunk) in expected.items():
        assert (layout.rank_of(pipe, stage), layout.chunk_of(pipe, stage)) == (rank, chunk)
    for pipe in range(layout.pipelines):
        for stage in range(layout.stages):
            assert layout.place(layout.rank_of(pipe, stage), layout.chunk_of(pipe, stage)) == (pipe, stage)


@pytest.mark.parametrize(("schedule", "ranks", "microbatches"), [("dualpipe", 8, 32), ("dualpipev", 4, 12)])
def test_every_op_starts_when_its_rank_and_inputs_allow_whatever_the_costs(schedule, ranks, microbatches):
    """One compiled order serves every set of costs (z7-dualpipe): for random stage times, each
    op starts exactly at the later of its rank's previous op's end and its inputs' arrival
    (a forward: the previous stage's forward of that micro-batch plus the transfer; a backward:
    its own forward and the next stage's backward plus the transfer), and the shared rows are
    read-only."""
    rng = np.random.default_rng(7)
    stages = ranks if schedule == "dualpipe" else 2 * ranks
    layout = dp.Layout(schedule, ranks, microbatches)
    for _ in range(3):
        costs = dp.DualPipeCosts(*(rng.uniform(0.5, 3.0, stages) for _ in range(5)), rng.uniform(0.0, 0.5, stages - 1))
        run = dp.execute(schedule, ranks, microbatches, costs)
        assert not run.rank.flags.writeable
        fwd_end, bwd_end = {}, {}
        for i in range(run.rank.size):  # the outputs each (pipeline, stage, micro-batch) has when
            pipe, stage = layout.place(int(run.rank[i]), int(run.chunk[i]))
            key = (pipe, stage, int(run.microbatch[i]))
            pair_end = run.end_s[i + 1] if run.pair[i] and run.kind[i] == DualOp.F else run.end_s[i]
            if run.kind[i] == DualOp.F:
                fwd_end[key] = pair_end  # a pair sends its outputs once it ends
            elif run.kind[i] in (DualOp.B, DualOp.I):
                bwd_end[key] = run.end_s[i]
        for i in range(run.rank.size):
            if run.pair[i] and run.kind[i] == DualOp.B:
                assert run.start_s[i] == run.end_s[i - 1]  # a pair's backward share follows its forward's
                continue
            pipe, stage = layout.place(int(run.rank[i]), int(run.chunk[i]))
            mb, kind = int(run.microbatch[i]), run.kind[i]
            ready = [run.end_s[i - 1] if i and run.rank[i - 1] == run.rank[i] else 0.0]
            if kind == DualOp.F and stage > 0:
                ready.append(fwd_end[(pipe, stage - 1, mb)] + costs.send_s[stage - 1])
            if kind in (DualOp.B, DualOp.I) or (run.pair[i] and kind == DualOp.F):
                if run.pair[i]:  # the pair's backward half waits too: the pair starts when both can
                    j = i + 1
                    pipe2, stage2 = layout.place(int(run.rank[j]), int(run.chunk[j]))
                    mb2 = int(run.microbatch[j])
                else:
                    pipe2, stage2, mb2 = pipe, stage, mb
                if kind != DualOp.F or run.pair[i]:
                    ready.append(fwd_end[(pipe2, stage2, mb2)])
                    if stage2 < stages - 1:
                        ready.append(bwd_end[(pipe2, stage2 + 1, mb2)] + costs.send_s[stage2])
            if kind == DualOp.W:
                ready = ready[:1]
            assert run.start_s[i] == pytest.approx(max(ready), abs=1e-12), (i, kind)
