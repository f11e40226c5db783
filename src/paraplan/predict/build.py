"""The execution model of a transformer training run: model + cluster + settings +
device calibration -> `paraplan.sim.execution.ExecutionModel`.

`run_structure` builds the part that does not depend on the device calibration in named
phases (`RunWork` and the passes' costs, ZeRO-3's per-layer collectives, the layer split,
the pipeline transfers, then each rank's parameters, gradient buckets, after-sync
communication and memory: `paraplan.predict.rank_state`), over the groups of
`paraplan.predict.placement` (Megatron-Core's rank order tp-cp-dp-pp); `price` turns it
into an `ExecutionModel` with the device calibration, phase by phase too (first each
pass's time: `paraplan.predict.pass_times`).

What each piece costs:
- a layer's forward, recomputation and backward on one rank: its kernels
  (`paraplan.predict.ops`) priced by the device model, plus its tensor-parallel
  collectives (blocking ones in full; an overlapped one where it outlasts the kernel it
  runs beside, plus the contention share of the overlapped time, `PassCost.comm_s`);
  each pass is bounded below by the host's issue time;
- layers whose attention core differs from layer 0's (sliding windows): each virtual
  stage adds what its cores cost beyond layer 0's (`paraplan.predict.attention_mix`);
- embedding on the first virtual stage, final norm + LM head + loss on the last (with
  the multi-token-prediction layers, `edge_ops.head_work`);
- pipeline transfers: one micro-batch's activation b s h / t per rank (Megatron
  scatters it over the tensor-parallel ranks), point to point, across nodes where the
  neighbours sit on two; blocking (on the ops that wait for them) unless overlapped
  (then the op beside each pays the contention share, `pipeline_p2p.overlap_contention_s`),
  `paraplan.predict.pipeline_p2p`;
- context-parallel attention (`paraplan.predict.cp_ops`): ring transfers between CP
  neighbours beside the attention steps, or Ulysses all-to-alls over the CP group;
- data-parallel gradient reduction over the d x c ranks that hold the same weights
  (Megatron's dp-cp group) in buckets of `GRAD_BUCKET_PARAMS` parameters
  (all-reduce; reduce-scatter with a sharded optimizer), ready layer by layer during
  the last backward, overlapped with it under `overlap_grad_reduce` (the compute beside
  a bucket slowed by the contention share of their overlap, `sim.overlap_cost`); with
  `DDP_impl` torch, buckets of `TORCH_DDP_BUCKET_BYTES` of gradients in the weights'
  dtype, always overlapped; ZeRO-3 (FSDP2) gathers each layer's weights before its forward
  and its backward, prefetched beside the previous layer's compute, and reduce-scatters
  its gradients layer by layer (`paraplan.predict.fsdp_ops`); with hybrid sharding the
  state is sharded inside a group and each bucket all-reduced over its replicas;
- after the reduction: the tied-embedding gradient exchange between the first and
  last pipeline stage, the optimizer step (memory-bound, `optimizer_step_bytes`)
  and, with a sharded optimizer, the weight all-gather unless `overlap_param_gather`
  (then beside the forward, with the contention share, `paraplan.predict.param_gather`);
- memory: Megatron-LM's bytes per parameter for weights, gradients and optimizer
  state (sharded as the settings say) and the activations of `ops.layer_activation_bytes`.

Mixture-of-experts models have two layer kinds, dense and MoE (`moe_ops`): each kind's
passes are priced once and a virtual stage's op is the sum over its layers of their
kind's pass. The expert layers use Megatron-Core's expert grid inside each pipeline
stage's t x d ranks (expert-tensor rank fastest, then expert-parallel, then
expert-data-parallel): the all-to-alls run over the EP group's node span; the expert
weights, gradients and optimizer state are split over EP x ETP and replicated over
the expert-data-parallel group (t d / (EP ETP) ranks), which reduces their gradients
(its own buckets, after the dense ones of the same model chunk) and shards them under
a distributed optimizer or ZeRO.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property, partial

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.core.transformer_blocks import attention_head_widths
from paraplan.kernels.attention_backends import with_attention_kernel
from paraplan.predict import torchao_fp8
from paraplan.predict.attention_mix import AttentionMix, attention_mix
from paraplan.predict.cp_memory import layer_cp_transient
from paraplan.predict.device_model import (
    DeviceEfficiency,
    DeviceSpeed,
    host_bound_s,
    memory_time_s,
)
from paraplan.predict.dualpipe_build import dualpipe_model, paired_moe_passes
from paraplan.predict.edge_ops import embedding_work
from paraplan.predict.fp8_ops import device_speed, scaled_passes, stage_weight_copy_bytes
from paraplan.predict.fsdp2_passes import optimizer_kernels, optimizer_step_bytes
from paraplan.predict.fsdp_ops import FsdpCosts, fsdp_costs, layer_device_s, shard_groups
from paraplan.predict.kernel_batch import KernelBatch, PassSums
from paraplan.predict.layer_factors import layer_shape_key
from paraplan.predict.loss_ops import loss_transient_bytes
from paraplan.predict.megatron_ddp import unsharded_zeroing_bytes
from paraplan.predict.moe_deepep import NvlinkNode
from paraplan.predict.moe_ops import moe_layer_work
from paraplan.predict.moe_router import expert_bias_sync_s
from paraplan.predict.mtp_ops import last_stage_work
from paraplan.predict.ops import layer_work
from paraplan.predict.overlap_share import CALIBRATED_SHARES, OverlapShares, share_or_calibrated
from paraplan.predict.param_gather import chunk_gather_s, hidden_param_gather_s, param_gather_added_s
from paraplan.predict.partial_recompute import PartialRecompute
from paraplan.predict.pass_cost import PassCost
from paraplan.predict.pass_times import MOE_PASSES, PASSES, Pass, PassTimes, pass_times
from paraplan.predict.pipeline_p2p import (
    boundary_crosses_nodes,
    overlap_contention_s,
    p2p_charges,
    pipeline_gather_s,
    pipeline_send_s,
    sync_s,
)
from paraplan.predict.placement import (
    Placement,
    Precision,
    RunGroups,
    context_parallel_groups,
    expert_parallel_groups,
    placement,
)
from paraplan.predict.rank_state import (
    GRAD_BUCKET_PARAMS,
    TORCH_DDP_BUCKET_BYTES,
    ActivationBytes,
    RankParams,
    ShardedState,
    after_sync_comm_s,
    gradient_syncs,
    mtp_expert_params,
    rank_memory,
    rank_parameters,
)
from paraplan.predict.torch_pipelining import torch_pipelining_memory
from paraplan.predict.variability import straggled
from paraplan.predict.work import LayerWork, PassWork
from paraplan.sim.engine import PipelineCosts
from paraplan.sim.execution import ExecutionModel, GradSync, RankMemory
from paraplan.sim.param_gather_run import ChunkGathers

__all__ = [  # also what other modules and the tests import from here
    "GRAD_BUCKET_PARAMS", "OPTIMIZER_KERNELS",
    "TORCH_DDP_BUCKET_BYTES", "KernelBatch", "PassCost", "PassSums", "Placement", "Precision",
    "RunStructure", "RunWork",
    "build_execution", "context_parallel_groups", "expert_parallel_groups", "kernel_times_by_pass",
    "layers_per_virtual_stage", "moe_layers_per_virtual_stage", "mtp_expert_params", "placement",
    "price", "run_structure",
]

OPTIMIZER_KERNELS = 4  # multi-tensor Adam, norm, scale, zero: a few launches per bucket


def layers_per_virtual_stage(num_layers: int, settings: RunSettings) -> np.ndarray:
    """Layers of each virtual stage as the settings split them (`paraplan.core.pipeline_split`:
    even, uneven first/last, embedding/loss counted as layers, or a layout); the embedding
    stays on the first virtual stage, the output layer, loss and MTP layers on the last."""
    return np.array(settings.layers_per_virtual_stage(num_layers), dtype=np.int64)


@dataclass(frozen=True, eq=False)
class RunStructure:
    """Everything about a run that does not depend on the device calibration: the
    passes' kernels and collectives, the layer split, transfers, gradient buckets,
    parameters and activations. `price` turns it into an `ExecutionModel`. The gradient
    buckets and the ranks' memory are built when first read (`grad_sync`, `memory`): the
    planner prices many structures only for their pass times or a lower bound."""

    settings: RunSettings
    speed: DeviceSpeed
    passes: tuple[PassCost, ...]  # in PASSES order, then MOE_PASSES for a mixture-of-experts model
    layers_per_vstage: np.ndarray
    send_s: np.ndarray
    grad_sync_of: Callable[[], tuple[GradSync, ...]]  # builds `grad_sync`
    rank_params: np.ndarray
    precision: Precision
    after_sync_comm_s: np.ndarray
    memory_of: Callable[[], tuple[RankMemory, ...]]  # builds `memory`
    layer_key: str = ""  # `layer_factors.layer_shape_key` of its transformer layers
    embedding_exchange_s: float = 0.0  # the tied-embedding gradient all-reduce (part of after_sync_comm_s)
    attention_mix: AttentionMix | None = None  # layers whose attention core is unlike layer 0's (windows)
    moe_layers_per_vstage: np.ndarray | None = None  # of layers_per_vstage, the MoE layers (None: a dense model)
    expert_rank_params: np.ndarray | None = None  # per pipeline stage: expert weights on one rank
    fsdp: FsdpCosts | None = None  # zero_stage 3's weight gathers (`fsdp_ops`)
    p2p_gather_s: float = 0.0  # the all-gather of each received pipeline transfer (`pipeline_p2p`)
    paired_moe_passes: tuple[PassCost, PassCost] | None = None  # dualpipe: a pair's MoE passes (`dualpipe_build`)
    hidden_gather_s: np.ndarray | None = None  # per pipeline stage: overlap_param_gather's beside the forward
    overlap_shares: OverlapShares = CALIBRATED_SHARES  # z14: occupancy shares of the overlaps outside TP
    chunk_gather_s: np.ndarray | None = None  # q9: interleaved: [rank, chunk] gathers placed on the run
    partial_recompute: PartialRecompute | None = None  # recompute_method: layers kept or grouped (`partial_recompute`)

    @cached_property
    def grad_sync(self) -> tuple[GradSync, ...]:
        """Each pipeline stage's gradient reduction (`rank_state.gradient_syncs`)."""
        return self.grad_sync_of()

    @cached_property
    def memory(self) -> tuple[RankMemory, ...]:
        """Each pipeline stage's memory (`rank_state.rank_memory`)."""
        return self.memory_of()

    @property
    def moe_counts(self) -> np.ndarray:
        """MoE layers per virtual stage (zeros for a dense model)."""
        if self.moe_layers_per_vstage is None:
            return np.zeros(self.layers_per_vstage.shape[0])
        return self.moe_layers_per_vstage.astype(float)

    def optimizer_params(self) -> np.ndarray:
        """Per pipeline stage: parameters whose optimizer state one rank holds and steps."""
        dense = self.rank_params / self.settings.optimizer_shards
        if self.expert_rank_params is None:
            return dense
        return dense + self.expert_rank_params / self.settings.expert_optimizer_shards


