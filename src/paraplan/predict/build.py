"""The execution model of a transformer training run: model + cluster + settings +
device calibration -> `paraplan.sim.execution.ExecutionModel`.

Placement follows Megatron-Core's rank order tp-cp-dp-pp (tensor-parallel ranks
adjacent, then context-parallel, then data-parallel, then pipeline): rank = tp + t (cp
+ c (dp + d pp)), node = rank // devices_per_node. Each group's node span decides the
link tier its collectives use.

What each piece costs:
- a layer's forward, recomputation and backward on one rank: its kernels
  (`paraplan.predict.ops`) priced by the device model, plus its tensor-parallel
  collectives (blocking ones in full; an overlapped one where it outlasts the kernel it
  runs beside, plus the contention share of the overlapped time, `PassCost.comm_s`);
  each pass is bounded below by the host's issue time;
- layers whose attention core differs from layer 0's (sliding windows): each virtual
  stage adds what its cores cost beyond layer 0's (`paraplan.predict.attention_mix`);
- embedding on the first virtual stage, final norm + LM head + loss on the last (with
  the multi-token-prediction layers, `ops.head_work`);
- pipeline transfers: one micro-batch's activation b s h / t per rank (Megatron
  scatters it over the tensor-parallel ranks), point to point;
- context-parallel attention (`paraplan.predict.cp_ops`): ring transfers between CP
  neighbours beside the attention steps, or Ulysses all-to-alls over the CP group;
- data-parallel gradient reduction over the d x c ranks that hold the same weights
  (Megatron's dp-cp group) in buckets of `GRAD_BUCKET_PARAMS` parameters
  (all-reduce; reduce-scatter with a sharded optimizer), ready layer by layer during
  the last backward, overlapped with it under `overlap_grad_reduce`; with
  `DDP_impl` torch, buckets of `TORCH_DDP_BUCKET_BYTES` of gradients in the weights'
  dtype, always overlapped; ZeRO-3 (FSDP2) gathers each layer's weights before its forward
  and its backward, prefetched beside the previous layer's compute, and reduce-scatters
  its gradients layer by layer (`paraplan.predict.fsdp_ops`); with hybrid sharding the
  state is sharded inside a group and each bucket all-reduced over its replicas;
- after the reduction: the tied-embedding gradient exchange between the first and
  last pipeline stage, the optimizer step (memory-bound, `optimizer_step_bytes`)
  and, with a sharded optimizer, the weight all-gather unless `overlap_param_gather`;
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

import math
from dataclasses import dataclass, fields, replace

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel, Group
from paraplan.core.run_settings import DTYPE_BYTES, RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.attention_mix import AttentionMix, attention_mix
from paraplan.predict.cp_ops import CP_GROUP, CP_RING
from paraplan.predict.device_model import (
    DeviceEfficiency,
    DeviceSpeed,
    host_bound_s,
    kernel_times_s,
    memory_time_s,
)
from paraplan.predict.fp8_ops import device_speed, scaled_passes, stage_weight_copy_bytes
from paraplan.predict.fsdp_ops import (
    FsdpCosts,
    fsdp_costs,
    fsdp_working_bytes,
    layer_device_s,
    reduce_bucket_s,
    shard_groups,
)
from paraplan.predict.layer_factors import layer_shape_key
from paraplan.predict.moe_ops import moe_layer_work
from paraplan.predict.mtp_ops import last_stage_work
from paraplan.predict.ops import Kernels, embedding_work, layer_work
from paraplan.predict.pass_cost import PassCost
from paraplan.sim.engine import PipelineCosts
from paraplan.sim.execution import ExecutionModel, GradSync, RankMemory

GRAD_BUCKET_PARAMS = 40_000_000  # Megatron-LM's default DDP bucket
TORCH_DDP_BUCKET_BYTES = 25 * 2**20  # torch DistributedDataParallel's bucket_cap_mb = 25
OPTIMIZER_KERNELS = 4  # multi-tensor Adam, norm, scale, zero: a few launches per bucket
KERNEL_FIELDS = tuple(f.name for f in fields(Kernels))


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each kind of state (Megatron-LM's mixed precision)."""

    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int  # main weights, main gradients (fp16), Adam moments
    optimizer_step_bytes: int  # memory traffic of one optimizer step per parameter

    @staticmethod
    def of(dtype: str) -> Precision:
        """bf16/fp8: 2-byte weights, fp32 gradients, 12 bytes of optimizer state (18 in
        all); fp16: 2-byte gradients plus an fp32 copy in the optimizer (20); fp32: 16.
        A step reads the gradient, reads and writes main weights and both moments,
        writes the model weights, and passes over the gradients for the norm and zeroing
        (fp16 also copies them to fp32 and checks for overflow)."""
        if dtype == "fp32":
            return Precision(4, 4, 8, 4 + 24 + 4 + 4)
        if dtype == "fp16":
            return Precision(2, 2, 16, 4 + 24 + 2 + (2 + 4) + 4 + 4 + 2)
        return Precision(2, 4, 12, 4 + 24 + 2 + 4 + 4)


