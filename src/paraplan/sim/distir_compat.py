"""DistIR v0.1 semantics, kept only to reproduce seed 000's published figures.

DistIR (EuroMLSys 2021) simulates its MLP programs op by op in program order: every
multi-device op is a barrier, nothing overlaps, and its v0.1 cost model carries unit
bugs (2 bytes per fp32 element in MatMul, a divisor of 8e9 bytes per Gbit, a x4 dtype
double count on Send and Allgather). This module reproduces those numbers
(../shared/reference/distir/cost-model.md) and returns the same `Timeline` as
paraplan's physical engine, which never carries these semantics.

Speed: the ops of one greedy-schedule unit (a stage's forward or backward of one
micro-batch) are merged into one cost, computed once per configuration with numpy
over the repeated layer structure; the greedy round order depends only on (P, M)
and is cached; replicas and tensor shards are symmetric, so one pipeline (plus the
host d0) is simulated and intra-group barriers become additions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from paraplan.core.errors import StrategyError
from paraplan.core.timeline import KINDS, STREAMS, Timeline

TP_FLOPS = 1e14  # DistIR's device throughput, FLOP/s
DRAM_BYTES_PER_S = 1.2e12  # DistIR's device memory bandwidth
FP32_BYTES = 4  # bytes per element of every tensor
SPLIT_S = 1e-6  # the only op with a launch term in v0.1
ELEMENTWISE_FLOPS_PER_ELEMENT = 4  # Relu, ReluGrad, Loss, LossGrad, Add

SEND_FILTERS = ("none", "fig3_dp", "fig3_pp")
PHASE2_MODES = ("v0.1", "csv")


@dataclass(frozen=True)
class DistirCostModel:
    """One revision of DistIR's cost model (cost-model.md sections 1, 2 and 8)."""

    name: str
    matmul_bytes_per_element: int  # e: 2 in v0.1 (the bug), 4 after 83d7fc3
    bytes_per_gbit: float  # G: 8e9 in v0.1 (the 64x bug), 1.25e8 after the fix
    send_dtype_factor: float  # 4 (bytes counted twice) until DistIR main dropped it


V0_1 = DistirCostModel("v0.1", 2, 8e9, 4.0)
FIX_83D7FC3 = DistirCostModel("83d7fc3", 4, 1.25e8, 4.0)
FULLY_FIXED = DistirCostModel("fixed", 4, 1.25e8, 1.0)
COST_MODELS = {m.name: m for m in (V0_1, FIX_83D7FC3, FULLY_FIXED)}


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


def _send_s(numel: float, bandwidth_gbps: float, cm: DistirCostModel) -> float:
    return cm.send_dtype_factor * numel * FP32_BYTES / (cm.bytes_per_gbit * bandwidth_gbps)


def _allreduce_s(numel: float, n: int, bandwidth_gbps: float, cm: DistirCostModel) -> float:
    return 2 * (n - 1) / n * numel * FP32_BYTES / (cm.bytes_per_gbit * bandwidth_gbps)


def _allgather_s(numel: float, n: int, bandwidth_gbps: float, cm: DistirCostModel) -> float:
    return 2 * (n - 1) / n * cm.send_dtype_factor * numel * FP32_BYTES / (cm.bytes_per_gbit * bandwidth_gbps)


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


# ---------------------------------------------------------------- greedy schedule


