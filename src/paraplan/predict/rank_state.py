"""What one rank of a transformer run holds and reduces, per pipeline stage: its
parameters per model chunk (`RankParams`), its data-parallel gradient buckets
(`gradient_syncs`), the communication after the reduction (`after_sync_comm_s`) and its
memory (`rank_memory`). `paraplan.predict.build` says what each piece costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from paraplan.core.comm import CommModel, Group
from paraplan.core.run_settings import RunSettings
from paraplan.core.sharding import (
    expert_sharding_group_size,
    gathers_once_per_iteration,
    reduces_every_microbatch,
    sharding_group_size,
)
from paraplan.core.transformer import TransformerModel
from paraplan.predict.cp_memory import CpTransientBytes
from paraplan.predict.fsdp_ops import (
    FsdpCosts,
    ShardGroups,
    accumulates_unsharded,
    fsdp_working_bytes,
    reduce_bucket_s,
    unsharded_grad_params,
)
from paraplan.predict.megatron_ddp import (
    chunk_buckets,
    first_gather_params,
    megatron_bucket_params,
    uses_megatron_buckets,
)
from paraplan.predict.param_gather import aligned_chunk_gathers  # q9: interleaved: placed on the run
from paraplan.predict.partial_recompute import PartialRecompute
from paraplan.predict.placement import Precision, RunGroups
from paraplan.predict.torch_pipelining import TorchPipeliningMemory
from paraplan.sim.builder import rank_memory as memory_parts
from paraplan.sim.builder.grad_buckets import equal_buckets
from paraplan.sim.builder.transformer_params import position_params, rank_head_params, rank_vocab_params
from paraplan.sim.execution import GradSync, RankMemory

GRAD_BUCKET_PARAMS = 40_000_000  # Megatron-LM's default DDP bucket
TORCH_DDP_BUCKET_BYTES = 25 * 2**20  # torch DistributedDataParallel's bucket_cap_mb = 25


def mtp_expert_params(model: TransformerModel) -> int:
    """Routed-expert weights of the multi-token-prediction layers (each like the main
    model's last layer: a MoE layer's experts in DeepSeek-V3)."""
    if not (model.mtp_num_layers and model.moe_layers[-1]):
        return 0
    return model.mtp_num_layers * model.num_experts * model.expert_params


@dataclass(frozen=True, eq=False)
class RankParams:
    """Parameters on one rank: per model chunk and pipeline stage ([chunk, stage]
    arrays), and per pipeline stage."""

    layer_params: float  # one transformer layer's, split over t
    chunk_layers: np.ndarray  # transformer layers
    chunk_moe: np.ndarray  # of them, mixture-of-experts layers (zeros for a dense model)
    chunk_dense_params: np.ndarray | None  # a MoE model's non-expert weights (split over t); None: dense
    chunk_expert_params: np.ndarray  # routed-expert weights (split over EP x ETP), with the MTP layers'
    rank_params: np.ndarray  # per stage: all but the routed experts
    expert_rank_params: np.ndarray  # per stage: the routed experts
    vocab_params: float  # the (padded) embedding table's share of one rank
    embedding_params: float  # on the first stage: the vocabulary and learned positions
    head_params: float  # on the last stage: final norm, output layer (untied or p > 1), MTP layers

    @property
    def moe(self) -> bool:
        return self.chunk_dense_params is not None

    def root_unit_params(self) -> np.ndarray:
        """Per virtual stage: the weights outside the transformer layers (ZeRO-3's root
        unit, `fsdp_ops`): the embedding on the first, the head on the last."""
        v, p = self.chunk_layers.shape
        root = np.zeros(v * p)
        root[0] += self.embedding_params
        root[v * p - 1] += self.head_params
        return root

    def chunk_params(self, chunk: int, stage: int) -> float:
        """Weights of one chunk of one stage whose gradients the data-parallel group
        reduces: all but the routed experts."""
        v, p = self.chunk_layers.shape
        params = (int(self.chunk_layers[chunk, stage]) * self.layer_params if self.chunk_dense_params is None
                  else float(self.chunk_dense_params[chunk, stage]))
        if chunk == 0 and stage == 0:
            params += self.embedding_params
        if chunk == v - 1 and stage == p - 1:
            params += self.head_params
        return params


def rank_parameters(model: TransformerModel, settings: RunSettings, counts: np.ndarray,
                    moe_counts: np.ndarray | None) -> RankParams:
    """Parameters of each chunk and stage from its layers (`counts`, `moe_counts`: per
    virtual stage); a mixture-of-experts model's routed experts apart (split over EP x ETP)."""
    t, p = settings.tensor_model_parallel_size, settings.pipeline_model_parallel_size
    v = settings.virtual_pipeline_model_parallel_size
    layer_params = model.layer_params / t
    vocab_params = rank_vocab_params(model, t)
    positions = position_params(model)
    chunk_layers = counts.reshape(v, p)  # [chunk, rank]
    rank_params = chunk_layers.sum(axis=0) * layer_params
    chunk_moe = np.zeros((v, p)) if moe_counts is None else moe_counts.reshape(v, p).astype(float)
    chunk_expert_params = np.zeros((v, p))
    chunk_dense_params = None
    expert_split = settings.expert_model_parallel_size * settings.expert_tensor_parallel
    if moe_counts is not None:
        experts = model.num_experts * model.expert_params
        chunk_dense_params = ((chunk_layers - chunk_moe) * model.dense_layer_params
                              + chunk_moe * (model.moe_layer_params - experts)) / t
        chunk_expert_params = chunk_moe * experts / expert_split
        rank_params = chunk_dense_params.sum(axis=0)
    expert_rank_params = chunk_expert_params.sum(axis=0)
    rank_params[0] += vocab_params + positions
    # the MTP layers (the few norm weights counted as split too); a MoE one's experts over EP x ETP
    mtp_experts = mtp_expert_params(model)
    head_params = rank_head_params(model, t, p, vocab_params, mtp_experts)
    rank_params[p - 1] += head_params
    if mtp_experts:
        chunk_expert_params[v - 1, p - 1] += mtp_experts / expert_split
        expert_rank_params = chunk_expert_params.sum(axis=0)
    return RankParams(layer_params, chunk_layers, chunk_moe, chunk_dense_params, chunk_expert_params, rank_params,
                      expert_rank_params, vocab_params, vocab_params + positions, head_params)


