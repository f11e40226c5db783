"""The transformer planner's estimate (`estimate.py`) of a candidate's peak memory per
device: the first, the last and the second stage's (and, for a model with dense and MoE
layers, the first stage that holds MoE layers only: its state and activations from its
own layers, `stage_kinds`), as the module doc of `estimate.py` states; and the peak of
the candidate run as DualPipe."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer import lazy_gradients
from paraplan.plan.transformer.columns import CandidateColumns, StageLayers, StageParams
from paraplan.plan.transformer.layer_table import LayerTable
from paraplan.plan.transformer.space import RECOMPUTE
from paraplan.plan.transformer.stage_kinds import StageKinds
from paraplan.plan.transformer.unique_rows import unique_rows
from paraplan.predict.build import Precision
from paraplan.sim.engine import inflight_peak
from paraplan.sim.schedules import get_schedule

if TYPE_CHECKING:  # the estimate's parameters per rank (estimate.py imports this module)
    from paraplan.plan.transformer.estimate import _Weights as Weights


@functools.lru_cache(maxsize=4096)
def _held(schedule: str, p: int, m: int, v: int, k: int) -> tuple[int, int, int, int]:
    """(micro-batch, chunk) pairs the first, the last, the second and the k-th stage hold
    at their peak, from the schedule's own op orders; the count stops growing after a few
    p micro-batches, so long runs are counted on a shorter one."""
    if p == 1:
        return (1, 1, 1, 1)
    if schedule == "gpipe":
        return (m, m, m, m)
    if schedule == "1f1b":
        return (min(p, m), 1, min(p - 1, m), min(p - k, m))
    step = p if v > 1 else 1
    short = min(m, max(4 * p, step))
    short -= short % step
    sched = get_schedule(schedule)
    ends = [sched.stage_order(p, max(short, step), v, stage) for stage in (0, p - 1, 1, k)]  # not all p stages
    peaks = inflight_peak(ends, sched.split_backward)
    return (int(peaks[0]), int(peaks[1]), int(peaks[2]), int(peaks[3]))


def inflight(schedules: np.ndarray, p: np.ndarray, m: np.ndarray, v: np.ndarray, k: np.ndarray) -> np.ndarray:
    """(candidates, 4): `_held` of the first, the last, the second and the k-th stage."""
    names, codes = np.unique(schedules, return_inverse=True)
    keys = np.stack([codes.ravel(), p, m, v, k], axis=1).astype(np.int64)
    unique, inverse = unique_rows(keys)
    held = np.array([_held(str(names[sc]), pp, mm, vv, kk) for sc, pp, mm, vv, kk in unique.tolist()],
                    dtype=float)
    return held.reshape(-1, 4)[inverse.ravel()]



def peak_memory_bytes(model: TransformerModel, cols: CandidateColumns, layers: StageLayers, kinds: StageKinds,
                      table: LayerTable, weights: Weights, params: StageParams, prec: Precision) -> np.ndarray:
    """The larger of the first and the last stage's peak (and the second's, and for a
    model of dense and MoE layers also the first stage of MoE layers alone: `stage_kinds`):
    model state as sharded, activations x the micro-batches (and chunks) their schedule
    holds in flight, each stage's from its own dense and MoE layers, and a working set
    (full recomputation: one layer's activations; ZeRO-3: the root unit, two gathered
    layers and the unsharded gradients; on the last stage at least the loss's transient
    beside the gathered weights)."""
    cand, row, v, dc, edp = cols.cand, cols.row, cols.v, cols.dc, cols.edp
    kept_w, kept_g, kept_o = prec.state_bytes
    weights_b = np.where(cols.zero3, kept_w / dc, kept_w)
    grads_b = np.where(cand.zero >= 2, kept_g / dc, kept_g)
    state_b = weights_b + grads_b + kept_o / cols.shards
    state_e = (np.where(cols.zero3, kept_w / edp, kept_w)
               + np.where(cand.zero >= 2, kept_g / edp, kept_g)
               + kept_o / cols.expert_shards)
    # first, last, second, and the first stage of MoE layers alone
    held = inflight(cols.schedule, cand.p, np.round(cols.m).astype(np.int64), cand.v, kinds.moe_rank)
    act_kind, per_chunk = table.act_kind[row], v[:, None]

    def activations(layer_kinds: np.ndarray) -> np.ndarray:  # a chunk's of (dense, MoE) layers, per micro-batch
        return (layer_kinds * act_kind).sum(axis=1)

    act_chunk = activations((kinds.first + (per_chunk - 1) * kinds.chunk_first) / per_chunk)  # the rank's mean chunk
    act_first = held[:, 0] * act_chunk + np.ceil(held[:, 0] / v) * table.act_emb[row]  # the embedding: chunk 0 only
    act_first = act_first + np.where(cols.single, table.act_head[row], 0.0)
    head_held = np.where(cols.schedule == "gpipe", cols.m, np.where(cols.schedule == "zb_h1", held[:, 1], 1.0))
    act_last = held[:, 1] * activations((kinds.last + (per_chunk - 1) * kinds.chunk_last) / per_chunk)
    once = cols.zero3_once
    lazy = once & (cols.m > 1)
    sharded_experts = cols.edp > 1  # experts held whole where their group has one rank
    # with the embedding / loss counted as layers, or fewer layers set on the first / last stage, the
    # middle stages hold the most layers, and with gradients allocated lazily a middle stage may hold
    # more of them beside its activations: the second's
    second = ((cand.acc > 0) | (cand.first > 0) | (cand.last > 0) | lazy) & (cand.p >= 3)
    params_second = layers.n_mid * v * (weights.layer + weights.expert_layer * sharded_experts)  # ZeRO-3's gathers
    act_second = held[:, 2] * layers.n_mid * table.act_layer[row]
    state_second = layers.n_mid * v * (weights.layer * state_b + weights.expert_layer * state_e)
    # dense layers first (DeepSeek-V3's first three): a middle stage holds the most state and activations
    # per micro-batch where it holds MoE layers alone, the second beside the micro-batches it keeps more
    mixed = model.is_moe and model.num_moe_layers < model.num_layers
    state_moe, act_moe = np.zeros(len(cols)), np.zeros(len(cols))
    if mixed:
        state_of, params_of = _rank_state(model, cols, state_b, state_e, sharded_experts)
        second = second | (cand.p >= 3)
        params_second, state_second = params_of(kinds.second), state_of(kinds.second)
        act_second = held[:, 2] * activations(kinds.second)
        state_moe, act_moe = state_of(kinds.moe_rank_layers), held[:, 3] * activations(kinds.moe_rank_layers)
    # read from the schedule's moments: gradients accumulating unsharded join the activations at each
    # chunk's first backward; the embedding / loss counted as layers leave the end chunks a layer short
    moments = (lazy | (cand.acc > 0)) & ~cols.single
    if moments.any():
        act_first, act_last, act_second = lazy_gradients.moment_peaks(
            cols, layers, table, params, params_second, prec, lazy, moments, (act_first, act_last, act_second))
    recompute = np.where(cand.recompute == RECOMPUTE.index("full"), table.act_full_layer[row], 0.0)
    # ZeRO-3 runs one stage: its root unit (`fsdp_working_bytes`), and its unsharded gradients;
    # under pipelines each stage's whole weights, gathered once per iteration (`space.ZERO3_PIPELINED`)
    root = weights.vocab + weights.positions + weights.head
    unsharded = np.where(cols.m > 1, params.first + params.first_experts, np.maximum(weights.layer, root))
    per_layer = cols.zero3 & ~once
    gathered = np.where(per_layer, (root + 2 * weights.layer) * prec.weight_bytes, 0.0)
    gathered_first = np.where(once, (params.first + params.first_experts * sharded_experts) * prec.weight_bytes,
                              gathered)
    gathered_last = np.where(once, (params.last + params.last_experts * sharded_experts) * prec.weight_bytes,
                             gathered)
    grads_held = np.where(per_layer, unsharded * prec.grad_bytes, 0.0)
    # under pipelines with one micro-batch: each unit's gradients until its reduce-scatter, the
    # stage's own root unit (the embedding or the head) or a layer (`unsharded_grad_params`)
    single_mb = np.where(once & ~lazy, prec.grad_bytes, 0.0)
    # a backward's moment: with context parallelism also a layer's attention backward (`cp_memory`)
    cp_fwd, cp_bwd = table.cp_forward[row], table.cp_backward[row]
    working_first = (recompute + gathered_first + grads_held + cp_bwd
                     + single_mb * np.maximum(weights.layer, weights.vocab + weights.positions))
    working_last = (recompute + gathered_last + grads_held + cp_bwd
                    + single_mb * np.maximum(weights.layer, weights.head))
    # a forward's moment (`rank_state._Moments.per_op`): the gathered weights and a layer's attention forward,
    # on the last stage the larger of it and the loss's transient, beside the gradients accumulating from the
    # previous micro-batches
    accumulated = np.where(per_layer & (cols.m > 1), unsharded * prec.grad_bytes, 0.0)
    loss_first = np.maximum(table.loss_transient[row], cp_fwd) + gathered_first + accumulated
    loss_last = np.maximum(table.loss_transient[row], cp_fwd) + gathered_last + accumulated
    forward_first = cp_fwd + gathered_first
    # ZeRO-2, reduced after every micro-batch: the unit being reduce-scattered (the stage's root unit
    # or a layer) and the layer produced beside it (`unsharded_grad_params`)
    zero2 = np.where((cand.zero == 2) & (cols.dc > 1), prec.grad_bytes, 0.0)
    beside = np.where(cols.m > 1, weights.layer, 0.0)
    root_first = weights.vocab + weights.positions + np.where(cols.single, weights.head, 0.0)
    zero2_first = zero2 * (np.maximum(weights.layer, root_first) + beside)
    zero2_last = zero2 * (np.maximum(weights.layer, weights.head) + beside)
    mem_first = (params.first * state_b + params.first_experts * state_e + act_first
                 + np.maximum(working_first + zero2_first, np.where(cols.single, loss_first, forward_first)))
    # the head's activations: the last chunk only (read with the moments: in `act_last` already)
    head_act = np.where(moments, 0.0, head_held * table.act_head[row])
    mem_last = (params.last * state_b + params.last_experts * state_e + act_last + head_act
                + np.maximum(working_last + zero2_last, loss_last))
    working_middle = (np.where(once, params_second * prec.weight_bytes, gathered)
                      + np.maximum(recompute + grads_held + zero2_last + cp_bwd, cp_fwd))
    mem_second = state_second + act_second + working_middle
    mem_moe = np.where(mixed & (cand.p >= 3), state_moe + act_moe + working_middle, 0.0)
    return np.where(cols.single, mem_first, np.maximum(np.maximum(mem_first, mem_last),
                                                       np.maximum(np.where(second, mem_second, 0.0), mem_moe)))


def _rank_state(model: TransformerModel, cols: CandidateColumns, state_b: np.ndarray, state_e: np.ndarray,
                sharded_experts: np.ndarray):
    """For a model of dense and MoE layers: a rank's model state bytes, and its parameters
    as ZeRO-3 gathers them, from its mean chunk's (dense, MoE) layers ((n, 2)) x v chunks."""
    experts = model.num_experts * model.expert_params
    dense = model.dense_layer_params / cols.t
    moe_dense, moe_experts = (model.moe_layer_params - experts) / cols.t, experts / (cols.ep * cols.etp)

    def state_of(layer_kinds: np.ndarray) -> np.ndarray:
        return cols.v * (layer_kinds[:, 0] * dense * state_b + layer_kinds[:, 1] * (moe_dense * state_b
                                                                                   + moe_experts * state_e))

    def params_of(layer_kinds: np.ndarray) -> np.ndarray:
        return cols.v * (layer_kinds[:, 0] * dense + layer_kinds[:, 1] * (moe_dense + moe_experts * sharded_experts))

    return state_of, params_of


