"""Where a transformer run's ranks sit and what they hold per parameter: the node spans
of the groups one rank belongs to (`placement`), the groups its collectives run over
(`RunGroups`) and the bytes per parameter of each kind of state (`Precision`).

Placement follows Megatron-Core's rank order tp-cp-dp-pp (tensor-parallel ranks
adjacent, then context-parallel, then data-parallel, then pipeline): rank = tp + t (cp
+ c (dp + d pp)), node = rank // devices_per_node. Each group's node span decides the
link tier its collectives use.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from paraplan.core.comm import Group
from paraplan.core.run_settings import DEFAULT_FP8_RECIPE, FSDP_PARAM_BYTES, RunSettings, main_grad_bytes
from paraplan.predict.cp_ops import CP_GROUP, CP_RING
from paraplan.predict.optimizer_precision import precision_aware_bytes
from paraplan.sim.builder.placement import strided_group_nodes


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each kind of state (Megatron-LM's mixed precision)."""

    weight_bytes: int  # as gathered and communicated
    grad_bytes: int  # as reduced
    optimizer_bytes: int  # main weights, main gradients (fp16), Adam moments
    optimizer_step_bytes: int  # memory traffic of one optimizer step per parameter
    kept_bytes: tuple[int, int, int] | None = None
    """Weights, gradients and optimizer state as kept, where they differ from the three
    above: FSDP2's shards (`of_settings`); None: those three."""

    @property
    def state_bytes(self) -> tuple[int, int, int]:
        """Bytes per parameter kept of weights, gradients and optimizer state."""
        return self.kept_bytes or (self.weight_bytes, self.grad_bytes, self.optimizer_bytes)

    @staticmethod
    def of(dtype: str, grad_reduce_in_bf16: bool = False) -> Precision:
        """bf16/fp8: 2-byte weights, fp32 gradients, 12 bytes of optimizer state (18 in
        all); with `grad_reduce_in_bf16` 2-byte gradients and, as for fp16, the fp32 copy
        of the optimizer's gradient shard (2 + 2 + 16 = 20; the copy is sharded with the
        optimizer, so 4 + 16 / shards per parameter); fp16: 2-byte gradients plus an fp32
        copy in the optimizer (20); fp32: 16.
        A step (Megatron-LM's `Float16OptimizerWithFloat16Params.step` at 6985e589 and
        d898a899, core_r0.8.0's alike, with apex's and torch's multi-tensor kernels) reads
        the gradient, reads and writes main weights and both moments (apex
        `multi_tensor_adam`, 4 + 24), copies the main weights to the
        model's (`multi_tensor_scale`: reads 4, writes 2), reads the gradients for the
        norm (`multi_tensor_l2norm`, 4) and zeroes the gradient buffer; 16-bit gradients
        are first copied to fp32 (`.float()`: 2 + 4), and fp16 unscales them and checks
        for overflow in place (`_amp_foreach_non_finite_check_and_unscale_`: 4 + 4)."""
        if dtype == "fp32":
            return Precision(4, 4, 8, 4 + 24 + 4 + 4)
        if dtype == "fp16":
            return Precision(2, 2, 16, 4 + 24 + (4 + 2) + (2 + 4) + 4 + (4 + 4) + 2)
        if grad_reduce_in_bf16:  # the fp16 path without its overflow check
            return Precision(2, 2, 16, 4 + 24 + (4 + 2) + (2 + 4) + 4 + 2)
        return Precision(2, 4, 12, 4 + 24 + (4 + 2) + 4 + 4)

    @staticmethod
    def of_settings(settings: RunSettings) -> Precision:
        """A run's: `of` its dtype and gradient dtype, the optimizer's shard and step as
        the precision-aware optimizer sets them (`optimizer_precision`) when it is on.
        With FSDP2 (`use_torch_fsdp2`) the sharded parameters are the optimizer's own, in
        `fsdp_param_dtype` (k bytes), and so are their gradients and torch.optim's two
        moments: k + k + 2k kept (16 for fp32, 8 for bf16; no 16-bit copy besides the
        gathered one), while gathers still move the 16-bit weights and reduce-scatters the
        reduce dtype."""
        base = Precision.of(settings.dtype, settings.grad_reduce_in_bf16 or settings.main_grads_dtype == "bf16")
        if settings.use_torch_fsdp2:
            kept = FSDP_PARAM_BYTES[settings.fsdp_param_dtype]
            return replace(base, kept_bytes=(kept, kept, 2 * kept))
        if not settings.use_precision_aware_optimizer:
            return base
        grad_bytes = main_grad_bytes(settings)
        state, step = precision_aware_bytes(settings, settings.dtype, settings.fp8_recipe or DEFAULT_FP8_RECIPE,
                                            grad_bytes)
        return Precision(base.weight_bytes, grad_bytes, state, step)


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
    tp_cp_nodes: int = 1  # v6-router: the router's tensor x context-parallel group
    tp_dp_cp_nodes: int = 1  # v6-router: tensor x data x context parallel (a pipeline stage's ranks)


