"""DistIR v0.1 semantics, kept only to reproduce the DistIR paper's published figures.

DistIR (EuroMLSys 2021) simulates its MLP programs op by op in program order: every
multi-device op is a barrier, nothing overlaps, and its v0.1 cost model carries unit
bugs (2 bytes per fp32 element in MatMul, a divisor of 8e9 bytes per Gbit, a x4 dtype
double count on Send and Allgather). This module reproduces those numbers
(docs/distir-cost-model.md) and returns the same `Timeline` as
paraplan's physical engine, which never carries these semantics.

Speed: the ops of one greedy-schedule unit (a stage's forward or backward of one
micro-batch) are merged into one cost, computed once per configuration with numpy
over the repeated layer structure; the greedy round order depends only on (P, M)
and is cached (`paraplan.sim.schedules.distir_greedy_rounds`, the rounds the schedule
`distir_greedy` also runs); replicas and tensor shards are symmetric, so one pipeline
(plus the host d0) is simulated and intra-group barriers become additions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, get_args

import numpy as np

from paraplan.core.errors import StrategyError
from paraplan.core.glossary import NO_MICROBATCH, EventKindCode, StreamCode
from paraplan.core.strategy import Strategy
from paraplan.core.timeline import Timeline, TimelineColumns
from paraplan.sim.schedules import distir_greedy_rounds

TP_FLOPS = 1e14  # DistIR's device throughput, FLOP/s
DRAM_BYTES_PER_S = 1.2e12  # DistIR's device memory bandwidth
FP32_BYTES = 4  # bytes per element of every tensor
SPLIT_S = 1e-6  # the only op with a launch term in v0.1
ELEMENTWISE_FLOPS_PER_ELEMENT = 4  # Relu, ReluGrad, Loss, LossGrad, Add

SendFilter = Literal["none", "fig3_dp", "fig3_pp"]
SEND_FILTERS: tuple[SendFilter, ...] = get_args(SendFilter)
Phase2 = Literal["v0.1", "csv"]
PHASE2_MODES: tuple[Phase2, ...] = get_args(Phase2)


@dataclass(frozen=True)
class DistirCostModel:
    """One revision of DistIR's cost model (docs/distir-cost-model.md, sections 1, 2 and 8)."""

    name: str
    matmul_bytes_per_element: int  # e: 2 in v0.1 (the bug), 4 after 83d7fc3
    bytes_per_gbit: float  # G: 8e9 in v0.1 (the 64x bug), 1.25e8 after the fix
    send_dtype_factor: float  # 4 (bytes counted twice) until DistIR main dropped it


V0_1 = DistirCostModel("v0.1", 2, 8e9, 4.0)
FIX_83D7FC3 = DistirCostModel("83d7fc3", 4, 1.25e8, 4.0)
FULLY_FIXED = DistirCostModel("fixed", 4, 1.25e8, 1.0)
CostModelName = Literal["v0.1", "83d7fc3", "fixed"]
COST_MODELS: dict[str, DistirCostModel] = {m.name: m for m in (V0_1, FIX_83D7FC3, FULLY_FIXED)}


@dataclass(frozen=True)
class MlpProgram:
    """DistIR's `mlp` example: `num_layers` square layers (dim x dim) with ReLU, a loss
    and its gradient, on `batch_size` samples; inputs on the host d0."""

    batch_size: int
    dim: int
    num_layers: int = 64


# ---------------------------------------------------------------- op costs (seconds)


def _matmul_s(m: float, k: float, n: float, cm: DistirCostModel) -> float:
    """X(m x k) . W(k x n): inputs read once, output not counted."""
    return cm.matmul_bytes_per_element * (m * k + k * n) / DRAM_BYTES_PER_S + 2 * m * k * n / TP_FLOPS


def _matmul_grad_s(m: float, k: float, n: float, cm: DistirCostModel) -> float:
    """dx and dw of X(m x k) . W(k x n) given dz (m x n)."""
    return _matmul_s(m, n, k, cm) + _matmul_s(k, m, n, cm)


def _elementwise_s(numel: float) -> float:
    return ELEMENTWISE_FLOPS_PER_ELEMENT * numel / TP_FLOPS


def _send_s(numel: float, bandwidth_Gbit_per_s: float, cm: DistirCostModel) -> float:
    return cm.send_dtype_factor * numel * FP32_BYTES / (cm.bytes_per_gbit * bandwidth_Gbit_per_s)


