"""Sharded data parallelism in the execution model: the groups the sharded state is
split and replicated over (`paraplan.core.sharding`), ZeRO-3 / FSDP2's per-unit
weight all-gathers with prefetch, the gradient reduction of a sharded run, and the
bytes one rank holds.

ZeRO-3 as PyTorch FSDP2 runs it: every transformer layer is one FSDP unit (torchtitan
wraps each block), its weights sharded over the sharding group. Before a unit's
forward its weights are all-gathered; FSDP2 issues the next unit's all-gather while
the current unit computes (implicit prefetch), so a layer of forward compute g beside
the next layer's gather of time a takes

    pair(a, g) = max(a, g) + contention x min(a, g)

(the rule `PassCost.comm_s` applies to an overlapped tensor-parallel collective, with
the occupancy share of the sharding group's NCCL CTAs on the device's SMs,
`paraplan.predict.overlap_share`), and the
first unit's gather of each model chunk has nothing to hide behind (`exposed`). The
backward gathers each unit again unless the weights were kept after the forward
(`fsdp_reshard_after_forward`), likewise prefetched. Under pipeline parallelism with
the weights kept, PyTorch's pipeline stages keep them from the first micro-batch's
forward to the last one's backward (`paraplan.core.sharding.gathers_once_per_iteration`):
the stage's weights are gathered once per iteration, priced as the distributed
optimizer's parameter all-gather (after the step, hidden with `overlap_param_gather`).

Sharded gradients (ZeRO-2 and 3) are reduce-scattered in the reduce dtype (fp32
gradients) at one of two moments (`paraplan.core.sharding.reduces_every_microbatch`):
after the last micro-batch only (unit by unit as its backward produces them, one
bucket per unit with ZeRO-3, Megatron's 40M-parameter buckets with ZeRO-2, overlapped
with that backward by the engine's gradient-reduction stream, as `overlap_grad_reduce`;
with hybrid sharding all-reduced over the R replicas of each shard after), or after
every micro-batch: then each layer's reduce-scatter s runs beside the next layer's
backward as a gather runs beside a forward, pair(s + a, g_b) per layer (a: the
backward's gather, if any), and the chunk's last layer's (and root unit's)
reduce-scatter has nothing to hide behind.

With `use_torch_fsdp2` (PyTorch FSDP2 as torchtitan runs it) each gather also copies the
fp32 shard in and the gathered weights out, each unit's gradients are copied into the fp32
reduce-scatter input, the root unit stays gathered from its forward to its backward and is
reduce-scattered after it, and torchtitan keeps the last block (`paraplan.predict.fsdp2_passes`).

A mixture-of-experts layer's routed experts are sharded over the expert-data-parallel
group (the ranks that hold the same experts): their gather, reduce-scatter and
sharded state use that group; its other weights the sharding group.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.core.comm import CommModel, Group
from paraplan.core.run_settings import FSDP_PARAM_BYTES, RunSettings
from paraplan.core.sharding import (
    expert_sharding_group_size,
    gathers_once_per_iteration,
    reduces_every_microbatch,
    replicate_degree,
    reshards_after_forward,
    sharding_group_size,
)
from paraplan.core.transformer import TransformerModel
from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed
from paraplan.predict.fsdp2_passes import Fsdp2Passes, copy_in_bytes_per_element, grad_bytes_per_element
from paraplan.sim.builder.placement import strided_group_nodes


@dataclass(frozen=True)
class ShardGroups:
    """The groups of one rank's sharded state: `shard` splits it, `replicate` holds the
    copies of one shard (size 1 without hybrid sharding), `expert` splits the routed
    experts' state (the expert-data-parallel group, or with hybrid sharding its EDP / R
    consecutive members) and `expert_replicate` holds the copies of an expert shard."""

    shard: Group
    replicate: Group
    expert: Group
    expert_replicate: Group


def shard_groups(settings: RunSettings, devices_per_node: int) -> ShardGroups:
    """In Megatron-Core's rank order tp-cp-dp-pp the d x c ranks holding the same weights
    are every t-th rank; the sharding group is d c / R consecutive ones of them (as
    torchtitan's mesh puts dp_shard inside dp_replicate and Megatron its optimizer
    instances), the R replicas of a shard are d c / R of them apart. The experts' likewise
    in the expert grid (etp-ep-edp-pp: the EDP ranks holding the same experts are every
    EP x ETP-th rank): EDP / R consecutive ones of them, the R replicas EDP / R of them apart."""
    t, g = settings.tensor_model_parallel_size, devices_per_node
    size, r = sharding_group_size(settings), replicate_degree(settings)
    shard = Group(size, strided_group_nodes(size, t, g))
    replicate = Group(r, strided_group_nodes(r, t * size, g))
    stride = settings.expert_model_parallel_size * settings.expert_tensor_parallel
    expert_size = expert_sharding_group_size(settings)
    return ShardGroups(shard, replicate, Group(expert_size, strided_group_nodes(expert_size, stride, g)),
                       Group(r, strided_group_nodes(r, stride * expert_size, g)))


def reduce_bucket_s(comm: CommModel, collective: str, nbytes: float, groups: ShardGroups) -> float:
    """One gradient bucket of `nbytes`: `collective` over the sharding group (all-reduce
    without sharded state, reduce-scatter with it), then with hybrid sharding the
    all-reduce of this rank's 1 / shard of it over the replicas."""
    shard, replicate = groups.shard, groups.replicate
    seconds = float(comm.time_s(collective, nbytes, shard)) if shard.size > 1 else 0.0
    if replicate.size > 1:
        part = nbytes / shard.size if collective == "reduce_scatter" else nbytes
        seconds += float(comm.time_s("all_reduce", part, replicate))
    return seconds