def kernel_times_by_pass(structures: list[RunStructure], eff: DeviceEfficiency) -> list[list[np.ndarray]]:
    """Kernel device times of every pass of every structure, priced in one vectorised
    call per device speed (`KernelBatch`)."""
    return KernelBatch.of(structures).times(eff)


def moe_layers_per_virtual_stage(model: TransformerModel, counts: np.ndarray) -> np.ndarray:
    """Of each virtual stage's layers (consecutive, virtual stage by virtual stage, as
    Megatron assigns them), how many are mixture-of-experts layers."""
    ends = np.cumsum(counts)
    flags = np.array(model.moe_layers, dtype=np.int64)
    return np.array([flags[end - n:end].sum() for n, end in zip(counts, ends, strict=True)], dtype=np.int64)


@dataclass(frozen=True)
class RunWork:
    """The work of a run's passes before pricing: a transformer layer's, the embedding's,
    the last stage's (`mtp_ops.last_stage_work`) and a MoE layer's (None: a dense model)."""

    layer: LayerWork
    embedding: LayerWork
    head: LayerWork
    moe_layer: LayerWork | None

    @staticmethod
    def of(model: TransformerModel, settings: RunSettings) -> RunWork:
        moe = moe_layer_work(model, settings) if model.num_moe_layers else None
        return RunWork(layer_work(model, settings), embedding_work(model, settings),
                       last_stage_work(model, settings, moe), moe)  # z10-planfsdp: the MTP layer reuses `moe`

    def passes(self) -> list[PassWork]:
        """In `PASSES` order, then `MOE_PASSES` for a mixture-of-experts model."""
        works = [self.layer.forward, self.layer.recompute, self.layer.backward, self.embedding.forward,
                 self.embedding.backward, self.head.forward, self.head.backward]
        if self.moe_layer is not None:
            works += [self.moe_layer.forward, self.moe_layer.recompute, self.moe_layer.backward]
        return works


