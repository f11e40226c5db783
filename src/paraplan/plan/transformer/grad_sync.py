"""The transformer planner's estimate of the gradient reduction a pipeline's first rank
leaves exposed past its last backward (`estimate.py`), in the buckets the engine cuts
(`paraplan.predict.rank_state._stage_grad_sync`, `paraplan.predict.megatron_ddp`) and,
interleaved, with each model chunk reduced once its last backward ends."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from paraplan.core.comm import CommModel, Group
from paraplan.core.run_settings import RunSettings
from paraplan.plan.transformer.columns import CandidateColumns, StageLayers, StageParams
from paraplan.plan.transformer.overlap_terms import comm_s
from paraplan.predict.build import GRAD_BUCKET_PARAMS, Precision
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.megatron_ddp import bucket_params_for
from paraplan.sim.builder.grad_buckets import equal_buckets

if TYPE_CHECKING:  # the estimate's own columns (estimate.py imports this module)
    from paraplan.plan.transformer.estimate import _LayerTimes as LayerTimes
    from paraplan.plan.transformer.estimate import _StageTimes as StageTimes
    from paraplan.plan.transformer.estimate import _Weights as Weights


def _buckets_s(comm: CommModel, collective: str, params: float, bucket_params: float, group: Group,
               grad_bytes: float, memo: dict[tuple[str, float, float, Group], tuple[int, float]]) -> tuple[int, float]:
    """The count of `bucket_params` buckets (`equal_buckets`) of `params` gradients and one
    bucket's time; `memo` per (collective, parameters, bucket, group), which many candidates
    share (they differ in micro-batch, recomputation or schedule)."""
    key = (collective, params, bucket_params, group)
    if key not in memo:
        split = equal_buckets(params, bucket_params)
        memo[key] = split.count, float(comm.time_s(collective, split.each * grad_bytes, group))
    return memo[key]


def _chunks_exposed_s(first_s: float, each_s: float, v: int, gap_s: float) -> float:
    """The exposed part of an interleaved rank's reduction whose chunks launch one after
    another on one stream, each once its last backward has ended (the first model chunk
    last, `first_s` of reduction; the v - 1 others `each_s` each, ready `gap_s` apart): the
    queue from the n-th last chunk on ends no earlier than n (each - gap) + first past the
    backward's end, largest at n = v - 1 or 1."""
    if v <= 1:
        return 0.0
    return first_s + (v - 1 if each_s > gap_s else 1) * (each_s - gap_s)


def gradient_sync_s(cols: CandidateColumns, params: StageParams, times: LayerTimes, layers: StageLayers,
                     weights: Weights, st: StageTimes, comm: CommModel, prec: Precision, base: RunSettings,
                     eff: DeviceEfficiency, timed: np.ndarray, share: np.ndarray) -> np.ndarray:
    """Gradient reduction exposed past the first stage's last backward op (ZeRO-2 reduces
    every micro-batch, per layer: `_layer_times`; ZeRO-3, with or without pipelines,
    reduce-scatters once after the last micro-batch, as the distributed optimizer); the experts' over the
    expert-data-parallel group (stride EP x ETP). The buckets as the engine cuts them
    (`rank_state._stage_grad_sync`): Megatron-Core's DDP buckets the first rank's first
    chunk in `megatron_bucket_params` (1M per data-parallel rank, at least 40M) with the
    embedding apart, ready last, and reduces every other chunk in one bucket
    (`megatron_ddp`); ZeRO-3 one bucket per layer; torch DDP `GRAD_BUCKET_PARAMS`. The
    first chunk's buckets hide up to half its last backward, the last one and the
    embedding's exposed. Interleaved, each other chunk is reduced once its last backward
    ends: the first rank runs min(p, M) backwards of the next chunk between two chunks'
    last backwards, so their reductions hide unless they queue up (`_chunks_exposed_s`).
    The part that hides still slows the compute beside it by `share` (per candidate: the
    occupancy share of its data-parallel group, `paraplan.predict.overlap_share`), as the
    engine charges its buckets (`paraplan.sim.overlap_cost`): exposed + share x hidden."""
    sync = np.zeros(len(cols))
    window = np.where(cols.single, st.whole, st.first)
    gap = np.minimum(cols.p, cols.m) * times.op_s(layers.n_chunk, eff, True)
    megatron = (cols.cand.zero < 3) & (base.DDP_impl == "local") & (not base.use_torch_fsdp2)
    embedding = weights.vocab + weights.positions
    memo: dict[tuple[str, float, float, Group], tuple[int, float]] = {}

    def exposed(i: int, total: float, chunk: float, group: Group, bucket: float, apart: float) -> float:
        """`total` gradients of which each of the v - 1 later chunks holds `chunk`, `apart` of the first
        chunk's in a bucket of their own, in buckets of `bucket` (a later chunk in one where `megatron`)."""
        collective = "reduce_scatter" if cols.sharded[i] else "all_reduce"
        v = int(cols.v[i])
        rest = total - (v - 1) * chunk - apart
        count, one = _buckets_s(comm, collective, rest, bucket, group, prec.grad_bytes, memo)
        apart_s = _buckets_s(comm, collective, apart, apart, group, prec.grad_bytes, memo)[1] if apart else 0.0
        first = max(one, count * one - 0.5 * window[i]) + apart_s
        if v == 1:
            return first + share[i] * max(count * one + apart_s - first, 0.0)
        chunk_bucket = chunk if megatron[i] else bucket
        n, each = _buckets_s(comm, collective, chunk, chunk_bucket, group, prec.grad_bytes, memo)
        shown = max(first, _chunks_exposed_s(count * one + apart_s, n * each, v, float(gap[i])))
        return shown + share[i] * max(count * one + apart_s + (v - 1) * n * each - shown, 0.0)

    for i in np.flatnonzero((cols.dc > 1) & (cols.cand.zero != 2) & timed):  # ZeRO-2: every micro-batch
        group = Group(int(cols.dc[i]), int(cols.dp_nodes[i]))
        bucket = (bucket_params_for(cols.dc[i]) if megatron[i]
                  else float(weights.layer[i]) if cols.zero3[i] else GRAD_BUCKET_PARAMS)
        chunk = float(layers.n_chunk[i] * weights.layer[i])
        sync[i] = exposed(int(i), float(params.first[i]), chunk, group, max(bucket, 1.0),
                          float(embedding[i]) if megatron[i] else 0.0)
    for i in np.flatnonzero((cols.edp > 1) & (params.first_experts > 0) & timed):
        group = Group(int(cols.edp[i]), int(cols.edp_nodes[i]))
        bucket = (bucket_params_for(cols.dc[i]) if megatron[i]
                  else float(weights.expert_layer[i]) if cols.zero3[i] else GRAD_BUCKET_PARAMS)
        chunk = float(params.first_experts[i] / cols.v[i])
        sync[i] += exposed(int(i), float(params.first_experts[i]), chunk, group, max(bucket, 1.0), 0.0)
    return sync