@dataclass(frozen=True)
class GradBuckets:
    """How gradients are reduced: the collective, the bytes per reduced gradient and the
    parameters per bucket (Megatron's `GRAD_BUCKET_PARAMS`, or torch DDP's bytes)."""

    collective: str
    reduced_bytes: int
    bucket_params: float

    @staticmethod
    def of(settings: RunSettings, prec: Precision) -> GradBuckets:
        sharded = settings.use_distributed_optimizer or settings.zero_stage >= 1
        torch_ddp = settings.DDP_impl == "torch"
        reduced_bytes = prec.weight_bytes if torch_ddp else prec.grad_bytes  # torch reduces param.grad
        bucket_params = TORCH_DDP_BUCKET_BYTES / reduced_bytes if torch_ddp else GRAD_BUCKET_PARAMS
        return GradBuckets("reduce_scatter" if sharded else "all_reduce", reduced_bytes, bucket_params)


def gradient_syncs(settings: RunSettings, comm: CommModel, groups: RunGroups, params: RankParams,
                   prec: Precision, sharding: ShardGroups) -> tuple[GradSync, ...]:
    """Each pipeline stage's gradient reduction (ZeRO-3: one bucket per layer, FSDP's
    units; with hybrid sharding each bucket also all-reduced over its replicas); none
    after the last micro-batch where every micro-batch reduce-scatters its own
    (`fsdp_ops`)."""
    buckets = GradBuckets.of(settings, prec)
    idle = (groups.dp.size == 1 and (not params.moe or groups.edp.size == 1)) or reduces_every_microbatch(settings)
    zero3 = settings.zero_stage == 3
    root_apart = params.root_unit_params() if settings.use_torch_fsdp2 else None  # u3-fsdp2: reduced after (`fsdp_ops`)
    megatron = uses_megatron_buckets(settings)  # z7: Megatron-Core's bucket layout (`megatron_ddp`)
    if megatron:
        buckets = replace(buckets, bucket_params=megatron_bucket_params(settings))
    return tuple(GradSync.none() if idle else _stage_grad_sync(s, comm, params, buckets, sharding, zero3, root_apart,
                                                               megatron)
                 for s in range(settings.pipeline_model_parallel_size))