def placement(settings: RunSettings, devices_per_node: int) -> Placement:
    """Spans in the rank order tp-cp-dp-pp: the CP group and the dp-cp group are every
    t-th rank (c and d x c of them), a pipeline neighbour t c d ranks away."""
    t, d, p = (settings.tensor_model_parallel_size, settings.data_parallel_size,
               settings.pipeline_model_parallel_size)
    c = settings.context_parallel_size
    g = devices_per_node
    tp_nodes = strided_group_nodes(t, 1, g)
    cp_nodes = strided_group_nodes(c, t, g)
    dp_nodes = strided_group_nodes(d * c, t, g)
    pp_cross = p > 1 and (t * c * d) // g != 0
    emb_cross = p > 1 and (t * c * d * (p - 1)) // g != 0
    # the expert grid over the same ranks: expert-tensor rank fastest, then EP, then expert-DP
    etp, ep = settings.expert_tensor_parallel, settings.expert_model_parallel_size
    etp_nodes = strided_group_nodes(etp, 1, g)
    ep_nodes = strided_group_nodes(ep, etp, g)
    edp_nodes = strided_group_nodes(settings.expert_data_parallel_size, etp * ep, g)
    return Placement(tp_nodes, dp_nodes, pp_cross, emb_cross, cp_nodes, etp_nodes, ep_nodes, edp_nodes,
                     strided_group_nodes(t * c, 1, g), strided_group_nodes(t * c * d, 1, g))


def context_parallel_groups(settings: RunSettings, place: Placement) -> dict[str, Group]:
    """The groups a pass's context-parallel collectives run over (`cp_ops`): the CP
    group, and one hop of its ring (across nodes when the group spans several)."""
    c = settings.context_parallel_size
    return {CP_GROUP: Group(c, place.cp_nodes), CP_RING: Group(2 if c > 1 else 1, 2 if place.cp_nodes > 1 else 1)}


def expert_parallel_groups(settings: RunSettings, place: Placement) -> dict[str, Group]:
    """The groups a MoE layer's collectives run over (`moe_ops`): expert-parallel
    (the token all-to-alls), expert-tensor-parallel, and the router's (`moe_router`)."""
    tp_cp = settings.tensor_model_parallel_size * settings.context_parallel_size
    return {"ep": Group(settings.expert_model_parallel_size, place.ep_nodes),
            "etp": Group(settings.expert_tensor_parallel, place.etp_nodes),
            # v6-router: the router's token-count all-reduces (`moe_router`)
            "tp_cp": Group(tp_cp, place.tp_cp_nodes),
            "tp_dp_cp": Group(tp_cp * settings.data_parallel_size, place.tp_dp_cp_nodes)}


@dataclass(frozen=True)
class RunGroups:
    """The groups one rank's collectives run over, with their node spans."""

    tp: Group
    dp: Group  # the ranks that hold the same weights: data x context parallel (Megatron's dp-cp)
    edp: Group  # expert-data-parallel: the ranks that hold the same experts
    embedding_pair: Group  # the first and last pipeline stage (the tied embedding)
    by_name: dict[str, Group]  # the context- and expert-parallel ones, by `Collective.group`

    @staticmethod
    def of(settings: RunSettings, place: Placement) -> RunGroups:
        return RunGroups(
            tp=Group(settings.tensor_model_parallel_size, place.tp_nodes),
            dp=Group(settings.data_context_parallel_size, place.dp_nodes),
            edp=Group(settings.expert_data_parallel_size, place.edp_nodes),
            embedding_pair=Group(2, 2 if place.embedding_cross_node else 1),
            by_name={**context_parallel_groups(settings, place), **expert_parallel_groups(settings, place)},
        )