def paired_s(comm_s: float | np.ndarray, compute_s: float | np.ndarray, contention: float | np.ndarray) -> np.ndarray:
    """A collective of `comm_s` beside compute of `compute_s`: max + contention x min."""
    c, g = np.asarray(comm_s, dtype=float), np.asarray(compute_s, dtype=float)
    return np.maximum(c, g) + contention * np.minimum(c, g)


@dataclass(frozen=True)
class FsdpCosts:
    """ZeRO-3's weight gathers per FSDP unit (one transformer layer), on one rank, and
    the reduce-scatters of sharded gradients reduced after every micro-batch (ZeRO-2
    and 3); a ZeRO-2 run's gathers are zero (its weights are whole)."""

    layer_gather_s: float  # a dense layer's weights over the sharding group
    moe_layer_gather_s: float  # a MoE layer's: its dense part over the sharding group, its experts over theirs
    root_gather_s: np.ndarray  # per virtual stage: the embedding / head weights it holds (torchtitan's root unit)
    reshard_after_forward: bool
    unit_params: float = 0.0  # one rank's sharded parameters of its largest layer unit (dense, or MoE with experts)
    shard_ranks: int = 1  # the sharding group's size (1: the dense weights are whole on every rank)
    expert_ranks: int = 1  # the expert-data-parallel group's size (1: the experts are whole on every rank)
    layer_scatter_s: float = 0.0  # every micro-batch: a dense layer's gradients reduce-scattered (0: after the last)
    root_scatter_s: np.ndarray | None = None  # every micro-batch: per virtual stage, the root unit's
    gathers: bool = True  # ZeRO-3: weights sharded and gathered (False: ZeRO-2)
    layer_weight_bytes: float = 0.0  # bytes of a gathered layer parameter, 0: the weights' (torchao float8: 1)
    fsdp2: Fsdp2Passes | None = None  # use_torch_fsdp2: FSDP2's own passes (`fsdp2_passes`)

    # -- u3-fsdp2
    def priced(self, speed: DeviceSpeed, eff: DeviceEfficiency) -> FsdpCosts:
        """With FSDP2's passes, each gather as it runs beside compute: its copy-in on the
        copy-in stream, then its all-gather (`fsdp2_passes`); as is without."""
        if self.fsdp2 is None or not self.gathers:
            return self
        dense, moe, root = self.fsdp2.copy_in_s(speed, eff)
        return replace(self, layer_gather_s=self.layer_gather_s + (dense if self.layer_gather_s else 0.0),
                       moe_layer_gather_s=self.moe_layer_gather_s + (moe if self.moe_layer_gather_s else 0.0),
                       root_gather_s=self.root_gather_s + np.where(self.root_gather_s > 0, root, 0.0))

    def fsdp2_stage_s(self, dense_layers: np.ndarray, moe_layers: np.ndarray, speed: DeviceSpeed,
                      eff: DeviceEfficiency) -> tuple[np.ndarray, np.ndarray]:
        """Per virtual stage and micro-batch: FSDP2's compute-stream passes (copy-outs,
        gradient copies: `Fsdp2Passes.stage_s`); zeros without FSDP2."""
        if self.fsdp2 is None:
            zeros = np.zeros(len(dense_layers))
            return zeros, zeros
        return self.fsdp2.stage_s(dense_layers, moe_layers, self.reshard_after_forward, speed, eff)
    # -- end u3-fsdp2

    def forward_layer_s(self, compute_s: float, contention: float, moe: bool = False) -> float:
        """One layer's forward beside the next layer's gather (`pair`)."""
        return float(paired_s(self.moe_layer_gather_s if moe else self.layer_gather_s, compute_s, contention))

    def backward_layer_s(self, compute_s: float, contention: float, moe: bool = False) -> float:
        """One layer's backward (recomputation included) beside the next layer's gather
        when the weights were resharded after the forward; else the compute alone."""
        gather = self.moe_layer_gather_s if moe else self.layer_gather_s
        comm = (gather if self.reshard_after_forward else 0.0) + self.layer_scatter_s
        if comm == 0.0:
            return compute_s
        return float(paired_s(comm, compute_s, contention))

    def exposed_s(self, dense_layers: np.ndarray, moe_layers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per virtual stage, what no compute hides in its forward and its backward: the
        first unit's gather (and the root unit's, where the stage holds the embedding
        or the head). A chunk starting with a MoE layer waits for that layer's gather."""
        first = np.where(dense_layers > 0, self.layer_gather_s, 0.0)
        first = np.where((dense_layers == 0) & (moe_layers > 0), self.moe_layer_gather_s, first)
        forward = first + self.root_gather_s
        backward = forward.copy() if self.reshard_after_forward else np.zeros_like(forward)
        if self.fsdp2 is not None and self.reshard_after_forward:  # u3-fsdp2: the root unit is kept to its
            backward -= self.root_gather_s  # backward; torchtitan keeps the last block (`fsdp2_passes`)
            if self.fsdp2.last_unit_kept:
                backward[-1] -= first[-1]
        if self.root_scatter_s is not None:  # the chunk's last reduce-scatter, and the root unit's
            backward += np.where(dense_layers > 0, self.layer_scatter_s, 0.0) + self.root_scatter_s
        return forward, backward