def _stage_grad_sync(stage: int, comm: CommModel, params: RankParams, buckets: GradBuckets,
                     sharding: ShardGroups, zero3: bool, root_apart: np.ndarray | None = None,
                     megatron: bool = False) -> GradSync:
    """One stage's buckets, later chunks first (they finish their backward first): the
    dense gradients over the data-parallel (sharding) group, the experts' over theirs;
    `root_apart` (per virtual stage): root-unit weights reduced apart, after the backward;
    `megatron`: Megatron-Core's layout (`megatron_ddp.chunk_buckets`)."""
    chunks: list[int] = []
    fractions: list[float] = []
    bucket_s: list[float] = []
    for c in range(params.chunk_layers.shape[0] - 1, -1, -1):
        expert_groups = replace(sharding, shard=sharding.expert, replicate=sharding.expert_replicate)
        apart = float(root_apart[c * params.chunk_layers.shape[1] + stage]) if root_apart is not None else 0.0
        for total, over, expert in ((params.chunk_params(c, stage) - apart, sharding, False),
                                    (float(params.chunk_expert_params[c, stage]), expert_groups, True)):
            if over.shard.size * over.replicate.size == 1 or (expert and total == 0):
                continue
            if megatron:
                first = c == 0 and stage == 0
                layout = chunk_buckets(total, 0.0 if expert or not first else params.embedding_params, first,
                                       buckets.bucket_params)
                chunks += [c] * len(layout.params)
                priced = {n: reduce_bucket_s(comm, buckets.collective, n * buckets.reduced_bytes, over)
                          for n in set(layout.params)}  # the equal buckets priced once
                bucket_s += [priced[n] for n in layout.params]
                fractions += layout.ready_fraction
                continue
            units = max(1, int(params.chunk_moe[c, stage] if expert else params.chunk_layers[c, stage]))
            split = equal_buckets(total, buckets.bucket_params, units if zero3 else 0)  # ZeRO-3: one per FSDP unit
            one = reduce_bucket_s(comm, buckets.collective, split.each * buckets.reduced_bytes, over)
            chunks += [c] * split.count
            bucket_s += [one] * split.count
            fractions += split.ready_fractions
    return GradSync(np.array(bucket_s), np.array(chunks, dtype=np.int64), np.array(fractions))