def _allreduce_s(numel: float, n: int, bandwidth_Gbit_per_s: float, cm: DistirCostModel) -> float:
    return 2 * (n - 1) / n * numel * FP32_BYTES / (cm.bytes_per_gbit * bandwidth_Gbit_per_s)


def _allgather_s(numel: float, n: int, bandwidth_Gbit_per_s: float, cm: DistirCostModel) -> float:
    return 2 * (n - 1) / n * cm.send_dtype_factor * numel * FP32_BYTES / (cm.bytes_per_gbit * bandwidth_Gbit_per_s)


def matmul_s(m: int, k: int, n: int, cost_model: DistirCostModel = V0_1) -> float:
    """Public for tests: MatMul(4096^3) = 1.430314 ms in v0.1."""
    return _matmul_s(m, k, n, cost_model)


def sequential_time_s(program: MlpProgram, cost_model: DistirCostModel = V0_1) -> float:
    """The whole program on d0 without Sends: Figure 3's baseline (274.707450 ms in
    v0.1 at batch 4096, dim 4096)."""
    b, d, n = program.batch_size, program.dim, program.num_layers
    act = _elementwise_s(b * d)
    fwd = _matmul_s(b, d, d, cost_model) + act
    bwd = act + _matmul_grad_s(b, d, d, cost_model)
    return n * fwd + 2 * act + n * bwd


@dataclass(frozen=True)
class _Plan:
    """The greedy schedule of (P, M) in the shapes the simulation loop and the event
    columns need; depends on nothing else, so it is computed once per (P, M)."""

    rounds: tuple[tuple[tuple[int, bool, int], ...], ...]
    sends: tuple[tuple[tuple[int, int], ...], ...]  # per round: (stage, peer) in emission order
    unit_stage: np.ndarray  # emission order of every unit
    unit_kind: np.ndarray
    unit_mb: np.ndarray
    send_stage: np.ndarray  # emission order of every activation / gradient Send
    send_mb: np.ndarray


@lru_cache(maxsize=256)
def _plan(num_stages: int, num_microbatches: int) -> _Plan:
    rounds = distir_greedy_rounds(num_stages, num_microbatches)
    last = num_stages - 1
    sends = tuple(
        tuple((s, s + 1 if f else s - 1) for s, f, _ in units if (f and s < last) or (not f and s > 0))
        for units in rounds
    )
    units = [u for r in rounds for u in r]
    send_units = [u for r in rounds for u in r if (u[1] and u[0] < last) or (not u[1] and u[0] > 0)]
    return _Plan(
        rounds, sends,
        np.array([u[0] for u in units], dtype=np.int32),
        np.array([EventKindCode.FWD if u[1] else EventKindCode.BWD for u in units], dtype=np.int8),
        np.array([u[2] for u in units], dtype=np.int32),
        np.array([u[0] for u in send_units], dtype=np.int32),
        np.array([u[2] for u in send_units], dtype=np.int32),
    )


# ---------------------------------------------------------------- per-configuration costs


@dataclass(frozen=True)
class _StageCosts:
    """Costs of one stage (every stage holds the same even number of layers, so all
    stages cost the same; the last one adds Loss and LossGrad)."""

    fwd_layers_s: tuple[float, ...]  # per layer: MatMul + HP Allreduce + Relu
    fwd_s: float
    bwd_first_s: float  # micro-batch 0: Identity instead of Add
    bwd_s: float  # micro-batches > 0: with the Add into the dw accumulator
    compute_s: float  # one stage, all micro-batches, without HP Allreduces (for the bubble)
    loss_s: float
    phase2_first_s: float  # stage 0: dw Allreduces (+ dy0 Allgather)
    phase2_mid_s: float
    phase2_last_s: float  # stage P-1: dw Allreduces (+ l Allgather)