def fsdp_costs(comm: CommModel, groups: ShardGroups, model: TransformerModel, settings: RunSettings,
               root_params: np.ndarray, weight_bytes: int, grad_bytes: int, layer_weight_bytes: float = 0.0,
               layer_gather_extra_s: float = 0.0) -> FsdpCosts | None:
    """The gathers of a zero_stage 3 run, of one rank's unit parameters (after tensor /
    expert parallelism) in the weights' dtype: a dense layer, a MoE layer's non-expert
    part over the sharding group and its experts over the expert-data-parallel group,
    and the root unit's `root_params` per virtual stage; with gradients reduced after
    every micro-batch (ZeRO-2 or 3), a dense layer's and each root unit's reduce-scatter
    in `grad_bytes`. None for the other runs (ZeRO-0/1, ZeRO-2 reduced once).
    torchao's float8 all-gather (`paraplan.predict.torchao_fp8`): a dense layer's unit
    gathered in `layer_weight_bytes`, after `layer_gather_extra_s` (its amax all-reduces)."""
    every = reduces_every_microbatch(settings)
    if settings.zero_stage != 3 and not every:
        return None
    t = settings.tensor_model_parallel_size
    shard, expert = groups.shard, groups.expert

    def gather(params: float, group: Group) -> float:
        return float(comm.time_s("all_gather", params * weight_bytes, group)) if group.size > 1 and params else 0.0

    def scatter(params: float) -> float:
        return float(comm.time_s("reduce_scatter", params * grad_bytes, shard)) if shard.size > 1 and params else 0.0

    dense = (model.dense_layer_params if model.is_moe else model.layer_params) / t
    moe_dense = moe_experts = 0.0
    if model.num_moe_layers:
        experts = model.num_experts * model.expert_params
        moe_dense = (model.moe_layer_params - experts) / t
        moe_experts = experts / (settings.expert_model_parallel_size * settings.expert_tensor_parallel)
    # what a unit gathers: only the parts sharded over more than one rank
    on_shard, on_expert = float(shard.size > 1), float(expert.size > 1)
    has_dense = model.num_layers > model.num_moe_layers
    unit = max(dense * on_shard * has_dense, moe_dense * on_shard + moe_experts * on_expert)
    root_scatter = np.array([scatter(float(p)) for p in root_params]) if every else None
    if settings.zero_stage != 3:  # ZeRO-2: whole weights, only the reduce-scatters (a dense model: check_sharding)
        zeros = np.zeros(len(root_params))
        return FsdpCosts(0.0, 0.0, zeros, False, unit, shard.size, expert.size, scatter(dense), root_scatter, False)
    fsdp2 = (fsdp2_passes(comm, groups, model, settings, root_params, (dense, moe_dense, moe_experts),
                          (weight_bytes, layer_weight_bytes or weight_bytes, grad_bytes))
             if settings.use_torch_fsdp2 else None)  # u3-fsdp2
    if gathers_once_per_iteration(settings):  # gathered before the first forward (`rank_state.after_sync_comm_s`)
        return FsdpCosts(0.0, 0.0, np.zeros(len(root_params)), False, unit, shard.size, expert.size, fsdp2=fsdp2)
    roots = np.array([gather(float(p), shard) for p in root_params])
    layer_gather = (float(comm.time_s("all_gather", dense * layer_weight_bytes, shard)) + layer_gather_extra_s
                    if layer_weight_bytes and shard.size > 1 else gather(dense, shard))  # torchao float8 all-gather
    return FsdpCosts(layer_gather, gather(moe_dense, shard) + gather(moe_experts, expert), roots,
                     reshards_after_forward(settings), unit, shard.size, expert.size,
                     scatter(dense) if every else 0.0, root_scatter, layer_weight_bytes=layer_weight_bytes,
                     fsdp2=fsdp2)