def second_rank_sync_s(cols: CandidateColumns, layers: StageLayers, weights: Weights, times: LayerTimes,
                       comm: CommModel, prec: Precision, base: RunSettings, eff: DeviceEfficiency,
                       timed: np.ndarray, share: np.ndarray, p2p_share: np.ndarray,
                       send: np.ndarray) -> np.ndarray:
    """The gradient reduction a middle pipeline rank (the second) leaves exposed past its
    last backward, vectorised (`overlap_terms.comm_s`): it holds a middle rank's layers
    (a mixture-of-experts model's mean layer, so its experts: DeepSeek-V3's first rank
    holds its dense layers, the others MoE ones) and Megatron-Core reduces each of its
    chunks in one bucket once the chunk's last backward has ended (`megatron_ddp`: no
    bucketing past the first rank), ZeRO-3 one bucket per layer, torch DDP
    `GRAD_BUCKET_PARAMS`; the buckets of the last chunk hide up to half its last backward
    as the first rank's (`gradient_sync_s`), interleaved chunks queue as there
    (`_chunks_exposed_s`), and what hides costs `share` of it. Its compute ends a
    backward of the first rank before the first rank's (`estimate.py` takes the later end)."""
    megatron = (cols.cand.zero < 3) & (base.DDP_impl == "local") & (not base.use_torch_fsdp2)
    sharded = cols.sharded
    bwd = times.op_s(layers.n_mid, eff, True)
    bwd = bwd + p2p_share * np.minimum(send, bwd)  # `overlap_terms.sender_contention_s`
    chunk_s = np.zeros(len(cols))
    last_s = np.zeros(len(cols))  # the chunk's last bucket
    per_layer = np.maximum(layers.n_mid, 1.0)
    for params, size, nodes, on in (
            (layers.n_mid * weights.layer, cols.dc, cols.dp_nodes,
             (cols.dc > 1) & ((cols.cand.zero < 2) | cols.zero3_once)),
            (layers.n_mid * weights.expert_layer, cols.edp, cols.edp_nodes,
             (cols.edp > 1) & (weights.expert_layer > 0))):
        on = on & (cols.p > 1) & timed
        bucket = np.where(megatron, np.maximum(params, 1.0), np.where(cols.zero3_once, params / per_layer,
                                                                          GRAD_BUCKET_PARAMS))
        count = np.maximum(np.ceil(params / np.maximum(bucket, 1.0) - 1e-9), 1.0)  # `equal_buckets`
        each_bytes = params / count * prec.grad_bytes
        one = (comm_s(comm, "reduce_scatter", each_bytes, size, nodes, on & sharded)
               + comm_s(comm, "all_reduce", each_bytes, size, nodes, on & ~sharded))
        chunk_s += count * one
        last_s += one
    first = np.maximum(last_s, chunk_s - 0.5 * bwd)
    gap = np.minimum(cols.p, cols.m) * bwd
    queued = first + np.where(chunk_s > gap, cols.v - 1, 1.0) * (chunk_s - gap)  # `_chunks_exposed_s`, vectorised
    shown = np.where(cols.v > 1, np.maximum(first, queued), first)
    return np.where(chunk_s > 0, shown + share * np.maximum(cols.v * chunk_s - shown, 0.0), 0.0)