def activation_bytes(model: TransformerModel, settings: RunSettings, work: RunWork) -> ActivationBytes:
    """The passes' activations per micro-batch; under full recomputation (or torchtitan's
    per-op one) the layer being rebuilt holds its unrecomputed activations for a while
    (the larger kind's)."""
    recomputed = kept = 0.0
    kept_moe: float | None = None
    if settings.recompute_granularity == "full" or settings.selective_ac_option == "op":
        unrecomputed = replace(settings, recompute_granularity="none", selective_ac_option="", recompute_method="",
                               recompute_num_layers=0)
        recomputed = kept = layer_work(model, unrecomputed).activation_bytes
        if work.moe_layer is not None:
            kept_moe = moe_layer_work(model, unrecomputed).activation_bytes
            recomputed = max(recomputed, kept_moe)
    moe = work.moe_layer.activation_bytes if work.moe_layer is not None else None
    return ActivationBytes(work.layer.activation_bytes, moe, work.embedding.activation_bytes,
                           work.head.activation_bytes, recomputed, loss_transient_bytes(model, settings),
                           torch_pipelining_memory(model, settings),
                           layer_cp_transient(model, settings),  # z8-cpmem
                           kept_layer=kept, kept_moe_layer=kept_moe)


def run_structure(model: TransformerModel, settings: RunSettings, cluster: Cluster,
                  comm: CommModel) -> RunStructure:
    """The calibration-independent part of a run's execution model (see the module
    doc), phase by phase. `settings.check(model)` runs first; the cluster's node count
    does not limit the run (its nodes are the run's kind of node)."""
    settings.check(model)
    speed = device_speed(cluster.device, settings)  # fp8: the BF16 peak and the FP8 GEMM ceiling
    speed = with_attention_kernel(speed, cluster.device.compute_name, settings,  # attention_backend's kernel
                                  attention_head_widths(model)[0],  # at the model's head width
                                  softcap=model.attn_logit_softcapping > 0)  # Gemma 2: FlashAttention
    speed = straggled(speed, cluster.device, settings.num_gpus)  # the job waits for its slowest GPU
    place = placement(settings, cluster.devices_per_node)
    groups = RunGroups.of(settings, place)
    prec = Precision.of_settings(settings)
    work = RunWork.of(model, settings)
    works = work.passes()
    works = scaled_passes(works, (PASSES + MOE_PASSES)[:len(works)], settings)  # fp8: the scaling kernels
    passes = tuple(PassCost.of(w, comm, groups.tp, groups.by_name, NvlinkNode.of(cluster)) for w in works)
    counts = layers_per_virtual_stage(model.num_layers, settings)
    moe_counts = moe_layers_per_virtual_stage(model, counts) if work.moe_layer is not None else None
    recompute = PartialRecompute.of(model, settings, counts)  # recompute_method / recompute_num_layers
    send = pipeline_send_s(model, settings, comm, cluster.devices_per_node)
    params = rank_parameters(model, settings, counts, moe_counts)
    sharding = shard_groups(settings, cluster.devices_per_node)
    linears = torchao_fp8.torchtitan_linears(model)  # torchao Float8: the float8 all-gather and its scales
    fsdp = fsdp_costs(comm, sharding, model, settings, params.root_unit_params(), prec.weight_bytes,
                      prec.grad_bytes, torchao_fp8.gather_weight_bytes(settings),
                      torchao_fp8.gather_amax_s(comm, sharding.shard, settings, linears))
    syncs = partial(gradient_syncs, settings, comm, groups, params, prec, sharding)
    hidden_gather = hidden_param_gather_s(  # z12: overlap_param_gather's all-gathers beside the forward
        settings, comm, float(params.rank_params[0]), float(params.expert_rank_params[0]),
        params.chunk_params(0, 0), params.embedding_params, params.moe, prec, sharding)
    after_comm, exchange = after_sync_comm_s(model, settings, comm, groups, params, prec, sharding)
    after_comm = after_comm + np.array([torchao_fp8.precompute_s(comm, sharding.shard, settings, int(n), linears)
                                        for n in params.chunk_layers.sum(axis=0)])
    if fsdp is not None and fsdp.fsdp2 is not None:  # FSDP2: the root units' reduce-scatters after the backward
        after_comm = after_comm + fsdp.fsdp2.after_backward_comm_s
    stage_moe = params.chunk_moe.sum(axis=0)
    after_comm = after_comm + expert_bias_sync_s(settings, comm, groups.by_name["tp_dp_cp"], stage_moe,
                                                 model.num_experts)  # v6-router
    fp8_copies = stage_weight_copy_bytes(
        work.layer.forward, work.moe_layer.forward if work.moe_layer is not None else None, work.head.forward,
        params.chunk_layers.sum(axis=0) - stage_moe, stage_moe, settings)
    memory = partial(_rank_memory, model, settings, work, params, prec, ShardedState(fsdp, fp8_copies), recompute)
    return RunStructure(settings, speed, passes, counts, send, syncs,
                        params.rank_params, prec, after_comm, memory,
                        layer_shape_key(model, settings, cluster.device.compute_name, place.tp_nodes), exchange,
                        attention_mix=attention_mix(model, settings, counts, recompute),
                        moe_layers_per_vstage=moe_counts,
                        expert_rank_params=params.expert_rank_params if params.moe else None, fsdp=fsdp,
                        p2p_gather_s=pipeline_gather_s(model, settings, comm, place.tp_nodes),
                        hidden_gather_s=hidden_gather if hidden_gather.any() else None,
                        chunk_gather_s=chunk_gather_s(settings, comm, params, prec, sharding),  # q9
                        overlap_shares=OverlapShares.of(  # z14: the overlaps outside TP (`overlap_share`)
                            cluster.device.compute_units, groups.dp, sharding.shard,
                            bool(boundary_crosses_nodes(settings, cluster.devices_per_node).any())),
                        paired_moe_passes=(paired_moe_passes(model, settings, comm, groups, NvlinkNode.of(cluster))
                                           if settings.pipeline_schedule == "dualpipe" else None),
                        partial_recompute=recompute)