# -- u3-fsdp2
def fsdp2_passes(comm: CommModel, groups: ShardGroups, model: TransformerModel, settings: RunSettings,
                 root_params: np.ndarray, units: tuple[float, float, float],
                 dtype_bytes: tuple[int, float, int]) -> Fsdp2Passes:
    """FSDP2's passes (`fsdp2_passes` module doc) of a zero_stage 3 run on one rank:
    `units` the rank's parameters of a dense unit, a MoE unit's non-expert part and its
    experts; `dtype_bytes` the root's and a layer's gathered bytes per element and the
    reduce dtype's. Only parts sharded over more than one rank are gathered and copied;
    the 16-bit gradients are the root's gathered dtype."""
    shard, expert = groups.shard, groups.expert
    root_w, layer_w, reduce_bytes = dtype_bytes
    dense, moe_dense, moe_experts = units
    on_shard, on_expert = float(shard.size > 1), float(expert.size > 1)
    every = reduces_every_microbatch(settings)
    kept = FSDP_PARAM_BYTES[settings.fsdp_param_dtype]  # the shards' dtype
    grad = grad_bytes_per_element(root_w, reduce_bytes, settings.num_microbatches, every)
    per_iteration = grad * (1 if every else settings.num_microbatches)  # the root's, once after the backward
    root = np.asarray(root_params, dtype=float) * on_shard
    moe_full = moe_dense * on_shard + moe_experts * on_expert
    moe_shard = (moe_dense * on_shard / shard.size + moe_experts * on_expert / expert.size)
    p = settings.pipeline_model_parallel_size
    after = np.zeros(p)
    if not every:  # the root units' reduce-scatters follow the stage's backward (`_root_post_backward_final_callback`)
        for k, n in enumerate(root):
            after[k % p] += reduce_bucket_s(comm, "reduce_scatter", n * reduce_bytes, groups) if n else 0.0
    norm = Group(shard.size * groups.replicate.size, shard.nodes * groups.replicate.nodes)
    if settings.optimizer_impl == "foreach" and norm.size > 1:  # torch's clip_grad_norm_: the DTensor norm's
        after += float(comm.time_s("all_reduce", 4, norm))  # all-reduce over the data-parallel mesh
    return Fsdp2Passes(
        layer_copy_in_bytes=copy_in_bytes_per_element(layer_w, kept) * dense * on_shard / shard.size,
        layer_copy_out_bytes=2 * layer_w * dense * on_shard,
        layer_grad_bytes=grad * dense * on_shard,
        moe_copy_in_bytes=copy_in_bytes_per_element(root_w, kept) * moe_shard,
        moe_copy_out_bytes=2 * root_w * moe_full,
        moe_grad_bytes=grad * moe_full,
        root_copy_in_bytes=copy_in_bytes_per_element(root_w, kept) * root / shard.size,
        root_copy_out_bytes=2 * root_w * root,
        root_grad_bytes=per_iteration * root,
        after_backward_comm_s=after,
        root_after_backward=not every,
        last_unit_kept=p == 1 and settings.fsdp_reshard_after_forward == "default",
        last_unit_moe=bool(model.moe_layers[-1]),
        gathers_per_layer=not gathers_once_per_iteration(settings),
        pipeline_stages=p,
    )