@lru_cache(maxsize=1024)
def _stage_costs(
    program: MlpProgram, d_degree: int, h_degree: int, p_degree: int, microbatches: int,
    bandwidth_Gbit_per_s: float, cm: DistirCostModel, phase2: str,
) -> _StageCosts:
    d, h = program.dim, h_degree
    b = program.batch_size / (d_degree * microbatches)
    dh = d / h
    pairs = program.num_layers // p_degree // 2  # (even, odd) layer pairs per stage
    nl = 2 * pairs
    # Even layers hold a column shard (d x d/H), odd layers a row shard (d/H x d).
    mm_even, mm_odd = _matmul_s(b, d, dh, cm), _matmul_s(b, dh, d, cm)
    mmg_even, mmg_odd = _matmul_grad_s(b, d, dh, cm), _matmul_grad_s(b, dh, d, cm)
    ar_act = _allreduce_s(b * d, h, bandwidth_Gbit_per_s, cm) if h > 1 else 0.0
    act_full, act_shard = _elementwise_s(b * d), _elementwise_s(b * dh)
    add_s = _elementwise_s(d * dh)

    fwd_even, fwd_odd = mm_even + act_shard, mm_odd + ar_act + act_full
    bwd_odd, bwd_even = act_full + mmg_odd, act_shard + mmg_even + ar_act
    fwd_pair = fwd_even + fwd_odd
    bwd_pair = bwd_odd + bwd_even
    fwd_compute = pairs * (mm_even + act_shard + mm_odd + act_full)
    bwd_compute = pairs * (act_full + mmg_odd + act_shard + mmg_even)

    # Phase 2: gradient Allreduce (and Allgathers of l and dy0) across replicas.
    ar_total = gather = 0.0
    if d_degree > 1:
        if phase2 == "csv":
            ar_total = nl * _allreduce_s(d * dh, h if h > 1 else d_degree, bandwidth_Gbit_per_s, cm)
        else:
            ar_total = nl * _allreduce_s(d * dh, d_degree, bandwidth_Gbit_per_s, cm)
            gather = _allgather_s(program.batch_size / d_degree * d, d_degree, bandwidth_Gbit_per_s, cm)
    first = ar_total + gather
    last = ar_total + gather if p_degree > 1 else ar_total + 2 * gather
    return _StageCosts(
        fwd_layers_s=(fwd_even, fwd_odd) * pairs,
        fwd_s=pairs * fwd_pair,
        bwd_first_s=pairs * bwd_pair,
        bwd_s=pairs * bwd_pair + nl * add_s,
        compute_s=microbatches * (fwd_compute + bwd_compute) + (microbatches - 1) * nl * add_s,
        loss_s=2 * act_full,
        phase2_first_s=first if p_degree > 1 else last,
        phase2_mid_s=ar_total,
        phase2_last_s=last,
    )


def clear_caches() -> None:
    """Forget cached schedules and stage costs (timings then start cold, like a fresh process)."""
    distir_greedy_rounds.cache_clear()
    _plan.cache_clear()
    _stage_costs.cache_clear()


# ---------------------------------------------------------------- simulation


def microbatch_counts(global_batch_size: int, data_parallel_size: int, pipeline_model_parallel_size: int) -> list[int]:
    """Figure 4's micro-batch rule: 1 without pipelining, else 2^k for
    k = 1 .. floor(log2(batch / D) / 2) - 1."""
    if pipeline_model_parallel_size == 1:
        return [1]
    k_max = int(np.floor(np.log2(global_batch_size / data_parallel_size) / 2)) - 1
    return [2**k for k in range(1, k_max + 1)]