def after_sync_comm_s(model: TransformerModel, settings: RunSettings, comm: CommModel, groups: RunGroups,
                      params: RankParams, prec: Precision, sharding: ShardGroups) -> tuple[np.ndarray, float]:
    """Per pipeline stage: the communication after the gradient reduction (the sharded
    optimizer's weight all-gather unless overlapped, also ZeRO-3's when it gathers once
    per iteration, the tied-embedding gradient exchange), and that exchange alone."""
    p = settings.pipeline_model_parallel_size
    sharded = settings.use_distributed_optimizer or settings.zero_stage >= 1
    after_comm = np.zeros(p)
    exchange = 0.0
    zero3 = settings.zero_stage == 3 and not gathers_once_per_iteration(settings)
    if sharded and not zero3 and sharding.shard.size > 1 and not settings.overlap_param_gather:
        after_comm += _all_gather_s(comm, params.rank_params, prec, sharding.shard)
    if sharded and not zero3 and sharding.expert.size > 1 and params.moe and not settings.overlap_param_gather:
        after_comm += _all_gather_s(comm, params.expert_rank_params, prec, sharding.expert)
    if (sharded and not zero3 and sharding.shard.size > 1 and settings.overlap_param_gather
            and uses_megatron_buckets(settings)
            and not aligned_chunk_gathers(settings)):  # z7: the first rank's first all-gather waits (`megatron_ddp`)
        first = first_gather_params(params.chunk_params(0, 0), params.embedding_params,
                                    megatron_bucket_params(settings))
        after_comm[0] += float(comm.time_s("all_gather", first * prec.weight_bytes, sharding.shard))
    if not model.untie_embeddings_and_output_weights and p > 1:
        exchange = float(comm.time_s("all_reduce", params.vocab_params * prec.grad_bytes, groups.embedding_pair))
        after_comm[0] += exchange
        after_comm[p - 1] += exchange
    return after_comm, exchange


def _all_gather_s(comm: CommModel, stage_params: np.ndarray, prec: Precision, group: Group) -> np.ndarray:
    return np.array([float(comm.time_s("all_gather", n * prec.weight_bytes, group)) for n in stage_params])


@dataclass(frozen=True)
class ActivationBytes:
    """Activation bytes per micro-batch (`ops.layer_activation_bytes`, `moe_ops`)."""

    layer: float  # a (dense) transformer layer's
    moe_layer: float | None  # a mixture-of-experts layer's (None: a dense model)
    embedding: float
    head: float  # the last stage's (final norm, head, loss, MTP layers)
    recomputed_layer: float = 0.0  # full recomputation: the layer being rebuilt (the largest kind)
    loss_transient: float = 0.0  # the last stage's cross-entropy, for a moment (`loss_ops.loss_transient_bytes`)
    pipelining: TorchPipeliningMemory | None = None  # torchtitan's pipelines' buffers (`torch_pipelining`)
    cp: CpTransientBytes = field(default_factory=CpTransientBytes)  # a layer's attention under CP (`cp_memory`)
    kept_layer: float = 0.0  # full recomputation: a dense layer's activations when it is not recomputed
    kept_moe_layer: float | None = None  # likewise a MoE layer's (recompute_method block: `partial_recompute`)


@dataclass(frozen=True, eq=False)
class ShardedState:
    """What ZeRO-3 and FP8 add to a stage's memory: the FSDP gathers (None without
    ZeRO-3, `fsdp_ops`) and, per pipeline stage, the FP8 weight copies (`fp8_ops`)."""

    fsdp: FsdpCosts | None
    fp8_copy_bytes: np.ndarray


