"""The mixture-of-experts parts of the transformer planner (`space.py`, `estimate.py`):
which (EP, ETP) layouts a candidate may use, the layer-table probes' data-parallel
size, and the first and last stage's parameters of a model with dense and MoE layers."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel, Group
from paraplan.core.errors import StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import (
    RunStructure,
    context_parallel_groups,
    expert_parallel_groups,
    mtp_expert_params,
    placement,
    run_structure,
)
from paraplan.predict.layer_factors import layer_shape_key
from paraplan.predict.moe_deepep import DEEPEP_DISPATCH, DeepEpTransfer, NvlinkNode
from paraplan.predict.moe_ops import moe_layer_work
from paraplan.predict.mtp_ops import last_stage_work
from paraplan.predict.pass_cost import PassCost
from paraplan.predict.pass_times import Pass
from paraplan.predict.predictor import divisors

if TYPE_CHECKING:
    from paraplan.plan.transformer.columns import CandidateColumns, StageLayers, StageParams
    from paraplan.plan.transformer.space import SearchSpace


def expert_layouts(model: TransformerModel, t: int, dc: int, sp: bool, space: SearchSpace,
                   priced: Callable[[int, int], bool] | None = None) -> list[tuple[int, int]]:
    """(EP, ETP) pairs a candidate of TP t and data x context parallel dc may use
    (`run_settings_checks.check_experts`' rules, and `priced`: those the run's token
    dispatcher can be priced for); [(1, 0)] for a dense model."""
    if not model.is_moe:
        return [(1, 0)]
    eps = space.expert_model_sizes or tuple(divisors(model.num_experts))
    etps = space.expert_tensor_sizes or tuple(sorted({1, t}))
    out = []
    for ep in eps:
        for etp in etps:
            if (model.num_experts % ep or (t * dc) % (ep * etp) or model.moe_ffn_size % etp
                    or (t > 1 and not sp and (ep > 1 or etp != t))):
                continue
            if priced is not None and not priced(ep, etp):
                continue
            out.append((ep, etp))
    return out


def flex_layouts(model: TransformerModel, base: RunSettings, cluster: Cluster) -> Callable[[int, int], bool] | None:
    """With the flex dispatcher, which (EP, ETP) its kernels can be priced for
    (`paraplan.predict.moe_deepep`: ETP 1, and EP groups of the sizes, spans and SM counts
    DeepEP's or HybridEP's kernels were measured at); None for any other dispatcher.
    Megatron-Core lays an expert-parallel group of ETP 1 on consecutive ranks whatever the
    TP, so whether it can be priced depends on EP alone."""
    if base.moe_token_dispatcher_type != "flex" or not model.is_moe:
        return None
    node = NvlinkNode.of(cluster)
    known: dict[int, bool] = {}

    def priced(ep: int, etp: int) -> bool:
        if etp != 1:
            return False
        if ep not in known:
            s = replace(base, tensor_model_parallel_size=1, pipeline_model_parallel_size=1, data_parallel_size=ep,
                        global_batch_size=ep, micro_batch_size=1, expert_model_parallel_size=ep,
                        expert_tensor_parallel_size=1)
            group = expert_parallel_groups(s, placement(s, cluster.devices_per_node))["ep"]
            transfer = DeepEpTransfer(DEEPEP_DISPATCH, 1.0, -1, "ep", experts=model.num_experts,
                                      topk=model.moe_router_topk, backend=base.moe_flex_dispatcher_backend,
                                      num_sms=base.moe_flex_dispatcher_num_sms)
            try:
                transfer.time_s(group, node)
                known[ep] = True
            except StrategyError:
                known[ep] = False
        return known[ep]

    return priced


def probe_structures(model: TransformerModel, probes: list[RunSettings], cluster: Cluster,
                     comm: CommModel) -> list[RunStructure]:
    """The layer table's probe structures, for their passes alone. Probes that differ
    only in EP / ETP share their dense-layer, embedding and head passes (none depends on
    them, but a MoE multi-token-prediction layer in the head pass): the first builds a
    whole structure, the others only their MoE passes, a few times faster for a model
    with many expert layouts (DeepSeek-V3: 9 EP x 2 ETP)."""
    out: list[RunStructure] = []
    whole: dict[tuple[object, ...], RunStructure] = {}
    for s in probes:
        key = (s.tensor_model_parallel_size, s.micro_batch_size, s.sequence_parallel, s.recompute_granularity,
               s.context_parallel_size)
        first = whole.get(key)
        if first is None or not model.num_moe_layers or len(first.passes) <= 7:
            out.append(run_structure(model, s, cluster, comm))
            whole.setdefault(key, out[-1])
            continue
        s.check(model)
        place = placement(s, cluster.devices_per_node)
        groups = {**context_parallel_groups(s, place), **expert_parallel_groups(s, place)}
        tp = Group(s.tensor_model_parallel_size, place.tp_nodes)
        moe = moe_layer_work(model, s)
        node = NvlinkNode.of(cluster)  # DeepEP's intranode kernels
        passes = first.passes[:Pass.MOE_LAYER_FWD] + tuple(PassCost.of(w, comm, tp, groups, node)
                                                           for w in (moe.forward, moe.recompute, moe.backward))
        if mtp_expert_params(model):  # the head pass runs a MoE multi-token-prediction layer
            head = last_stage_work(model, s, moe)
            passes = (*passes[:Pass.HEAD_FWD], PassCost.of(head.forward, comm, tp, groups, node),
                      PassCost.of(head.backward, comm, tp, groups, node), *passes[Pass.MOE_LAYER_FWD:])
        out.append(replace(first, settings=s, passes=passes,
                           layer_key=layer_shape_key(model, s, cluster.device.compute_name, place.tp_nodes)))
    return out


def probe_data_parallel(tc: int, ep_etp: int) -> int:
    """The least data-parallel size that lets EP x ETP divide t x c x d (1 for a dense model)."""
    return ep_etp // math.gcd(tc, ep_etp) if ep_etp else 1


def mixed_stage_params(model: TransformerModel, cols: CandidateColumns, layers: StageLayers,
                       embedding: np.ndarray, head: np.ndarray, mean: StageParams) -> StageParams:
    """A model with dense and MoE layers (DeepSeek-V3's first three dense): the first
    and the last stage's non-expert and expert parameters on one rank from their own
    layers (v = 1: consecutive layers; interleaved: the model's share of MoE layers);
    `mean` (each stage's layers at the mean layer) stays for a single stage.
    `embedding` and `head`: the first and last stage's parameters besides layers."""
    L, moe_total = model.num_layers, model.num_moe_layers
    t, v, single = cols.t, cols.v, cols.single
    prefix = np.concatenate([[0], np.cumsum(np.array(model.moe_layers, dtype=np.int64))])
    share = moe_total / L
    n_first = layers.first_rank(cols)
    n_end = layers.n_last * np.where(v > 1, v, 1)
    moe_first = np.where(v > 1, n_first * share, prefix[np.clip(n_first, 0, L).astype(np.int64)])
    moe_last = np.where(v > 1, n_end * share, moe_total - prefix[np.clip(L - n_end, 0, L).astype(np.int64)])
    experts = model.num_experts * model.expert_params
    non_expert = model.moe_layer_params - experts
    ep_etp = cols.ep * cols.etp

    def dense_part(n: np.ndarray, moe: np.ndarray) -> np.ndarray:
        return ((n - moe) * model.dense_layer_params + moe * non_expert) / t

    return replace(mean, first=np.where(single, mean.first, dense_part(n_first, moe_first) + embedding),
                   last=np.where(single, mean.last, dense_part(n_end, moe_last) + head),
                   first_experts=np.where(single, mean.first_experts, moe_first * experts / ep_etp),
                   last_experts=np.where(single, mean.last_experts, moe_last * experts / ep_etp))