def _rank_memory(model: TransformerModel, settings: RunSettings, work: RunWork, params: RankParams, prec: Precision,
                 extra: ShardedState, recompute: PartialRecompute | None) -> tuple[RankMemory, ...]:
    return rank_memory(settings, params, activation_bytes(model, settings, work), prec, extra, recompute)


@dataclass(frozen=True)
class StageLayers:
    """Per virtual stage: its dense layers, and its mixture-of-experts layers (None: a
    dense model)."""

    dense: np.ndarray
    moe: np.ndarray | None
    dense_kept: np.ndarray | None = None  # of `dense`, the layers that recompute nothing (recompute_method block)
    moe_kept: np.ndarray | None = None  # of `moe`, likewise

    @staticmethod
    def of(st: RunStructure) -> StageLayers:
        counts = st.layers_per_vstage.astype(float)
        part = st.partial_recompute
        kept = kept_moe = None
        if part is not None and part.kept.any():
            kept_moe = part.kept_moe.astype(float)
            kept = part.kept.astype(float) - kept_moe
        if st.moe_layers_per_vstage is None:
            return StageLayers(counts, None, kept)
        moe_counts = st.moe_counts
        return StageLayers(counts - moe_counts, moe_counts, kept, kept_moe if kept is not None else None)


def op_device_s(st: RunStructure, times: PassTimes, layers: StageLayers,
                eff: DeviceEfficiency) -> tuple[np.ndarray, np.ndarray]:
    """Per virtual stage and micro-batch: the device time of its forward and backward op
    (its layers, each at least ZeRO-3's gathers beside it; what attention cores unlike
    layer 0's add; the embedding on the first, the head on the last)."""
    dev = times.device_s
    moe_dev = ((dev[Pass.MOE_LAYER_FWD], dev[Pass.MOE_LAYER_RECOMPUTE] + dev[Pass.MOE_LAYER_BWD])
               if layers.moe is not None else (0.0, 0.0))
    fsdp = st.fsdp.priced(st.speed, eff) if st.fsdp is not None else None  # FSDP2: its copy-ins (`fsdp_ops`)
    share = share_or_calibrated(st.overlap_shares.fsdp, eff)  # z14: the sharding group's occupancy share
    layer_fwd, layer_bwd, moe_fwd, moe_bwd = layer_device_s(  # ZeRO-3: beside the gathers
        fsdp, (dev[Pass.LAYER_FWD], dev[Pass.LAYER_RECOMPUTE] + dev[Pass.LAYER_BWD]), moe_dev, share)
    fwd = layers.dense * layer_fwd
    bwd = layers.dense * layer_bwd
    if layers.dense_kept is not None:  # recompute_method block: these layers' backward recomputes nothing
        _, kept_bwd, _, kept_moe_bwd = layer_device_s(
            fsdp, (dev[Pass.LAYER_FWD], dev[Pass.LAYER_BWD]),
            (moe_dev[0], dev[Pass.MOE_LAYER_BWD]) if layers.moe is not None else moe_dev, share)
        bwd += layers.dense_kept * (kept_bwd - layer_bwd)
        if layers.moe_kept is not None:
            bwd += layers.moe_kept * (kept_moe_bwd - moe_bwd)
    if st.attention_mix is not None:
        factor = eff.layer_time_factors.factor(st.layer_key)
        fwd_added, bwd_added = st.attention_mix.added_s(st.speed, eff)
        fwd += factor * fwd_added
        bwd += factor * bwd_added
    if layers.moe is not None:
        fwd += layers.moe * moe_fwd
        bwd += layers.moe * moe_bwd
    if fsdp is not None:
        exposed_fwd, exposed_bwd = fsdp.exposed_s(layers.dense, st.moe_counts)
        copies_fwd, copies_bwd = fsdp.fsdp2_stage_s(layers.dense, st.moe_counts, st.speed, eff)  # FSDP2's passes
        fwd += exposed_fwd + copies_fwd
        bwd += exposed_bwd + copies_bwd
    fwd[0] += dev[Pass.EMBEDDING_FWD]
    bwd[0] += dev[Pass.EMBEDDING_BWD]
    fwd[-1] += dev[Pass.HEAD_FWD]
    bwd[-1] += dev[Pass.HEAD_BWD]
    return fwd, bwd