@lru_cache(maxsize=256)
def greedy_rounds(num_stages: int, num_microbatches: int) -> tuple[tuple[tuple[int, bool, int], ...], ...]:
    """DistIR's PipeDream scheduler: per round, each stage with a ready unit takes one,
    alternating forward and backward when both are ready (first preference: forward),
    lowest micro-batch first; readiness counts only units of earlier rounds.

    Returns rounds of (stage, is_forward, microbatch), stages ascending.
    """
    p, m_total = num_stages, num_microbatches
    next_f = [0] * p  # forwards and backwards of a stage run in micro-batch order
    next_b = [0] * p
    last_was_f = [False] * p
    rounds = []
    while next_b[0] < m_total:
        done_f, done_b = list(next_f), list(next_b)
        units = []
        for s in range(p):
            f_ready = next_f[s] < m_total and (s == 0 or done_f[s - 1] > next_f[s])
            b_ready = next_b[s] < done_f[s] and (s == p - 1 or done_b[s + 1] > next_b[s])
            if not (f_ready or b_ready):
                continue
            take_f = f_ready if not last_was_f[s] else not b_ready
            if take_f:
                units.append((s, True, next_f[s]))
                next_f[s] += 1
            else:
                units.append((s, False, next_b[s]))
                next_b[s] += 1
            last_was_f[s] = take_f
        rounds.append(tuple(units))
    return tuple(rounds)


# ---------------------------------------------------------------- per-configuration costs


@dataclass(frozen=True)
class _StageCosts:
    fwd_layers_s: tuple[tuple[float, ...], ...]  # per stage, per layer: MatMul + HP Allreduce + Relu
    fwd_s: tuple[float, ...]
    bwd_first_s: tuple[float, ...]  # micro-batch 0: Identity instead of Add
    bwd_s: tuple[float, ...]  # micro-batches > 0: with the Add into the dw accumulator
    fwd_compute_s: tuple[float, ...]  # without HP Allreduces (for the bubble)
    bwd_first_compute_s: tuple[float, ...]
    bwd_compute_s: tuple[float, ...]
    loss_s: float
    phase2_s: tuple[float, ...]