def rank_memory(settings: RunSettings, params: RankParams, acts: ActivationBytes,
                prec: Precision, extra: ShardedState,
                recompute: PartialRecompute | None = None) -> tuple[RankMemory, ...]:
    """Each pipeline stage's bytes: Megatron-LM's bytes per parameter for weights,
    gradients and optimizer state (sharded as the settings say: ZeRO-3's weights over
    the sharding group, the experts' over theirs), the FP8 weight copies, ZeRO-3's
    transient gathers and the activations. The working set is given per model chunk for
    its two kinds of moment (`_Moments`), which the engine adds to what the schedule
    holds when each op runs, and as their largest. `recompute`: Megatron's
    `recompute_method` (layers kept whole, or checkpointed in groups)."""
    p, v = settings.pipeline_model_parallel_size, settings.virtual_pipeline_model_parallel_size
    expert_ranks = expert_sharding_group_size(settings)  # the experts' sharding group (EDP / R)
    root_units = params.root_unit_params().reshape(v, p)
    zero3 = settings.zero_stage == 3
    shards, expert_shards = settings.optimizer_shards, settings.expert_optimizer_shards
    memory = []
    for s in range(p):
        n = params.rank_params[s]
        rebuilt = 1
        if recompute is None:
            chunk_acts = (params.chunk_layers[:, s] * acts.layer).astype(float)
            if acts.moe_layer is not None:
                chunk_acts += params.chunk_moe[:, s] * (acts.moe_layer - acts.layer)
        else:  # full recomputation of some layers, or in groups (`partial_recompute`); virtual stage c p + s
            kept_moe = recompute.kept_moe.reshape(v, p)[:, s]
            kept_dense = recompute.kept.reshape(v, p)[:, s] - kept_moe
            checkpointed = recompute.stored_inputs(params.chunk_layers[:, s])
            chunk_acts = checkpointed * acts.layer + kept_dense * acts.kept_layer  # a checkpoint: the layer's input
            if acts.kept_moe_layer is not None:
                chunk_acts = chunk_acts + kept_moe * acts.kept_moe_layer
            rebuilt = recompute.rebuilt_layers(int(params.chunk_layers[:, s].max()))
        experts = params.expert_rank_params[s]
        if s == 0:
            chunk_acts[0] += acts.embedding
        if s == p - 1:
            chunk_acts[v - 1] += acts.head
        root = float(root_units[:, s].sum())
        moments = _Moments(
            gathered=fsdp_working_bytes(extra.fsdp, settings, root, n, experts, prec.weight_bytes, 0),
            backward=rebuilt * acts.recomputed_layer + fsdp_working_bytes(extra.fsdp, settings, root, n, experts,
                                                                          prec.weight_bytes, prec.grad_bytes))
        lazy = None
        if accumulates_unsharded(settings):  # unsharded gradients, from each chunk's first backward on
            lazy = prec.grad_bytes * np.array(
                [params.chunk_params(c, s) * (sharding_group_size(settings) > 1)
                 + params.chunk_expert_params[c, s] * (expert_ranks > 1) for c in range(v)])
        elif extra.fsdp is None and settings.zero_stage == 2 and sharding_group_size(settings) > 1:
            # ZeRO-2 reduced after the only micro-batch: each unit's gradient until its reduce-scatter
            moments = replace(moments, backward=moments.backward + unsharded_grad_params(
                settings, params.layer_params, root, n) * prec.grad_bytes)
        held = _PipeliningHeld.of(acts.pipelining, s, p, v)
        chunk_acts -= np.where(params.chunk_layers[:, s] > 0, held.received_input, 0.0)  # a block saved it
        per_op = moments.per_op(params.chunk_layers[:, s] > 0, acts, s == p - 1) + held.buffers  # buffers: always
        weight_b, grad_b, optimizer_b = (float(b) for b in prec.state_bytes)
        zero2 = settings.zero_stage >= 2
        iteration_end = held.iteration_end
        if settings.use_torch_fsdp2:  # sharded gradients freed by zero_grad, allocated again in the backward
            dense_g, expert_g = _fsdp2_sharded_grad_bytes(params, s, grad_b, shards, expert_ranks)
            if lazy is None:
                lazy = dense_g + expert_g
            else:  # accumulated unsharded (a group of one: its shard is the whole), the shards replace them after
                lazy = lazy + dense_g * (sharding_group_size(settings) == 1) + expert_g * (expert_ranks == 1)
            iteration_end += float((dense_g + expert_g).sum())
            grad_b = 0.0
        dense = memory_parts.ParamState(n, weight_b, grad_b, optimizer_b, shards if zero3 else 1,
                                        shards if zero2 else 1, shards)
        expert = memory_parts.ParamState(experts, weight_b, grad_b, optimizer_b, expert_ranks if zero3 else 1,
                                         expert_ranks if zero2 else 1, expert_shards)
        memory.append(replace(memory_parts.rank_memory([dense, expert], chunk_acts, float(per_op.max()),
                                                       extra.fp8_copy_bytes[s]),
                              lazy_gradient_bytes_per_chunk=lazy, kept_output_bytes_per_chunk=held.kept_output,
                              kept_input_grad_bytes_per_chunk=held.kept_input_grad,
                              iteration_end_bytes=iteration_end, working_bytes_per_op=per_op))
    return tuple(memory)


