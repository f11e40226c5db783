"""The transformer planner's closed-form estimate of every candidate's iteration time
and peak memory, vectorised with numpy over the candidate arrays (`space.Candidates`),
one function per phase (as Megatron-LM's `theoretical_memory_usage.py`):

- the layer: its device and host time and activations per (t, b, sp, recompute, c,
  EP, ETP), priced once with the exact device model (`layer_table.py`); a ZeRO-3 layer
  without pipelines is no faster than its weight all-gather, a ZeRO-2 layer's backward
  than its gradients' reduce-scatter (every micro-batch), and each op of theirs waits for
  what no layer hides (`overlap_terms.sharded_unit_exposed_s`);
- stage op times: layers per stage x the layer's device and host time (smooth
  maximum, as the exact model), the embedding on the first stage, the head on the last;
- pipeline (`pipeline_estimate.py`): 1F1B and GPipe the sum of the stages' (F + B) + the
  longest path's other M - 1 steps (GPipe: the slowest forward's and the slowest
  backward's; 1F1B: the longest turn at one stage, a path of the engine's op order, so
  never above it; both exact for uniform stages), each op with the blocking transfers it
  sends (one chunk per stage: every forward but the last stage's, every backward but the
  first's, `pipeline_p2p.p2p_charges`); interleaved M x a rank's (F + B) over its v chunks + one
  chunk of each other rank (the first rank's first, the last rank's last), the latest of
  the first, the last and a middle rank (with an even split: (M v + p - 1) x one chunk's
  plus the first or last device's extra per micro-batch) + 2 (p v - 1) transfers (the
  first forward and the last backward cross every virtual stage); a v that does not
  divide the layers over the stages uses Megatron's uneven first/last stages; ZB-H1 as
  1F1B less (p - 1) W + min(M - 1, p - 1) min(W, F) of a middle stage (Qi et al. 2023:
  2 (p - 1) W, the fill and drain run the weight gradients; from M - 1 times the slowest
  stage's F + B); interleaved with blocking transfers plus M x what they add per
  micro-batch (`paraplan.predict.pipeline_p2p`); and what overlapped transfers take from
  the ops beside them (`overlap_terms`);
- the gradient reduction over the d x c ranks that hold the same weights, exposed past
  the last backward, in the engine's buckets (Megatron-Core's grow with DP; interleaved,
  each model chunk reduced once its last backward ends), the optimizer step (with the
  distributed optimizer's zeroing of the whole gradient buffer) and the sharded state's
  weight all-gather (`overlap_param_gather`'s: the first bucket exposed, the rest beside
  the first micro-batch's forwards at the occupancy share; interleaved, chunk by chunk,
  `overlap_terms`): the first rank's end, or the second rank's where later (its compute
  ends a backward earlier, its whole reduction after it: `grad_sync.second_rank_sync_s`);
- memory (`memory_estimate.py`) of the first and the last stage (and the second, where a
  middle stage may hold more, and for a model of dense and MoE layers the first stage of
  MoE layers alone): weights, gradients and optimizer state as sharded, activations x micro-batches
  in flight (1F1B and ZB-H1: min(p, M) on the first stage; GPipe: M; interleaved:
  Megatron's warm-up count); ZeRO-3 under pipelines also the stage's gathered weights and
  its unsharded gradients, allocated at each chunk's first backward, read with the
  activations moment by moment from the schedule's op order (`lazy_gradients`), as are
  splits that count the embedding / loss as a layer; context parallelism's attention
  buffers (`paraplan.predict.cp_memory`) join a backward's working set and make a
  forward's moment of their own (on the last stage the larger of them and the loss's).

A mixture-of-experts model's layer is priced per kind (dense, MoE), and each stage's
time, activations and state come from its own count of each kind, as the engine assigns
layers to stages (`stage_kinds`: DeepSeek-V3's first three dense layers sit on the first
stage; 1F1B and GPipe sum every stage's own F + B, the slowest middle one taking the
M - 1 steady steps). What reads a stage-independent layer (gradient buckets, ZeRO-3
gathers, the interleaved middle chunks' fill) takes the slowest middle stage's or the
model's mean layer (the share of MoE layers times the MoE layer, the rest dense). Expert weights are split over
EP x ETP and their state sharded over the expert-data-parallel group, which also
reduces their gradients. The estimate ranks; the planner re-times its best
candidates with the exact engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel, Group
from paraplan.core.run_settings import DTYPE_BYTES, RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.columns import CandidateColumns, StageLayers, StageParams
from paraplan.plan.transformer.experts import mixed_stage_params
from paraplan.plan.transformer.grad_sync import gradient_sync_s, second_rank_sync_s
from paraplan.plan.transformer.layer_table import LayerTable, activation_table, priced
from paraplan.plan.transformer.memory_estimate import dualpipe_peak_bytes, peak_memory_bytes
from paraplan.plan.transformer.overlap_terms import (
    p2p_share,
    param_gather_s,
    sender_contention_s,
    sharded_unit_exposed_s,
)
from paraplan.plan.transformer.pipeline_estimate import pipeline_s
from paraplan.plan.transformer.space import Candidates
from paraplan.plan.transformer.stage_kinds import StageKinds, stage_kinds
from paraplan.predict.build import OPTIMIZER_KERNELS, Precision, mtp_expert_params
from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed, host_bound_s
from paraplan.predict.fsdp_ops import paired_s
from paraplan.predict.overlap_share import occupancy_shares
from paraplan.predict.pipeline_p2p import blocking_per_microbatch_s
from paraplan.sim.builder.transformer_params import position_params, rank_head_params, rank_vocab_params


@dataclass(frozen=True, eq=False)
class Estimates:
    iteration_s: np.ndarray
    peak_memory_bytes: np.ndarray
    bubble_fraction: np.ndarray
    dualpipe_peak_memory_bytes: np.ndarray  # the candidate run as DualPipe (`_dualpipe_peak_bytes`)


def estimate(model: TransformerModel, cand: Candidates, base: RunSettings, cluster: Cluster, comm: CommModel,
             eff: DeviceEfficiency, fits_bytes: float | None = None) -> Estimates:
    """Closed-form iteration time and peak memory of every candidate (module doc).
    `fits_bytes`: time only the candidates whose estimated peak memory is at most this
    (the others' iteration time is inf, their bubble NaN); each candidate's numbers do
    not depend on which others are timed."""
    table = activation_table(model, cand, base)
    cols = CandidateColumns.of(model, cand, base, cluster, table.index)
    prec = Precision.of_settings(base)
    weights = _weights(model, cols)
    layers = StageLayers.of(cols)
    params = _stage_params(model, cols, layers, weights)
    kinds = stage_kinds(model, cand, base)
    peak = peak_memory_bytes(model, cols, layers, kinds, table, weights, params, prec)
    dualpipe_peak = dualpipe_peak_bytes(model, cols, layers, table, weights, params, prec)
    timed = np.ones(len(cols), bool) if fits_bytes is None else peak <= fits_bytes
    num_gpus = int(cand.t[0] * cand.cp[0] * cand.p[0] * cand.d[0]) if len(cand) else None
    table = priced(table, model, np.unique(cols.row[timed]), cluster, comm, eff, num_gpus)
    times = _layer_times(cols, table, weights, comm, prec, eff, timed, cluster.device.compute_units)
    send, gather = _send_s(model, cols, base, comm, timed, cluster.devices_per_node)
    overlapped = (cols.v > 1) & base.overlap_p2p_comm
    units, calibrated = cluster.device.compute_units, eff.comm_overlap_contention
    p2p = p2p_share(cols, overlapped, units, cluster.devices_per_node, calibrated)
    synchronize = eff.host_kernel_s if base.batch_p2p_sync else 0.0  # `pipeline_p2p.sync_s`
    # one chunk per stage: each blocking transfer (and its all-gather and host synchronisation) on the
    # op that sends it, as the engine charges it (`pipeline_p2p.p2p_charges`): every forward but the
    # last stage's, every backward but the first's
    blocked = (cols.p > 1) & (cols.v == 1)
    stages = _stage_times(model, cols, kinds, times, table, eff, send, p2p,
                          np.where(blocked, send + gather + synchronize, 0.0))
    pipe, busy = pipeline_s(cols, stages, send)
    pipe = pipe + np.where(blocked, 0.0, cols.m * blocking_per_microbatch_s(cols.v, overlapped, send, gather,
                                                                            synchronize))
    share = occupancy_shares(units, cols.dp_nodes, calibrated)  # the dp-cp (= sharding) group's
    megatron = (cols.cand.zero < 3) & (base.DDP_impl == "local") & (not base.use_torch_fsdp2)
    # the first rank's forwards of its first micro-batch (with the blocking transfer after it, one
    # chunk) and the received activations' all-gathers (chunks after the first)
    forward = stages.first_rank_forward + np.where(overlapped, (cols.v - 1) * gather, 0.0)
    optimizer = _optimizer_s(cols, params, cluster, base, eff)
    first_end = (pipe + gradient_sync_s(cols, params, times, layers, weights, stages, comm, prec, base, eff,
                                        timed, share)
                 + param_gather_s(cols, params, weights.vocab + weights.positions, comm, prec, megatron, share,
                                  forward, timed)
                 + optimizer + _tied_exchange_s(cols, weights, comm, prec, timed))
    # the second rank's compute ends one backward of the first rank's before it (ZB-H1: that backward
    # less its weight gradients, which the first rank runs last), its whole reduction after it
    last_backward = times.kinds_op_s(kinds.first, eff, True, times.emb_bwd)
    last_backward = last_backward - np.where(cols.schedule == "zb_h1", stages.weight_grad_first, 0.0)
    second_end = np.where(cols.single, 0.0, pipe - last_backward + optimizer + second_rank_sync_s(
        cols, layers, weights, times, comm, prec, base, eff, timed, share, p2p, send))
    iteration = np.maximum(first_end, second_end)
    bubble = np.clip(1.0 - busy / np.maximum(iteration, 1e-30), 0.0, 1.0)
    return Estimates(np.where(timed, iteration, np.inf), peak, np.where(timed, bubble, np.nan), dualpipe_peak)


@dataclass(frozen=True, eq=False)
class _Weights:
    """Parameters per rank: one (mean) layer's non-expert and expert weights, the
    embedding, learned positions, the head (final norm, output layer where not tied
    away, multi-token-prediction layers' non-expert weights)."""

    layer: np.ndarray
    expert_layer: np.ndarray
    vocab: np.ndarray
    positions: float
    head: np.ndarray
    tied_copy: np.ndarray  # the last stage holds a copy of the tied embedding (p > 1)


def _weights(model: TransformerModel, cols: CandidateColumns) -> _Weights:
    # a mixture-of-experts model: per mean layer, the non-expert weights over t and the
    # routed experts' over EP x ETP, their state sharded over the expert-data-parallel group
    t, L = cols.t, cols.num_layers
    layer_params = model.layer_params / t
    expert_layer = np.zeros(len(cols))
    if model.is_moe:
        experts = model.num_moe_layers * model.num_experts * model.expert_params
        layer_params = (model.transformer_params - experts) / L / t
        expert_layer = experts / L / (cols.ep * cols.etp)
    vocab_params = rank_vocab_params(model, cols.cand.t)
    positions = position_params(model)
    tied_copy = (~np.asarray(model.untie_embeddings_and_output_weights, bool)) & (cols.p > 1)
    # multi-token-prediction layers on the last stage (a MoE one's experts over EP x ETP: `_stage_params`)
    head_params = rank_head_params(model, t, cols.p, vocab_params, mtp_expert_params(model))
    return _Weights(layer_params, expert_layer, vocab_params, positions, head_params, tied_copy)


@dataclass(frozen=True, eq=False)
class _LayerTimes:
    """Device and host time of one layer's forward and backward on each candidate, and
    of the embedding and head passes ((device, host) columns)."""

    fwd_dev: np.ndarray
    fwd_host: np.ndarray
    bwd_dev: np.ndarray
    bwd_host: np.ndarray
    emb_fwd: np.ndarray
    emb_bwd: np.ndarray
    head_fwd: np.ndarray
    head_bwd: np.ndarray
    kind_fwd_dev: np.ndarray  # (n, 2): a dense layer's and a MoE layer's (`layer_table.KIND_COLUMNS`)
    kind_fwd_host: np.ndarray
    kind_bwd_dev: np.ndarray
    kind_bwd_host: np.ndarray
    exposed_fwd: np.ndarray  # per op holding a layer: what per-layer sharding leaves exposed (`ExposedUnits`)
    exposed_bwd: np.ndarray

    def kinds_op_s(self, kinds: np.ndarray, eff: DeviceEfficiency, backward: bool, extra=None) -> np.ndarray:
        """One micro-batch's forward (or backward) of `kinds` ((n, 2): dense and MoE layers) plus `extra`."""
        layer_dev, layer_host = ((self.kind_bwd_dev, self.kind_bwd_host) if backward
                                 else (self.kind_fwd_dev, self.kind_fwd_host))
        exposed = np.where(kinds.sum(axis=1) > 0, self.exposed_bwd if backward else self.exposed_fwd, 0.0)
        dev, host = (kinds * layer_dev).sum(axis=1) + exposed, (kinds * layer_host).sum(axis=1) + eff.host_microbatch_s
        if extra is not None:
            dev, host = dev + extra[:, 0], host + extra[:, 1]
        return host_bound_s(dev, host, eff)

    def op_s(self, n_layers, eff: DeviceEfficiency, backward: bool, extra=None) -> np.ndarray:
        """One micro-batch's forward (or backward) of `n_layers` layers plus `extra`."""
        layer_dev, layer_host = (self.bwd_dev, self.bwd_host) if backward else (self.fwd_dev, self.fwd_host)
        exposed = np.where(np.asarray(n_layers) > 0, self.exposed_bwd if backward else self.exposed_fwd, 0.0)
        dev, host = n_layers * layer_dev + exposed, n_layers * layer_host + eff.host_microbatch_s
        if extra is not None:
            dev, host = dev + extra[:, 0], host + extra[:, 1]
        return host_bound_s(dev, host, eff)



def _layer_times(cols: CandidateColumns, table: LayerTable, weights: _Weights, comm: CommModel,
                 prec: Precision, eff: DeviceEfficiency, timed: np.ndarray, units: int) -> _LayerTimes:
    """The table's layer times; with ZeRO-3 without pipelines (`paraplan.predict.fsdp_ops`)
    each layer runs beside the next one's weight gather (forward and backward: resharded
    after the forward), with ZeRO-2 (gradients reduce-scattered after every micro-batch)
    each backward beside the next layer's reduce-scatter: max + share x min, the occupancy
    share of a device of `units` SMs (`paraplan.predict.overlap_share`); what no layer hides
    (each op's first gather, last reduce-scatter and root unit's: `sharded_unit_exposed_s`)
    joins each op. ZeRO-3 without pipelines reduce-scatters after the last micro-batch
    (`gradient_sync_s`), as under pipelines."""
    row = cols.row
    zero3_gather = np.zeros(len(cols))
    zero3_scatter = np.zeros(len(cols))
    memo: dict[tuple[str, float, int, int], float] = {}  # many candidates share a layer and a group

    def time_s(collective: str, nbytes: float, size: int, nodes: int) -> float:
        key = (collective, nbytes, size, nodes)
        if key not in memo:
            memo[key] = float(comm.time_s(collective, nbytes, Group(size, nodes)))
        return memo[key]

    for i in np.flatnonzero((cols.cand.zero >= 2) & (cols.dc > 1) & ~cols.zero3_once & timed):
        size, nodes, layer = int(cols.dc[i]), int(cols.dp_nodes[i]), float(weights.layer[i])
        if cols.zero3[i]:
            zero3_gather[i] = time_s("all_gather", layer * prec.weight_bytes, size, nodes)
        else:  # ZeRO-2 reduces every micro-batch; ZeRO-3 after the last only (`gradient_sync_s`)
            zero3_scatter[i] = time_s("reduce_scatter", layer * prec.grad_bytes, size, nodes)
    kappa = occupancy_shares(units, cols.dp_nodes, eff.comm_overlap_contention)  # z14: `overlap_share`
    gather, both, share = zero3_gather[:, None], (zero3_gather + zero3_scatter)[:, None], kappa[:, None]
    exposed = sharded_unit_exposed_s(cols, weights.layer, weights.vocab + weights.positions, weights.head, comm,
                                     prec, timed)

    def with_root(pair: np.ndarray, root_s: np.ndarray) -> np.ndarray:  # (device, host): the root unit's device
        return pair + np.stack([root_s, np.zeros_like(root_s)], axis=1)

    return _LayerTimes(paired_s(zero3_gather, table.fwd_dev[row], kappa), table.fwd_host[row],
                       paired_s(zero3_gather + zero3_scatter, table.bwd_dev[row], kappa), table.bwd_host[row],
                       with_root(table.emb_fwd[row], exposed.first_fwd),
                       with_root(table.emb_bwd[row], exposed.first_bwd),
                       with_root(table.head_fwd[row], exposed.last_fwd),
                       with_root(table.head_bwd[row], exposed.last_bwd),
                       paired_s(gather, table.kind_fwd_dev[row], share), table.kind_fwd_host[row],
                       paired_s(both, table.kind_bwd_dev[row], share), table.kind_bwd_host[row],
                       exposed.layer_fwd, exposed.layer_bwd)


@dataclass(frozen=True, eq=False)
class _StageTimes:
    """Forward + backward of one micro-batch on a stage (s): the slowest middle (virtual)
    stage and the sum over the middle ones (each from its own dense and MoE layers,
    `stage_kinds`), the first and last stage (their first and last chunk when
    interleaved), the whole model on one stage; the first chunk's and the slowest middle
    stage's weight-gradient part and the latter's forward; a mean other chunk of the
    first and last rank; with what overlapped transfers take from each op
    (`overlap_terms.sender_contention_s`). The first rank's forward of one micro-batch
    over its chunks (`param_gather_s` sets the weight all-gathers beside it). Each stage's
    forward and backward apart, for 1F1B's and GPipe's paths (one chunk per stage)."""

    mid: np.ndarray
    middle_sum: np.ndarray
    first: np.ndarray
    last: np.ndarray
    whole: np.ndarray
    weight_grad_first: np.ndarray
    weight_grad_mid: np.ndarray
    forward_mid: np.ndarray
    chunk_first: np.ndarray
    chunk_last: np.ndarray
    first_rank_forward: np.ndarray
    # one chunk per stage (1F1B's and GPipe's paths, `pipeline_estimate`): the first and last stage's
    # forward and backward, and each middle entry's ((n, J) as `StageKinds.middle`) with how many
    # stages hold it and the lowest and highest of them
    first_fwd: np.ndarray
    first_bwd: np.ndarray
    last_fwd: np.ndarray
    last_bwd: np.ndarray
    middle_fwd: np.ndarray
    middle_bwd: np.ndarray
    middle_count: np.ndarray
    middle_low: np.ndarray
    middle_high: np.ndarray


def _stage_times(model: TransformerModel, cols: CandidateColumns, kinds: StageKinds, times: _LayerTimes,
                 table: LayerTable, eff: DeviceEfficiency, send: np.ndarray, p2p_share: np.ndarray,
                 blocking: np.ndarray) -> _StageTimes:
    """`p2p_share`: of each overlapped transfer beside an op (0 where they block): every
    forward sends its activation on but the last virtual stage's, every backward its
    gradient back but the first's (`pipeline_p2p.overlap_contention_s`). `blocking`: what
    a blocking transfer adds to the op that sends it, on the same ops (one chunk per
    stage; 0 elsewhere)."""

    def ops(layers: np.ndarray, fwd_extra=None, bwd_extra=None, sends=(True, True)) -> tuple[np.ndarray, np.ndarray]:
        return (times.kinds_op_s(layers, eff, False, fwd_extra) + sends[0] * blocking,
                times.kinds_op_s(layers, eff, True, bwd_extra) + sends[1] * blocking)

    def contended(op: np.ndarray) -> np.ndarray:
        return op + sender_contention_s(send, op, p2p_share)

    wgt = table.kind_wgt_dev[cols.row]
    # the middle virtual stages: each distinct (dense, MoE) count's F + B; their sum and the slowest
    mid_f, mid_b, mid_fb, mid_w = [], [], [], []
    for j in range(kinds.middle.shape[1]):
        f, b = ops(kinds.middle[:, j])
        mid_f.append(contended(f))
        mid_b.append(contended(b))
        mid_fb.append(contended(f) + contended(b))
        mid_w.append((kinds.middle[:, j] * wgt).sum(axis=1))
    fb, count = np.stack(mid_fb, axis=1), kinds.middle_count
    slowest = np.argmax(np.where(count > 0, fb, -np.inf), axis=1)[:, None]  # p <= 2: column 0, vstage 0's layers
    first_f, first_b = ops(kinds.first, times.emb_fwd, times.emb_bwd, (True, False))
    last_f, last_b = ops(kinds.last, times.head_fwd, times.head_bwd, (False, True))
    chunk_first_f, chunk_first_b = ops(kinds.chunk_first)
    chunk_last_f, chunk_last_b = ops(kinds.chunk_last)
    whole = np.tile([model.num_layers - model.num_moe_layers, model.num_moe_layers], (len(cols), 1)).astype(float)
    whole_f, whole_b = ops(whole, times.emb_fwd + times.head_fwd, times.emb_bwd + times.head_bwd, (False, False))
    first_f, chunk_first_f = contended(first_f), contended(chunk_first_f)
    last_b = contended(last_b)
    return _StageTimes(
        mid=np.take_along_axis(fb, slowest, axis=1)[:, 0],
        middle_sum=(np.where(count > 0, fb, 0.0) * count).sum(axis=1),
        first=first_f + first_b,
        last=last_f + last_b,
        whole=whole_f + whole_b,
        weight_grad_first=(kinds.first * wgt).sum(axis=1),
        weight_grad_mid=np.take_along_axis(np.stack(mid_w, axis=1), slowest, axis=1)[:, 0],
        forward_mid=np.take_along_axis(np.stack(mid_f, axis=1), slowest, axis=1)[:, 0],
        chunk_first=chunk_first_f + contended(chunk_first_b),
        chunk_last=contended(chunk_last_f) + contended(chunk_last_b),
        first_rank_forward=np.where(cols.single, whole_f, first_f + (cols.v - 1) * chunk_first_f),
        first_fwd=first_f, first_bwd=first_b, last_fwd=last_f, last_bwd=last_b,
        middle_fwd=np.stack(mid_f, axis=1), middle_bwd=np.stack(mid_b, axis=1), middle_count=count,
        middle_low=kinds.middle_low, middle_high=kinds.middle_high,
    )


def _send_s(model: TransformerModel, cols: CandidateColumns, base: RunSettings, comm: CommModel,
            timed: np.ndarray, devices_per_node: int) -> tuple[np.ndarray, np.ndarray]:
    """One activation (or its gradient) between neighbouring stages, and the receiver's
    all-gather of it where scattered without sequence parallelism (`pipeline_p2p`)."""
    e = 2 if base.dtype == "fp8" else DTYPE_BYTES[base.dtype]
    whole = cols.b * model.seq_length * model.hidden_size * e / cols.c
    sp = cols.cand.sp.astype(bool)
    boundary = whole / np.where(sp | base.scatter_gather_tensors_in_pipeline, cols.t, 1.0)
    gathered = ~sp & base.scatter_gather_tensors_in_pipeline & (cols.t > 1)
    send, gather = np.zeros(len(cols)), np.zeros(len(cols))
    for i in np.flatnonzero((cols.p > 1) & timed):
        send[i] = comm.time_s("send_recv", boundary[i], Group(2, 2 if cols.cross[i] else 1))
        if gathered[i]:
            t = int(cols.t[i])
            gather[i] = comm.time_s("all_gather", whole[i], Group(t, -(-t // devices_per_node)))
    return send, gather


def _stage_params(model: TransformerModel, cols: CandidateColumns, layers: StageLayers,
                  weights: _Weights) -> StageParams:
    """Parameters on the first and the last stage's ranks."""
    single, L = cols.single, cols.num_layers
    first_layers = np.where(single, L, layers.first_rank(cols))
    first_params = first_layers * weights.layer + weights.vocab + weights.positions
    first_params = first_params + np.where(single, weights.head, 0.0)
    last_params = np.where(single, first_params, layers.last_rank(cols) * weights.layer + weights.head)
    first_experts = first_layers * weights.expert_layer
    last_experts = np.where(single, first_experts, layers.last_rank(cols) * weights.expert_layer)
    params = StageParams(first_params, last_params, first_experts, last_experts)
    if model.is_moe and model.num_moe_layers < L:  # mixed kinds: the first and last stage's own MoE layers
        params = mixed_stage_params(model, cols, layers, weights.vocab + weights.positions, weights.head, params)
    if mtp_expert_params(model):  # a MoE multi-token-prediction layer's experts, on the last stage
        extra = mtp_expert_params(model) / (cols.ep * cols.etp)
        params = StageParams(params.first, params.last, params.first_experts + np.where(single, extra, 0.0),
                             params.last_experts + extra)
    return params


def _optimizer_s(cols: CandidateColumns, params: StageParams, cluster: Cluster, base: RunSettings,
                 eff: DeviceEfficiency) -> np.ndarray:
    """The optimizer step of the first stage's (sharded) state: memory-bound; with
    Megatron-Core's distributed optimizer also the zeroing of the rest of the rank's
    gradient buffer (`megatron_ddp.unsharded_zeroing_bytes`: one more kernel)."""
    prec = Precision.of_settings(base)
    speed = DeviceSpeed.of(cluster.device, base.dtype)
    bandwidth_Bps = speed.mem_bandwidth_Bps * eff.memory_efficiency
    stepped = params.first / cols.shards + params.first_experts / cols.expert_shards
    zeroing = ((cols.cand.zero == 1) & (base.DDP_impl == "local") & (not base.use_torch_fsdp2)
               & (params.first + params.first_experts > stepped))  # `megatron_ddp.zeroes_whole_grad_buffer`
    zeroing_s = np.where(zeroing, (params.first + params.first_experts - stepped) * prec.grad_bytes / bandwidth_Bps
                         + eff.kernel_latency_s, 0.0)
    return stepped * prec.optimizer_step_bytes / bandwidth_Bps + OPTIMIZER_KERNELS * eff.kernel_latency_s + zeroing_s


def _tied_exchange_s(cols: CandidateColumns, weights: _Weights, comm: CommModel, prec: Precision,
                     timed: np.ndarray) -> np.ndarray:
    """The all-reduce of a tied embedding's gradients between the first and last stage."""
    exchange = np.zeros(len(cols))
    for i in np.flatnonzero(weights.tied_copy & timed):
        exchange[i] = comm.time_s("all_reduce", weights.vocab[i] * prec.grad_bytes,
                                  Group(2, 2 if cols.cross[i] else 1))
    return exchange