@lru_cache(maxsize=1024)
def _stage_costs(
    program: MlpProgram, d_degree: int, h_degree: int, p_degree: int, microbatch_rows: float,
    bandwidth_gbps: float, cm: DistirCostModel, phase2: str,
) -> _StageCosts:
    d, n_layers, b, h = program.dim, program.num_layers, microbatch_rows, h_degree
    dh = d / h
    # Even layers hold a column shard (d x d/H), odd layers a row shard (d/H x d).
    mm_even = _matmul_s(b, d, dh, cm)
    mm_odd = _matmul_s(b, dh, d, cm)
    mmg_even = _matmul_grad_s(b, d, dh, cm)
    mmg_odd = _matmul_grad_s(b, dh, d, cm)
    ar_act = _allreduce_s(b * d, h, bandwidth_gbps, cm) if h > 1 else 0.0
    act_full, act_shard = _elementwise_s(b * d), _elementwise_s(b * dh)
    add_s = _elementwise_s(d * dh)

    odd = (np.arange(n_layers) % 2).astype(bool)
    fwd_compute = np.where(odd, mm_odd + act_full, mm_even + act_shard)
    fwd_layer = np.where(odd, mm_odd + ar_act + act_full, mm_even + act_shard)
    bwd_compute = np.where(odd, act_full + mmg_odd, act_shard + mmg_even)
    bwd_layer = np.where(odd, act_full + mmg_odd, act_shard + mmg_even + ar_act)

    bounds = [s * n_layers // p_degree for s in range(p_degree + 1)]
    stage = [slice(bounds[s], bounds[s + 1]) for s in range(p_degree)]
    nl = [bounds[s + 1] - bounds[s] for s in range(p_degree)]

    # Phase 2: gradient Allreduce (and Allgathers of l and dy0) across replicas.
    phase2_s = [0.0] * p_degree
    if d_degree > 1:
        if phase2 == "csv":
            n_ar = h if h > 1 else d_degree
            ar_w = _allreduce_s(d * dh, n_ar, bandwidth_gbps, cm)
            gather = 0.0
        else:
            ar_w = _allreduce_s(d * dh, d_degree, bandwidth_gbps, cm)
            gather = _allgather_s(program.batch_size / d_degree * d, d_degree, bandwidth_gbps, cm)
        phase2_s = [nl[s] * ar_w for s in range(p_degree)]
        phase2_s[0] += gather
        phase2_s[-1] += gather

    return _StageCosts(
        fwd_layers_s=tuple(tuple(fwd_layer[sl].tolist()) for sl in stage),
        fwd_s=tuple(float(fwd_layer[sl].sum()) for sl in stage),
        bwd_first_s=tuple(float(bwd_layer[sl].sum()) for sl in stage),
        bwd_s=tuple(float(bwd_layer[sl].sum()) + nl[s] * add_s for s, sl in enumerate(stage)),
        fwd_compute_s=tuple(float(fwd_compute[sl].sum()) for sl in stage),
        bwd_first_compute_s=tuple(float(bwd_compute[sl].sum()) for sl in stage),
        bwd_compute_s=tuple(float(bwd_compute[sl].sum()) + nl[s] * add_s for s, sl in enumerate(stage)),
        loss_s=2 * act_full,
        phase2_s=tuple(phase2_s),
    )


def clear_caches() -> None:
    """Forget cached schedules and stage costs (timings then start cold, like a fresh process)."""
    greedy_rounds.cache_clear()
    _stage_costs.cache_clear()


# ---------------------------------------------------------------- simulation

_K_FWD, _K_BWD = KINDS.index("fwd"), KINDS.index("bwd")
_K_SEND, _K_AR = KINDS.index("send"), KINDS.index("allreduce")
_S_COMPUTE, _S_COMM = STREAMS.index("compute"), STREAMS.index("comm")


def microbatch_counts(batch_size: int, data_degree: int, pipeline_degree: int) -> list[int]:
    """Figure 4's micro-batch rule: 1 without pipelining, else 2^k for
    k = 1 .. floor(log2(batch / D) / 2) - 1."""
    if pipeline_degree == 1:
        return [1]
    k_max = int(np.floor(np.log2(batch_size / data_degree) / 2)) - 1
    return [2**k for k in range(1, k_max + 1)]


def simulate_distir(
    program: MlpProgram,
    data_degree: int,
    tensor_degree: int,
    pipeline_degree: int,
    microbatches: int,
    bandwidth_gbps: float,
    cost_model: DistirCostModel = V0_1,
    sends: str = "none",
    phase2: str = "v0.1",
    baseline_s: float | None = None,
    record_events: bool = True,
) -> Timeline:
    """Simulate `mlp_dhp_transform(D, H, P, M)` of `program` as DistIR's simulator does.

    - `sends`: which Sends Figure 3's `filter_transform` removed: `none` (Figure 4),
      `fig3_dp` (Broadcasts and every Send), `fig3_pp` (weight Sends, keeping x and z).
    - `phase2`: `v0.1` (dw Allreduce over D + Allgathers of l and dy0) or `csv` (the
      pre-v0.1 revision that produced Figure 4's CSV: no Allgathers, dw Allreduce
      over H when H > 1).
    - `baseline_s`: the speedup's reference time (default: the sequential program).

    Only replica 0, shard 0 is recorded (devices 0..P-1, by stage); the others are
    identical. Peak memory is not modelled.
    """
    D, H, P, M = data_degree, tensor_degree, pipeline_degree, microbatches
    if sends not in SEND_FILTERS:
        raise StrategyError(f"unknown DistIR send filter '{sends}'; known: {', '.join(SEND_FILTERS)}")
    if phase2 not in PHASE2_MODES:
        raise StrategyError(f"unknown DistIR phase-2 variant '{phase2}'; known: {', '.join(PHASE2_MODES)}")
    if min(D, H, P, M) < 1:
        raise StrategyError(f"degrees and micro-batches must be >= 1, got D={D} H={H} P={P} M={M}")
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
    b = program.batch_size // (D * M)
    d = program.dim
    costs = _stage_costs(program, D, H, P, float(b), float(bandwidth_gbps), cost_model, phase2)
    act_send_s = _send_s(b * d, bandwidth_gbps, cost_model)  # activation, dy and z micro-batch
    weight_send_s = _send_s(d * d / H, bandwidth_gbps, cost_model)
    lazy_sends = sends == "none"

    clock = [0.0] * P
    host = 0.0
    ev: list[tuple[int, int, int, int, int, float, float]] = []
    record = ev.append if record_events else None

    # Phase 0: inputs from d0 to replica 0's root (cost-0 Scatters/Broadcasts when D > 1).
    if D == 1 and sends != "fig3_dp":
        input_send_s = _send_s(program.batch_size * d, bandwidth_gbps, cost_model)
        n_weight = program.num_layers if sends == "none" else 0
        total = 2 * input_send_s + n_weight * _send_s(d * d, bandwidth_gbps, cost_model)
        host = clock[0] = total
        if record:
            record((0, _S_COMM, _K_SEND, 0, -1, 0.0, total))
    if P > 1:
        clock[0] += 2 * SPLIT_S  # Split x and z into M parts on each HP root

    last = P - 1
    loss_s = costs.loss_s
    fwd_s, bwd_s, bwd_first_s = costs.fwd_s, costs.bwd_s, costs.bwd_first_s
    for units in greedy_rounds(P, M):
        for s, is_f, m in units:
            start = clock[s]
            if is_f:
                if lazy_sends and m == 0 and s > 0:
                    # each weight is Sent from stage 0 just before its first MatMul
                    c0, cs = clock[0], clock[s]
                    for layer_s in costs.fwd_layers_s[s]:
                        t = (c0 if c0 > cs else cs) + weight_send_s
                        c0, cs = t, t + layer_s
                    clock[0], clock[s] = c0, cs
                else:
                    clock[s] = start + fwd_s[s]
                if s == last:
                    if P > 1:  # the z micro-batch comes from stage 0 right before Loss
                        c0, cs = clock[0], clock[s]
                        t = (c0 if c0 > cs else cs) + act_send_s
                        clock[0] = t
                        clock[s] = t + loss_s
                    else:
                        clock[s] += loss_s
                if record:
                    record((s, _S_COMPUTE, _K_FWD, s, m, start, clock[s]))
            else:
                clock[s] = start + (bwd_first_s[s] if m == 0 else bwd_s[s])
                if record:
                    record((s, _S_COMPUTE, _K_BWD, s, m, start, clock[s]))
        if P > 1:
            for s, is_f, m in units:
                if is_f:
                    if s == last:
                        continue
                    peer = s + 1
                elif s == 0:
                    continue
                else:
                    peer = s - 1
                a, c = clock[s], clock[peer]
                t = (a if a > c else c) + act_send_s
                clock[s] = clock[peer] = t
                if record:
                    record((s, _S_COMM, _K_SEND, s, m, t - act_send_s, t))

    # Phase 2: per-device additions (the barriers span identical replicas).
    for s in range(P):
        if costs.phase2_s[s] > 0:
            if record:
                record((s, _S_COMM, _K_AR, s, -1, clock[s], clock[s] + costs.phase2_s[s]))
            clock[s] += costs.phase2_s[s]
    step_s = max(max(clock), host)

    compute = sum(
        M * costs.fwd_compute_s[s] + costs.bwd_first_compute_s[s] + (M - 1) * costs.bwd_compute_s[s]
        for s in range(P)
    ) + M * loss_s
    bubble = 1.0 - compute / (P * step_s)
    baseline = sequential_time_s(program, cost_model) if baseline_s is None else baseline_s
    columns = _columns(ev)
    return Timeline(
        **columns,
        step_time_s=step_s,
        batch_size=program.batch_size,
        num_devices=D * H * P,
        speedup=baseline / step_s,
        bubble_fraction=bubble,
    )


def _columns(ev: list[tuple]) -> dict[str, np.ndarray]:
    arr = np.array(ev, dtype=float) if ev else np.empty((0, 7))
    return {
        "device": arr[:, 0].astype(np.int32),
        "stream": arr[:, 1].astype(np.int8),
        "kind": arr[:, 2].astype(np.int8),
        "stage": arr[:, 3].astype(np.int32),
        "microbatch": arr[:, 4].astype(np.int32),
        "start_s": arr[:, 5].copy(),
        "end_s": arr[:, 6].copy(),
    }