def _check_distir(program: MlpProgram, strategy: Strategy, sends: str, phase2: str) -> None:
    """What DistIR's MLP transform takes: D, H, P and M only, even stages of an even
    number of layers, batch and width divisible by the degrees."""
    D, H, P, M = (strategy.data_parallel_size, strategy.tensor_model_parallel_size,
                  strategy.pipeline_model_parallel_size, strategy.num_microbatches)
    if P > 1 and strategy.schedule != "distir_greedy":
        raise StrategyError(f"DistIR pipelines run schedule 'distir_greedy', got '{strategy.schedule}'")
    if strategy.virtual_pipeline_model_parallel_size > 1 or strategy.gradient_sync != "end" \
            or strategy.stage_boundaries or strategy.stage_replicas or strategy.placement:
        raise StrategyError("DistIR's MLP transform takes D, H, P and M only (even stages, gradients at the end)")
    if sends not in SEND_FILTERS:
        raise StrategyError(f"unknown DistIR send filter '{sends}'; known: {', '.join(SEND_FILTERS)}")
    if phase2 not in PHASE2_MODES:
        raise StrategyError(f"unknown DistIR phase-2 variant '{phase2}'; known: {', '.join(PHASE2_MODES)}")
    if P == 1 and M != 1:
        raise StrategyError(f"DistIR uses one micro-batch without pipelining, got P=1 M={M}")
    if program.num_layers % P or (program.num_layers // P) % 2:
        raise StrategyError(
            f"DistIR's transform needs an even number of layers per stage: {program.num_layers} layers, P={P}"
        )
    if program.batch_size % (D * M) or program.dim % H:
        raise StrategyError(
            f"batch {program.batch_size} must divide by D*M={D * M} and dim {program.dim} by H={H}"
        )


def _input_s(program: MlpProgram, data_parallel_size: int, bandwidth_Gbit_per_s: float, cost_model: DistirCostModel,
             sends: SendFilter) -> float:
    """Phase 0: Sends of the inputs from d0 to replica 0's root (x and z, and with
    `sends` none every weight); cost-0 Scatters/Broadcasts when D > 1."""
    if data_parallel_size > 1 or sends == "fig3_dp":
        return 0.0
    n_weight = program.num_layers if sends == "none" else 0
    d = program.dim
    return (2 * _send_s(program.batch_size * d, bandwidth_Gbit_per_s, cost_model)
            + n_weight * _send_s(d * d, bandwidth_Gbit_per_s, cost_model))


@dataclass(frozen=True)
class _UnitCosts:
    """What the greedy rounds charge: the stage costs and the Sends' times."""

    stage: _StageCosts
    act_send_s: float  # activation, dy and z micro-batch
    weight_send_s: float
    lazy_sends: bool  # each weight Sent from stage 0 just before its first MatMul
    stages: int


def _forward_end(uc: _UnitCosts, clock: list[float], s: int, m: int, start: float) -> float:
    """When stage s's forward of micro-batch m ends (moving stage 0's clock for the
    weight Sends and the z Send it makes on the way)."""
    costs = uc.stage
    if uc.lazy_sends and m == 0 and s > 0:
        c0, cs = clock[0], start
        for layer_s in costs.fwd_layers_s:
            t = (c0 if c0 > cs else cs) + uc.weight_send_s
            c0, cs = t, t + layer_s
        clock[0] = c0
        end = cs
    else:
        end = start + costs.fwd_s
    if s == uc.stages - 1:
        if uc.stages > 1:  # the z micro-batch comes from stage 0 right before Loss
            c0 = clock[0]
            t = (c0 if c0 > end else end) + uc.act_send_s
            clock[0] = t
            end = t + costs.loss_s
        else:
            end += costs.loss_s
    return end


def _run_rounds(plan: _Plan, uc: _UnitCosts, clock: list[float],
                record_events: bool) -> tuple[list[float], list[float], list[float]]:
    """Phase 1: the greedy rounds in program order on each stage's clock; the unit
    starts and ends and the Sends' ends (when recorded)."""
    starts: list[float] = []
    ends: list[float] = []
    send_ends: list[float] = []
    start_at, end_at, send_at = starts.append, ends.append, send_ends.append
    bwd_s, bwd_first_s, act_send_s = uc.stage.bwd_s, uc.stage.bwd_first_s, uc.act_send_s
    for units, round_sends in zip(plan.rounds, plan.sends, strict=True):
        for s, is_f, m in units:
            start = clock[s]
            end = _forward_end(uc, clock, s, m, start) if is_f else start + (bwd_s if m else bwd_first_s)
            clock[s] = end
            if record_events:
                start_at(start)
                end_at(end)
        for s, peer in round_sends:
            a, c = clock[s], clock[peer]
            t = (a if a > c else c) + act_send_s
            clock[s] = clock[peer] = t
            if record_events:
                send_at(t)
    return starts, ends, send_ends


def simulate_distir(
    program: MlpProgram,
    strategy: Strategy,
    bandwidth_Gbit_per_s: float,
    cost_model: DistirCostModel = V0_1,
    sends: SendFilter = "none",
    phase2: Phase2 = "v0.1",
    baseline_s: float | None = None,
    record_events: bool = True,
) -> Timeline:
    """Simulate `mlp_dhp_transform(D, H, P, M)` of `program` as DistIR's simulator does,
    for `strategy` (D, T (DistIR's H), P, M; schedule `distir_greedy` when P > 1).

    - `sends`: which Sends Figure 3's `filter_transform` removed: `none` (Figure 4),
      `fig3_dp` (Broadcasts and every Send), `fig3_pp` (weight Sends, keeping x and z).
    - `phase2`: `v0.1` (dw Allreduce over D + Allgathers of l and dy0) or `csv` (the
      pre-v0.1 revision that produced Figure 4's CSV: no Allgathers, dw Allreduce
      over H when H > 1).
    - `baseline_s`: the speedup's reference time (default: the sequential program).

    Only replica 0, shard 0 is recorded (devices 0..P-1, by stage); the others are
    identical. Peak memory is not modelled.
    """
    _check_distir(program, strategy, sends, phase2)
    D, H, P, M = (strategy.data_parallel_size, strategy.tensor_model_parallel_size,
                  strategy.pipeline_model_parallel_size, strategy.num_microbatches)
    b, d = program.batch_size // (D * M), program.dim
    costs = _stage_costs(program, D, H, P, M, float(bandwidth_Gbit_per_s), cost_model, phase2)
    plan = _plan(P, M)
    uc = _UnitCosts(costs, _send_s(b * d, bandwidth_Gbit_per_s, cost_model),
                    _send_s(d * d / H, bandwidth_Gbit_per_s, cost_model), sends == "none", P)
    input_s = _input_s(program, D, bandwidth_Gbit_per_s, cost_model, sends)
    clock = [0.0] * P
    host = clock[0] = input_s
    if P > 1:
        clock[0] += 2 * SPLIT_S  # Split x and z into M parts on each HP root
    starts, ends, send_ends = _run_rounds(plan, uc, clock, record_events)

    # Phase 2: per-device additions (the barriers span identical replicas).
    phase2_s = [costs.phase2_mid_s] * P
    phase2_s[0], phase2_s[-1] = costs.phase2_first_s, costs.phase2_last_s
    phase2_start = list(clock)
    clock = [c + x for c, x in zip(clock, phase2_s, strict=True)]
    step_s = max(max(clock), host)
    bubble = 1.0 - (P * costs.compute_s + M * costs.loss_s) / (P * step_s)
    baseline = sequential_time_s(program, cost_model) if baseline_s is None else baseline_s
    if record_events:
        columns = _columns(plan, starts, ends, send_ends, uc.act_send_s, input_s, phase2_start, phase2_s)
    else:
        columns = _columns(plan, None, None, None, 0.0, 0.0, [], [])
    return Timeline(**columns, step_time_s=step_s, batch_size=program.batch_size, num_devices=D * H * P,
                    speedup=baseline / step_s, bubble_fraction=bubble)


def _columns(plan: _Plan, starts, ends, send_ends, send_s: float, input_s: float,
             phase2_start: list[float], phase2_s: list[float]) -> TimelineColumns:
    """Event columns: units (compute), Sends between stages, the inputs' Sends from d0
    (on stage 0), and Phase 2 (one all-reduce event per stage)."""
    if starts is None:
        empty_i, empty_f = np.zeros(0, dtype=np.int32), np.zeros(0)
        return TimelineColumns(device=empty_i, stream=np.zeros(0, dtype=np.int8), kind=np.zeros(0, dtype=np.int8),
                               stage=empty_i, microbatch=empty_i, start_s=empty_f, end_s=empty_f)
    n_units, n_sends = plan.unit_stage.shape[0], plan.send_stage.shape[0]
    extra_stage = [0] if input_s > 0 else []
    extra_kind = [EventKindCode.SEND] if input_s > 0 else []
    extra_start = [0.0] if input_s > 0 else []
    extra_end = [input_s] if input_s > 0 else []
    for s, (t0, dt) in enumerate(zip(phase2_start, phase2_s, strict=True)):
        if dt > 0:
            extra_stage.append(s)
            extra_kind.append(EventKindCode.ALLREDUCE)
            extra_start.append(t0)
            extra_end.append(t0 + dt)
    n_extra = len(extra_stage)
    stage = np.concatenate([plan.unit_stage, plan.send_stage, np.array(extra_stage, dtype=np.int32)])
    send_end = np.array(send_ends, dtype=float)
    return TimelineColumns(
        device=stage,
        stream=np.concatenate([np.full(n_units, StreamCode.COMPUTE, dtype=np.int8),
                               np.full(n_sends + n_extra, StreamCode.COMM, dtype=np.int8)]),
        kind=np.concatenate([plan.unit_kind, np.full(n_sends, EventKindCode.SEND, dtype=np.int8),
                             np.array(extra_kind, dtype=np.int8)]),
        stage=stage.copy(),
        microbatch=np.concatenate([plan.unit_mb, plan.send_mb, np.full(n_extra, NO_MICROBATCH, dtype=np.int32)]),
        start_s=np.concatenate([np.array(starts, dtype=float), send_end - send_s, np.array(extra_start)]),
        end_s=np.concatenate([np.array(ends, dtype=float), send_end, np.array(extra_end)]),
    )