def op_host_s(times: PassTimes, layers: StageLayers, eff: DeviceEfficiency) -> tuple[np.ndarray, np.ndarray]:
    """Per virtual stage and micro-batch: the host time to issue its forward and backward op."""
    host = times.host_s
    fwd = layers.dense * host[Pass.LAYER_FWD] + eff.host_microbatch_s
    bwd = layers.dense * (host[Pass.LAYER_RECOMPUTE] + host[Pass.LAYER_BWD]) + eff.host_microbatch_s
    if layers.moe is not None:
        fwd += layers.moe * host[Pass.MOE_LAYER_FWD]
        bwd += layers.moe * (host[Pass.MOE_LAYER_RECOMPUTE] + host[Pass.MOE_LAYER_BWD])
    if layers.dense_kept is not None:  # recompute_method block: no recomputation to issue
        bwd -= layers.dense_kept * host[Pass.LAYER_RECOMPUTE]
        if layers.moe_kept is not None:
            bwd -= layers.moe_kept * host[Pass.MOE_LAYER_RECOMPUTE]
    fwd[0] += host[Pass.EMBEDDING_FWD]
    bwd[0] += host[Pass.EMBEDDING_BWD]
    fwd[-1] += host[Pass.HEAD_FWD]
    bwd[-1] += host[Pass.HEAD_BWD]
    return fwd, bwd