# -- end u3-fsdp2


def layer_device_s(fsdp: FsdpCosts | None, dense_s: tuple[float, float], moe_s: tuple[float, float],
                   contention: float) -> tuple[float, float, float, float]:
    """Device time of one dense and one MoE layer, forward and backward (recomputation
    included), with ZeRO-3's gathers beside them (`FsdpCosts`); as given without."""
    if fsdp is None:
        return dense_s[0], dense_s[1], moe_s[0], moe_s[1]
    return (fsdp.forward_layer_s(dense_s[0], contention), fsdp.backward_layer_s(dense_s[1], contention),
            fsdp.forward_layer_s(moe_s[0], contention, moe=True), fsdp.backward_layer_s(moe_s[1], contention, moe=True))


def fsdp_working_bytes(fsdp: FsdpCosts | None, settings: RunSettings, root_params: float, dense_params: float,
                       expert_params: float, weight_bytes: int, grad_bytes: int) -> float:
    """Transient bytes of ZeRO-3 on top of the sharded state, on a stage whose sharded
    parameters are P (its dense ones if the sharding group has more than one rank, plus
    its experts if theirs has), whose largest layer unit has u sharded parameters
    (`FsdpCosts.unit_params`) and whose root unit (embedding / head, gathered for the
    whole pass: torchtitan's root FSDP module) has r. Weights: resharding after the
    forward, the root and two layer units gathered (the one computing and the one
    prefetched), (r + 2 u) w; keeping the weights to the backward, the whole stage, P w.
    Gradients (`unsharded_grad_params`), unless they accumulate over the micro-batches
    (`accumulates_unsharded`: held per chunk from its first backward instead). A ZeRO-2
    run gathers no weights. Other runs (`fsdp` None): 0."""
    if fsdp is None:
        return 0.0
    unit = fsdp.unit_params
    root = root_params if fsdp.shard_ranks > 1 else 0.0
    stage = dense_params * (fsdp.shard_ranks > 1) + expert_params * (fsdp.expert_ranks > 1)
    held = 0.0 if accumulates_unsharded(settings) else unsharded_grad_params(settings, unit, root, stage)
    layer_bytes = fsdp.layer_weight_bytes or weight_bytes  # torchao's float8 all-gather: 1
    weights = ((root * weight_bytes + 2 * unit * layer_bytes) if reshards_after_forward(settings)
               else root * weight_bytes + (stage - root) * layer_bytes) if fsdp.gathers else 0.0
    return weights + held * grad_bytes


def accumulates_unsharded(settings: RunSettings) -> bool:
    """Whether a ZeRO-2/3 rank accumulates its stage's unsharded gradients over several
    micro-batches (reduced after the last). Autograd allocates them (FSDP's unsharded
    gradients, not a persistent buffer like Megatron's `main_grad`) when each model
    chunk's first backward produces them, so they join the activations only from then
    on (`RankMemory.lazy_gradient_bytes_per_chunk`)."""
    return settings.zero_stage >= 2 and settings.num_microbatches > 1 and not reduces_every_microbatch(settings)


def unsharded_grad_params(settings: RunSettings, unit: float, root: float, stage: float) -> float:
    """Gradient parameters a ZeRO-2/3 rank holds unsharded on top of its fp32 shard, on
    a stage of `stage` sharded parameters whose largest unit has `unit` and root unit
    `root`: with one micro-batch, each unit's until its reduce-scatter, max(u, r); with
    several reduced once after the last, the whole stage's accumulating, P; reduced
    after every micro-batch, the unit being reduce-scattered (at most the larger of u and
    r) and the layer the backward produces beside it, max(u, r) + u (Megatron-FSDP
    allocates each bucket's unsharded gradient for its reduce-scatter and frees it
    after)."""
    if settings.num_microbatches == 1:
        return max(unit, root)
    if reduces_every_microbatch(settings):
        return max(unit, root) + unit
    return stage