def dualpipe_peak_bytes(model: TransformerModel, cols: CandidateColumns, layers: StageLayers, table: LayerTable,
                        weights: Weights, params: StageParams, prec: Precision) -> np.ndarray:
    """The peak of a v = 1, p > 1, ZeRO-0/1 candidate run as DualPipe (`variants.py`;
    meaningless for the others): rank r holds stages r and p - 1 - r, both stages' model
    state (a sharded optimizer's over both copies' ranks: half of each) and p + 1
    micro-batches of a stage's activations (DeepSeek-V3's Table 2; 1F1B's first stage
    holds p). The larger of the end ranks' (the first and the last stage, with the
    embedding and the head) and a middle rank's (two stages of the model's heaviest
    layers: MoE ones where the model has both kinds)."""
    row = cols.row
    kept_w, kept_g, kept_o = prec.state_bytes
    optimizer = np.where(cols.sharded, 0.5, 1.0) * kept_o
    state_b = kept_w + kept_g + optimizer / cols.shards
    state_e = kept_w + kept_g + optimizer / cols.expert_shards
    held = np.minimum(cols.p, cols.m) + 1.0
    working = np.where(cols.cand.recompute == RECOMPUTE.index("full"), table.act_full_layer[row], 0.0)
    cp_fwd, cp_bwd = table.cp_forward[row], table.cp_backward[row]  # a layer's attention under CP (`cp_memory`)
    ends = ((params.first + params.last) * state_b + (params.first_experts + params.last_experts) * state_e
            + held * layers.n_big * table.act_layer[row] + table.act_emb[row] + table.act_head[row]
            + np.maximum(working + cp_bwd, np.maximum(table.loss_transient[row], cp_fwd)))
    layer, expert_layer = weights.layer, weights.expert_layer
    if model.is_moe and model.num_moe_layers < model.num_layers:  # the middle stages' MoE layers
        experts = model.num_experts * model.expert_params
        layer = (model.moe_layer_params - experts) / cols.t
        expert_layer = experts / (cols.ep * cols.etp)
    middle = (2 * layers.n_big * (layer * state_b + expert_layer * state_e)
              + held * layers.n_big * table.act_layer[row] + np.maximum(working + cp_bwd, cp_fwd))
    return np.maximum(ends, middle)