def weight_grad_s(settings: RunSettings, times: PassTimes, layers: StageLayers) -> np.ndarray:
    """Per virtual stage: the weight-gradient kernels ZB-H1 and DualPipe run apart from
    the backward (zeros for the other schedules)."""
    if settings.pipeline_schedule not in ("zb_h1", "dualpipe"):
        return np.zeros(layers.dense.shape[0])
    wgt = layers.dense * times.layer_weight_grad_s
    if layers.moe is not None:
        wgt += layers.moe * times.moe_layer_weight_grad_s
    wgt[-1] += times.head_weight_grad_s
    return wgt


def pipeline_costs(st: RunStructure, times: PassTimes, eff: DeviceEfficiency) -> PipelineCosts:
    """Each virtual stage's op times, each bounded below by the host's issue time; the
    backward without what ZB-H1 splits off; blocking pipeline transfers on the ops that
    wait for them (`pipeline_p2p`)."""
    layers = StageLayers.of(st)
    fwd_dev, bwd_dev = op_device_s(st, times, layers, eff)
    fwd_host, bwd_host = op_host_s(times, layers, eff)
    fwd = host_bound_s(fwd_dev, fwd_host, eff)
    bwd = host_bound_s(bwd_dev, bwd_host, eff)
    wgt = weight_grad_s(st.settings, times, layers)
    if st.settings.pipeline_schedule == "zb_h1":
        bwd = bwd - wgt
    p2p = p2p_charges(st.settings, st.send_s, st.p2p_gather_s, sync_s(st.settings, eff.host_kernel_s))
    fwd, bwd = p2p.on_ops(fwd, bwd)
    contended = overlap_contention_s(st.settings, st.send_s, fwd, bwd,
                                     share_or_calibrated(st.overlap_shares.p2p, eff))  # z12, z14
    if contended is not None:
        fwd, bwd = fwd + contended[0], bwd + contended[1]
    return PipelineCosts(fwd, bwd, wgt, p2p.send_fwd_s, p2p.send_bwd_s,
                         p2p.fwd_s if p2p.blocking else None, p2p.bwd_s if p2p.blocking else None,
                         contended_fwd_s=contended[0] if contended is not None else None,
                         contended_bwd_s=contended[1] if contended is not None else None)