@dataclass(frozen=True)
class Placement:
    """Node spans of the groups one rank belongs to."""

    tp_nodes: int
    dp_nodes: int  # the gradient-reduction group: data x context parallel (Megatron's dp-cp)
    pp_cross_node: bool
    embedding_cross_node: bool
    cp_nodes: int = 1
    etp_nodes: int = 1
    ep_nodes: int = 1
    edp_nodes: int = 1  # the expert-data-parallel group


def placement(settings: RunSettings, devices_per_node: int) -> Placement:
    """Spans in the rank order tp-cp-dp-pp: the CP group and the dp-cp group are every
    t-th rank (c and d x c of them), a pipeline neighbour t c d ranks away."""
    t, d, p = (settings.tensor_model_parallel_size, settings.data_parallel_size,
               settings.pipeline_model_parallel_size)
    c = settings.context_parallel_size
    g = devices_per_node
    tp_nodes = len({r // g for r in range(t)})
    cp_nodes = len({(t * j) // g for j in range(c)})
    dp_nodes = len({(t * j) // g for j in range(d * c)})
    pp_cross = p > 1 and (t * c * d) // g != 0
    emb_cross = p > 1 and (t * c * d * (p - 1)) // g != 0
    # the expert grid over the same ranks: expert-tensor rank fastest, then EP, then expert-DP
    etp, ep = settings.expert_tensor_parallel, settings.expert_model_parallel_size
    etp_nodes = len({r // g for r in range(etp)})
    ep_nodes = len({(etp * j) // g for j in range(ep)})
    edp_nodes = len({(etp * ep * j) // g for j in range(settings.expert_data_parallel_size)})
    return Placement(tp_nodes, dp_nodes, pp_cross, emb_cross, cp_nodes, etp_nodes, ep_nodes, edp_nodes)


def context_parallel_groups(settings: RunSettings, place: Placement) -> dict[str, Group]:
    """The groups a pass's context-parallel collectives run over (`cp_ops`): the CP
    group, and one hop of its ring (across nodes when the group spans several)."""
    c = settings.context_parallel_size
    return {CP_GROUP: Group(c, place.cp_nodes), CP_RING: Group(2 if c > 1 else 1, 2 if place.cp_nodes > 1 else 1)}


def expert_parallel_groups(settings: RunSettings, place: Placement) -> dict[str, Group]:
    """The groups a MoE layer's collectives run over (`moe_ops`): expert-parallel
    (the token all-to-alls) and expert-tensor-parallel."""
    return {"ep": Group(settings.expert_model_parallel_size, place.ep_nodes),
            "etp": Group(settings.expert_tensor_parallel, place.etp_nodes)}


def layers_per_virtual_stage(num_layers: int, settings: RunSettings) -> np.ndarray:
    """Layers of each virtual stage as the settings split them (`paraplan.core.pipeline_split`:
    even, uneven first/last, embedding/loss counted as layers, or a layout); the embedding
    stays on the first virtual stage, the output layer, loss and MTP layers on the last."""
    return np.array(settings.layers_per_virtual_stage(num_layers), dtype=np.int64)


PASSES: tuple[str, ...] = ("layer_fwd", "layer_recompute", "layer_bwd", "embedding_fwd", "embedding_bwd",
                           "head_fwd", "head_bwd")
MOE_PASSES: tuple[str, ...] = ("moe_layer_fwd", "moe_layer_recompute", "moe_layer_bwd")
"""A mixture-of-experts model's structure has these three after `PASSES`."""


@dataclass(frozen=True, eq=False)
class RunStructure:
    """Everything about a run that does not depend on the device calibration: the
    passes' kernels and collectives, the layer split, transfers, gradient buckets,
    parameters and activations. `price` turns it into an `ExecutionModel`."""

    settings: RunSettings
    speed: DeviceSpeed
    passes: tuple[PassCost, ...]  # in PASSES order, then MOE_PASSES for a mixture-of-experts model
    layers_per_vstage: np.ndarray
    send_s: np.ndarray
    grad_sync: tuple[GradSync, ...]
    rank_params: np.ndarray
    precision: Precision
    after_sync_comm_s: np.ndarray
    memory: tuple[RankMemory, ...]
    layer_key: str = ""  # `layer_factors.layer_shape_key` of its transformer layers
    embedding_exchange_s: float = 0.0  # the tied-embedding gradient all-reduce (part of after_sync_comm_s)
    attention_mix: AttentionMix | None = None  # layers whose attention core is unlike layer 0's (windows)
    moe_layers_per_vstage: np.ndarray | None = None  # of layers_per_vstage, the MoE layers (None: a dense model)
    expert_rank_params: np.ndarray | None = None  # per pipeline stage: expert weights on one rank
    fsdp: FsdpCosts | None = None  # zero_stage 3's weight gathers (`fsdp_ops`)

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


LAYER_PASSES = (0, 1, 2)  # indices into PASSES of the transformer layer's passes
MOE_LAYER_PASSES = (7, 8, 9)  # the MoE layer's, in a mixture-of-experts model's structure


def kernel_times_by_pass(structures: list[RunStructure], eff: DeviceEfficiency) -> list[list[np.ndarray]]:
    """Kernel device times of every pass of every structure, priced in one vectorised
    call per device speed."""
    out: list[list[np.ndarray]] = [[np.zeros(0)] * len(st.passes) for st in structures]
    by_speed: dict[DeviceSpeed, list[tuple[int, int]]] = {}
    for i, st in enumerate(structures):
        for j in range(len(st.passes)):
            by_speed.setdefault(st.speed, []).append((i, j))
    for speed, members in by_speed.items():
        parts = [structures[i].passes[j].kernels for i, j in members]
        merged = Kernels(*(np.concatenate([getattr(k, f) for k in parts]) for f in KERNEL_FIELDS))
        times = kernel_times_s(merged, speed, eff)
        bounds = np.cumsum([0, *[len(k) for k in parts]])
        for (i, j), lo, hi in zip(members, bounds[:-1], bounds[1:], strict=True):
            out[i][j] = times[lo:hi]
    return out


@dataclass(frozen=True)
class PassTimes:
    """Each pass's device time (kernels and collectives) and host issue time, and the
    weight-gradient kernels of the layer and head backward (ZB-H1 splits them off)."""

    device_s: list[float]  # in PASSES (then MOE_PASSES) order
    host_s: list[float]
    layer_weight_grad_s: float
    head_weight_grad_s: float
    moe_layer_weight_grad_s: float = 0.0


def pass_times(structure: RunStructure, kernel_s: list[np.ndarray], eff: DeviceEfficiency) -> PassTimes:
    """The passes' times given their kernels' times; a layer shape with a measured
    factor (`DeviceEfficiency.layer_time_factors`) has its layer passes (device and
    host time alike, so the whole op) scaled by it."""
    dev = [c.device_s(k, eff) for c, k in zip(structure.passes, kernel_s, strict=True)]
    host = [c.host_s(eff) for c in structure.passes]
    layer_wgt = structure.passes[2].weight_grad_s(kernel_s[2])
    moe = len(structure.passes) > len(PASSES)
    moe_wgt = structure.passes[9].weight_grad_s(kernel_s[9]) if moe else 0.0
    factor = eff.layer_time_factors.factor(structure.layer_key)
    if factor != 1.0:
        for j in LAYER_PASSES + (MOE_LAYER_PASSES if moe else ()):
            dev[j] *= factor
            host[j] *= factor
        layer_wgt *= factor
        moe_wgt *= factor
    return PassTimes(dev, host, layer_wgt, structure.passes[6].weight_grad_s(kernel_s[6]), moe_wgt)


def mtp_expert_params(model: TransformerModel) -> int:
    """Routed-expert weights of the multi-token-prediction layers (each like the main
    model's last layer: a MoE layer's experts in DeepSeek-V3)."""
    if not (model.mtp_num_layers and model.moe_layers[-1]):
        return 0
    return model.mtp_num_layers * model.num_experts * model.expert_params


def moe_layers_per_virtual_stage(model: TransformerModel, counts: np.ndarray) -> np.ndarray:
    """Of each virtual stage's layers (consecutive, virtual stage by virtual stage, as
    Megatron assigns them), how many are mixture-of-experts layers."""
    ends = np.cumsum(counts)
    flags = np.array(model.moe_layers, dtype=np.int64)
    return np.array([flags[end - n:end].sum() for n, end in zip(counts, ends, strict=True)], dtype=np.int64)


def run_structure(model: TransformerModel, settings: RunSettings, cluster: Cluster,
                  comm: CommModel) -> RunStructure:
    """The calibration-independent part of a run's execution model (see the module
    doc). `settings.check(model)` runs first; the cluster's node count does not limit
    the run (its nodes are the run's kind of node)."""
    settings.check(model)
    t, p = settings.tensor_model_parallel_size, settings.pipeline_model_parallel_size
    c = settings.context_parallel_size
    d = settings.data_context_parallel_size  # the ranks that hold the same weights (d x c)
    v = settings.virtual_pipeline_model_parallel_size
    speed = device_speed(cluster.device, settings)  # fp8: the BF16 peak and the FP8 GEMM ceiling
    place = placement(settings, cluster.devices_per_node)
    tp_group = Group(t, place.tp_nodes)
    dp_group = Group(d, place.dp_nodes)
    cp_groups = context_parallel_groups(settings, place)
    prec = Precision.of(settings.dtype)
    zero3 = settings.zero_stage == 3

    layer = layer_work(model, settings)
    emb = embedding_work(model, settings)
    head = last_stage_work(model, settings)
    works = [layer.forward, layer.recompute, layer.backward, emb.forward, emb.backward, head.forward, head.backward]
    moe = moe_layer_work(model, settings) if model.num_moe_layers else None
    if moe is not None:
        works += [moe.forward, moe.recompute, moe.backward]
    groups = {**cp_groups, **expert_parallel_groups(settings, place)}
    works = scaled_passes(works, (PASSES + MOE_PASSES)[:len(works)], settings)  # fp8: the scaling kernels
    passes = tuple(PassCost.of(w, comm, tp_group, groups) for w in works)
    layer_params = model.layer_params / t
    edp = settings.expert_data_parallel_size
    edp_group = Group(edp, place.edp_nodes)
    sharding = shard_groups(settings, cluster.devices_per_node, edp_group)

    nv = p * v
    counts = layers_per_virtual_stage(model.num_layers, settings)
    moe_counts = moe_layers_per_virtual_stage(model, counts) if moe is not None else None
    e = 2 if settings.dtype == "fp8" else DTYPE_BYTES[settings.dtype]
    boundary_bytes = settings.micro_batch_size * model.seq_length * model.hidden_size * e / (t * c)
    send = np.zeros(max(nv - 1, 0))
    if p > 1:
        send[:] = float(comm.time_s("send_recv", boundary_bytes, Group(2, 2 if place.pp_cross_node else 1)))

    # parameters on one rank of each pipeline stage
    vocab_params = model.padded_vocab_size(t) * model.hidden_size / t
    positions = model.seq_length * model.hidden_size if model.position_embedding_type == "learned_absolute" else 0
    chunk_layers = counts.reshape(v, p)  # [chunk, rank]
    rank_params = chunk_layers.sum(axis=0) * layer_params
    # a mixture-of-experts model: per chunk, the non-expert weights (split over t) and
    # the routed experts' (split over EP x ETP)
    chunk_moe = np.zeros((v, p)) if moe_counts is None else moe_counts.reshape(v, p).astype(float)
    chunk_expert_params = np.zeros((v, p))
    if moe is not None:
        experts = model.num_experts * model.expert_params
        chunk_dense_params = ((chunk_layers - chunk_moe) * model.dense_layer_params
                              + chunk_moe * (model.moe_layer_params - experts)) / t
        chunk_expert_params = chunk_moe * experts / (settings.expert_model_parallel_size
                                                     * settings.expert_tensor_parallel)
        rank_params = chunk_dense_params.sum(axis=0)
    expert_rank_params = chunk_expert_params.sum(axis=0)
    rank_params[0] += vocab_params + positions
    head_params = model.norm_params + (vocab_params if (model.untie_embeddings_and_output_weights or p > 1) else 0)
    # the MTP layers (the few norm weights counted as split too); a MoE one's experts over EP x ETP
    mtp_experts = mtp_expert_params(model)
    head_params += (model.mtp_parameters - mtp_experts) / t
    rank_params[p - 1] += head_params
    if mtp_experts:
        chunk_expert_params[v - 1, p - 1] += mtp_experts / (settings.expert_model_parallel_size
                                                           * settings.expert_tensor_parallel)
        expert_rank_params = chunk_expert_params.sum(axis=0)

    sharded = settings.use_distributed_optimizer or settings.zero_stage >= 1
    grad_collective = "reduce_scatter" if sharded else "all_reduce"
    torch_ddp = settings.DDP_impl == "torch"
    reduced_bytes = prec.weight_bytes if torch_ddp else prec.grad_bytes  # torch reduces param.grad
    bucket_params = TORCH_DDP_BUCKET_BYTES / reduced_bytes if torch_ddp else GRAD_BUCKET_PARAMS
    root_params = np.zeros(nv)  # ZeRO-3: the units' gathers (`fsdp_ops`); the per-unit buckets below
    root_params[0] += vocab_params + positions
    root_params[nv - 1] += head_params
    fsdp = fsdp_costs(comm, sharding, model, settings, root_params, prec.weight_bytes)
    syncs = []
    for s in range(p):
        if d == 1 and (moe is None or edp == 1):
            syncs.append(GradSync.none())
            continue
        chunks, fractions, bucket_s = [], [], []
        for c in range(v - 1, -1, -1):  # later chunks finish their backward first
            params = (int(chunk_layers[c, s]) * layer_params if moe is None else
                      float(chunk_dense_params[c, s]))
            if c == 0 and s == 0:
                params += vocab_params + positions
            if c == v - 1 and s == p - 1:
                params += head_params
            # the dense gradients over the data-parallel group, the experts' over theirs
            for total, group, expert in ((params, dp_group, False),
                                         (float(chunk_expert_params[c, s]), edp_group, True)):
                if group.size == 1 or (expert and total == 0):
                    continue
                n_buckets = max(1, math.ceil(total / bucket_params))
                if zero3:  # one bucket per FSDP unit (layer) of the chunk
                    n_buckets = max(1, int(chunk_moe[c, s] if expert else chunk_layers[c, s]))
                over = replace(sharding, shard=edp_group, replicate=Group(1)) if expert else sharding
                one = reduce_bucket_s(comm, grad_collective, total / n_buckets * reduced_bytes, over)
                for k in range(n_buckets):
                    chunks.append(c)
                    bucket_s.append(one)
                    fractions.append((k + 1) / n_buckets)
        syncs.append(GradSync(np.array(bucket_s), np.array(chunks, dtype=np.int64), np.array(fractions)))

    after_comm = np.zeros(p)
    exchange = 0.0
    if sharded and not zero3 and sharding.shard.size > 1 and not settings.overlap_param_gather:
        after_comm += np.array([float(comm.time_s("all_gather", n * prec.weight_bytes, sharding.shard))
                                for n in rank_params])
    if sharded and not zero3 and edp > 1 and moe is not None and not settings.overlap_param_gather:
        after_comm += np.array([float(comm.time_s("all_gather", n * prec.weight_bytes, edp_group))
                                for n in expert_rank_params])
    if not model.untie_embeddings_and_output_weights and p > 1:
        group = Group(2, 2 if place.embedding_cross_node else 1)
        exchange = float(comm.time_s("all_reduce", vocab_params * prec.grad_bytes, group))
        after_comm[0] += exchange
        after_comm[p - 1] += exchange

    shards = settings.optimizer_shards
    full_layer_bytes = 0.0
    if settings.recompute_granularity == "full":
        unrecomputed = replace(settings, recompute_granularity="none")
        full_layer_bytes = layer_work(model, unrecomputed).activation_bytes
        if moe is not None:
            full_layer_bytes = max(full_layer_bytes, moe_layer_work(model, unrecomputed).activation_bytes)
    expert_shards = settings.expert_optimizer_shards
    stage_moe = chunk_moe.sum(axis=0)
    fp8_copies = stage_weight_copy_bytes(layer.forward, moe.forward if moe is not None else None, head.forward,
                                         chunk_layers.sum(axis=0) - stage_moe, stage_moe, settings)
    memory = []
    for s in range(p):
        params = rank_params[s]
        acts = (chunk_layers[:, s] * layer.activation_bytes).astype(float)
        if moe is not None:
            acts += chunk_moe[:, s] * (moe.activation_bytes - layer.activation_bytes)
        experts = expert_rank_params[s]
        if s == 0:
            acts[0] += emb.activation_bytes
        if s == p - 1:
            acts[v - 1] += head.activation_bytes
        root = float(root_params.reshape(v, p)[:, s].sum())  # the stage's embedding / head
        working = full_layer_bytes + fsdp_working_bytes(fsdp, settings, root, params, experts, prec.weight_bytes,
                                                        prec.grad_bytes)
        memory.append(RankMemory(
            weights_bytes=(params * prec.weight_bytes / (shards if zero3 else 1)
                           + experts * prec.weight_bytes / (edp if zero3 else 1) + fp8_copies[s]),
            gradients_bytes=(params * prec.grad_bytes / (shards if settings.zero_stage >= 2 else 1)
                             + experts * prec.grad_bytes / (edp if settings.zero_stage >= 2 else 1)),
            optimizer_bytes=params * prec.optimizer_bytes / shards + experts * prec.optimizer_bytes / expert_shards,
            activation_bytes_per_chunk=acts,
            working_bytes=working,
        ))
    return RunStructure(settings, speed, passes, counts, send, tuple(syncs),
                        rank_params, prec, after_comm, tuple(memory),
                        layer_shape_key(model, settings, cluster.device.name, place.tp_nodes), exchange,
                        attention_mix=attention_mix(model, settings, counts),
                        moe_layers_per_vstage=moe_counts,
                        expert_rank_params=expert_rank_params if moe is not None else None, fsdp=fsdp)


def price(structure: RunStructure, kernel_s: list[np.ndarray], eff: DeviceEfficiency) -> ExecutionModel:
    """The execution model of a structure, with its kernels' device times."""
    st, settings = structure, structure.settings
    p, v = settings.pipeline_model_parallel_size, settings.virtual_pipeline_model_parallel_size
    times = pass_times(st, kernel_s, eff)
    dev, host = times.device_s, times.host_s
    moe_dev = (dev[7], dev[8] + dev[9]) if len(dev) > len(PASSES) else (0.0, 0.0)
    layer_fwd_dev, layer_bwd_dev, moe_fwd_dev, moe_bwd_dev = layer_device_s(  # ZeRO-3: beside the gathers
        st.fsdp, (dev[0], dev[1] + dev[2]), moe_dev, eff.comm_overlap_contention)
    counts = st.layers_per_vstage.astype(float)
    # per virtual stage and micro-batch: device time and host time of its forward and backward op
    # (a mixture-of-experts model: its dense layers here, its MoE layers added below)
    moe = st.moe_layers_per_vstage is not None
    if moe:
        moe_counts = st.moe_counts
        counts = counts - moe_counts
    fwd_dev = counts * layer_fwd_dev
    bwd_dev = counts * layer_bwd_dev
    if st.attention_mix is not None:
        factor = eff.layer_time_factors.factor(st.layer_key)
        fwd_added, bwd_added = st.attention_mix.added_s(st.speed, eff)
        fwd_dev += factor * fwd_added
        bwd_dev += factor * bwd_added
    fwd_host = counts * host[0] + eff.host_microbatch_s
    bwd_host = counts * (host[1] + host[2]) + eff.host_microbatch_s
    if moe:
        fwd_dev += moe_counts * moe_fwd_dev
        bwd_dev += moe_counts * moe_bwd_dev
        fwd_host += moe_counts * host[7]
        bwd_host += moe_counts * (host[8] + host[9])
    if st.fsdp is not None:
        exposed_fwd, exposed_bwd = st.fsdp.exposed_s(counts, st.moe_counts)
        fwd_dev += exposed_fwd
        bwd_dev += exposed_bwd
    fwd_dev[0] += dev[3]
    bwd_dev[0] += dev[4]
    fwd_host[0] += host[3]
    bwd_host[0] += host[4]
    fwd_dev[-1] += dev[5]
    bwd_dev[-1] += dev[6]
    fwd_host[-1] += host[5]
    bwd_host[-1] += host[6]
    fwd = host_bound_s(fwd_dev, fwd_host, eff)
    bwd = host_bound_s(bwd_dev, bwd_host, eff)
    if settings.pipeline_schedule == "zb_h1":
        wgt = counts * times.layer_weight_grad_s
        if moe:
            wgt += moe_counts * times.moe_layer_weight_grad_s
        wgt[-1] += times.head_weight_grad_s
        bwd = bwd - wgt
    else:
        wgt = np.zeros(counts.shape[0])
    costs = PipelineCosts(fwd, bwd, wgt, st.send_s, st.send_s.copy())
    opt_bytes = st.optimizer_params() * st.precision.optimizer_step_bytes
    after = st.after_sync_comm_s + np.array([memory_time_s(b, st.speed, eff, OPTIMIZER_KERNELS) for b in opt_bytes])
    return ExecutionModel(
        schedule=settings.pipeline_schedule,
        pipeline_stages=p,
        virtual_stages=v,
        microbatches=settings.num_microbatches,
        costs=costs,
        grad_sync=st.grad_sync,
        overlap_grad_reduce=(settings.overlap_grad_reduce or settings.zero_stage >= 2
                             or settings.DDP_impl == "torch"),
        after_sync_s=after,
        memory=st.memory,
        samples_per_iteration=settings.global_batch_size,
        num_devices=settings.num_gpus,
    )


def build_execution(model: TransformerModel, settings: RunSettings, cluster: Cluster, comm: CommModel,
                    efficiency: DeviceEfficiency) -> ExecutionModel:
    """The execution model of one iteration of `settings` running `model` on `cluster`."""
    structure = run_structure(model, settings, cluster, comm)
    return price(structure, kernel_times_by_pass([structure], efficiency)[0], efficiency)