def _fsdp2_sharded_grad_bytes(params: RankParams, stage: int, grad_bytes: float, shards: int,
                              expert_ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per model chunk of one stage: FSDP2's sharded gradients (`fully_shard`: each
    unit's reduce-scatter output, assigned to `param.grad`). Every torch optimizer's
    `zero_grad` sets them to None (`set_to_none`, torch's default since 2.0), and the
    training loops that run FSDP2 call it before the forward (torchtitan `train.py`,
    NeMo AutoModel's recipes), so the forward runs without them and each chunk's come
    back in its first backward, unit by unit, as its activations are freed: they are
    allocated like the gradient accumulators (`RankMemory.lazy_gradient_bytes_per_chunk`),
    not kept in the weight state as Megatron's persistent gradient buffer is. The dense
    weights' and the routed experts' apart."""
    v = params.chunk_layers.shape[0]
    dense = np.array([params.chunk_params(c, stage) for c in range(v)])
    return grad_bytes * dense / shards, grad_bytes * params.chunk_expert_params[:, stage] / expert_ranks


@dataclass(frozen=True)
class _Moments:
    """A stage's transients beside the weight state: ZeRO-3's gathered weights (at every
    moment) and what a backward adds (the layer being recomputed, ZeRO-3's gathers with
    the unsharded gradients, ZeRO-2's unit being reduced)."""

    gathered: float
    backward: float

    def per_op(self, has_layers: np.ndarray, acts: ActivationBytes, last_stage: bool) -> np.ndarray:
        """[forward, backward] x model chunk: a forward, the gathered weights with a
        layer's context-parallel attention (`cp_memory`) or, at the end of the last
        chunk of the last stage, the loss's transient (`loss_ops`); a backward, its
        transients with a layer's attention backward (and, when the attention is
        recomputed, its forward, whichever is larger)."""
        cp = acts.cp
        attention_bwd = cp.backward_moment_bytes
        forward = self.gathered + np.where(has_layers, cp.forward_bytes, 0.0)
        if last_stage:  # the loss runs after the layers' attention, beside the gathered weights
            forward[-1] = self.gathered + max(float(np.where(has_layers[-1], cp.forward_bytes, 0.0)),
                                              acts.loss_transient)
        backward = self.backward + np.where(has_layers, attention_bwd, 0.0)
        return np.stack([forward, backward])


@dataclass(frozen=True, eq=False)
class _PipeliningHeld:
    """What `torch.distributed.pipelining` holds on one rank, per model chunk where the
    engine needs it (`torch_pipelining`); all zero / None without it."""

    received_input: np.ndarray | float = 0.0  # per micro-batch: the saved input that is a receive buffer
    buffers: float = 0.0
    kept_output: np.ndarray | None = None
    kept_input_grad: np.ndarray | None = None
    iteration_end: float = 0.0

    @staticmethod
    def of(pipelining: TorchPipeliningMemory | None, stage: int, p: int, v: int) -> _PipeliningHeld:
        if pipelining is None:
            return _PipeliningHeld()
        vstages = [c * p + stage for c in range(v)]
        return _PipeliningHeld(np.array([pipelining.received_input_bytes(x) for x in vstages]),
                               sum(pipelining.buffer_bytes(x) for x in vstages),
                               np.array([pipelining.kept_output_bytes(x) for x in vstages]),
                               np.array([pipelining.kept_input_grad_bytes(x) for x in vstages]),
                               sum(pipelining.iteration_end_bytes(x) for x in vstages))