def param_gather_contention_s(st: RunStructure, costs: PipelineCosts, eff: DeviceEfficiency) -> np.ndarray:
    """Per pipeline rank: what `overlap_param_gather`'s all-gathers add beside the forward
    (`paraplan.predict.param_gather`); DualPipe's ranks hold stages r and p - 1 - r."""
    if st.hidden_gather_s is None:
        return np.zeros(st.settings.pipeline_model_parallel_size)
    added = param_gather_added_s(st.hidden_gather_s, costs.fwd_s,
                                 share_or_calibrated(st.overlap_shares.param_gather, eff))  # z14
    return added + added[::-1] if st.settings.pipeline_schedule == "dualpipe" else added


def after_sync_s(st: RunStructure, eff: DeviceEfficiency) -> np.ndarray:
    """Per pipeline stage, after the gradient reduction: its communication and the
    optimizer step (memory-bound)."""
    params = st.optimizer_params()
    opt_bytes = params * optimizer_step_bytes(st.settings, st.precision.optimizer_step_bytes)  # foreach: fsdp2_passes
    step = np.array([memory_time_s(b, st.speed, eff, optimizer_kernels(st.settings, n, OPTIMIZER_KERNELS))
                     for b, n in zip(opt_bytes, params, strict=True)])
    rank_grads = st.rank_params + (st.expert_rank_params if st.expert_rank_params is not None else 0.0)
    zeroing = unsharded_zeroing_bytes(st.settings, rank_grads, params, st.precision.grad_bytes)  # z7: megatron_ddp
    step = step + np.array([memory_time_s(b, st.speed, eff, 1) if b > 0 else 0.0 for b in zeroing])
    if st.fsdp is not None and st.fsdp.fsdp2 is not None:  # FSDP2's passes after the backward
        layers = StageLayers.of(st)
        p = st.settings.pipeline_model_parallel_size
        per_stage = (layers.dense.reshape(-1, p).sum(axis=0), st.moe_counts.reshape(-1, p).sum(axis=0))
        step = step + st.fsdp.fsdp2.after_step_s(per_stage, st.speed, eff)
    return st.after_sync_comm_s + step


