"""The sizes of one mixture-of-experts block on one rank for one micro-batch (`MoeShape`,
built by `moe_shape`): the tokens this rank routes, the local experts and the tokens the
busiest rank's experts take (the EP group's load imbalance, capped or padded by the
capacity factor: `load_factor`), the experts' widths per expert-tensor-parallel rank,
the shared experts' widths per tensor-parallel rank, and the all-to-all volumes; and the
router's sizes (`router_shape`). `paraplan.predict.moe_ops` prices the block at these
sizes (its module doc says how the dispatchers and experts run).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.layer_shape import _shape
from paraplan.predict.moe_deepep import ranks_hit
from paraplan.predict.moe_router import RouterShape
from paraplan.predict.ops import FP32_BYTES


@dataclass(frozen=True)
class MoeShape:
    """The sizes of one MoE block on one rank."""

    routed_tokens: float  # T
    topk: int
    experts: int
    local_experts: float  # E / EP
    expert_tokens: float  # tokens the busiest rank's local experts process together
    expert_ffn: float  # one expert's width per ETP rank
    expert_in: float  # its first projection's output width per ETP rank (2x with a gate)
    shared_ffn: float  # shared experts' width per TP rank
    shared_in: float
    ep: int
    etp: int
    gathered: bool  # tokens all-gathered over the ETP group after the dispatch
    a2a_bytes: float  # dispatch (and combine) all-to-all, per rank (nccl-tests' per-rank total)
    hidden_bytes: float = 1.0  # one token's bytes (h x e): a2a_bytes / hidden_bytes tokens are sent
    received_tokens: float = 0.0  # flex (DeepEP): distinct tokens a rank receives (one per token per rank)
    router_groups: tuple[int, int] = (1, 1)  # group-limited routing: (groups, groups per token)

    @property
    def probs_a2a_bytes(self) -> float:
        """The routing probabilities' all-to-all beside the tokens': one fp32 per dispatched token."""
        return self.a2a_bytes / (self.hidden_bytes) * FP32_BYTES

    @property
    def ranks(self) -> int:
        """Ranks each local expert receives tokens from: EP (x ETP when gathered)."""
        return self.ep * (self.etp if self.gathered else 1)

    @property
    def tokens_per_expert(self) -> float:
        """m of each expert's GEMMs: T k EP (ETP) / E x the load factor."""
        return self.expert_tokens / self.local_experts


def load_factor(settings: RunSettings) -> float:
    """Tokens the busiest rank's experts take over the even share T k EP / E: the load
    imbalance across the EP group (1 without EP: one rank holds every expert), capped
    by the capacity factor where tokens are dropped, the capacity factor itself where
    inputs are padded to capacity."""
    factor = float(settings.moe_load_imbalance) if settings.expert_model_parallel_size > 1 else 1.0
    capacity = float(settings.moe_expert_capacity_factor)
    if capacity:
        factor = capacity if settings.moe_pad_expert_input_to_capacity else min(factor, capacity)
    return factor


def moe_shape(model: TransformerModel, settings: RunSettings) -> MoeShape:
    """The MoE block's sizes (module doc)."""
    x = _shape(model, settings)
    t, ep, etp = settings.tensor_model_parallel_size, settings.expert_model_parallel_size, \
        settings.expert_tensor_parallel
    replicated = t > 1 and not x.sp
    routed = x.tokens if replicated else x.sp_tokens
    k = model.moe_router_topk
    gathered = etp > 1 and not replicated
    dispatched = routed * k * load_factor(settings)
    gate = 2 if model.gated_mlp else 1
    shared = model.moe_shared_expert_intermediate_size / t
    return MoeShape(
        routed_tokens=routed, topk=k, experts=model.num_experts, local_experts=model.num_experts / ep,
        expert_tokens=dispatched * (etp if gathered else 1), expert_ffn=model.moe_ffn_size / etp,
        expert_in=gate * model.moe_ffn_size / etp, shared_ffn=shared, shared_in=gate * shared, ep=ep, etp=etp,
        gathered=gathered, a2a_bytes=dispatched * x.h * x.e, hidden_bytes=x.h * x.e,
        received_tokens=routed * load_factor(settings) * (
            ranks_hit(model.num_experts, k, ep, *model.router_groups) if ep > 1 else 1.0),
        router_groups=model.router_groups)


def router_shape(model: TransformerModel, settings: RunSettings, m: MoeShape) -> RouterShape:
    """The router's sizes (`paraplan.predict.moe_router`)."""
    tp_cp = settings.tensor_model_parallel_size * settings.context_parallel_size
    return RouterShape(m.routed_tokens, m.experts, m.topk, model.hidden_size, m.router_groups, tp_cp,
                       tp_cp * settings.data_parallel_size, model.add_bias_linear,
                       settings.moe_expert_capacity_factor, settings.moe_pad_expert_input_to_capacity)