def price(structure: RunStructure, kernel_s: list[np.ndarray], eff: DeviceEfficiency,
          sums: PassSums | None = None, priced: tuple[PassTimes, PipelineCosts] | None = None) -> ExecutionModel:
    """The execution model of a structure, with its kernels' device times (and their
    sums per pass, when already summed: `KernelBatch.priced`; its pass times and
    pipeline costs, when already priced: `priced`, as `pipeline_costs` gives them)."""
    st, settings = structure, structure.settings
    if priced is None:
        times = pass_times(st, kernel_s, eff, sums)
        costs = pipeline_costs(st, times, eff)
    else:
        times, costs = priced
    model = ExecutionModel(
        schedule=settings.pipeline_schedule,
        pipeline_stages=settings.pipeline_model_parallel_size,
        virtual_stages=settings.virtual_pipeline_model_parallel_size,
        microbatches=settings.num_microbatches,
        costs=costs,
        grad_sync=st.grad_sync,
        overlap_grad_reduce=(settings.overlap_grad_reduce or settings.zero_stage >= 2
                             or settings.DDP_impl == "torch"),
        after_sync_s=after_sync_s(st, eff),
        memory=st.memory,
        samples_per_iteration=settings.global_batch_size,
        num_devices=settings.num_gpus,
        grad_bucket_overlap_share=share_or_calibrated(st.overlap_shares.grad_reduce, eff),  # z12, z14: the buckets
    )
    if settings.pipeline_schedule == "dualpipe":  # v5-dualpipe: each rank's two chunks
        model = dualpipe_model(st, times, eff, model)
    if st.hidden_gather_s is not None:  # z12: overlap_param_gather beside the forward
        model = replace(model, after_sync_s=model.after_sync_s + param_gather_contention_s(st, costs, eff))
    if st.chunk_gather_s is not None:  # q9: interleaved: each chunk's gather where the schedule launches it
        model = replace(model, param_gather=ChunkGathers(
            st.chunk_gather_s, share_or_calibrated(st.overlap_shares.param_gather, eff)))
    return model


def build_execution(model: TransformerModel, settings: RunSettings, cluster: Cluster, comm: CommModel,
                    efficiency: DeviceEfficiency) -> ExecutionModel:
    """The execution model of one iteration of `settings` running `model` on `cluster`."""
    structure = run_structure(model, settings, cluster, comm)
    return price(structure, kernel_times_by_pass([structure], efficiency)[0], efficiency)
