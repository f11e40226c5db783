"""What one mixture-of-experts layer runs on one rank for one micro-batch: the
attention half of `paraplan.predict.ops` followed by Megatron-Core's MoE block with
the all-to-all token dispatcher (`moe_token_dispatcher_type alltoall`; the allgather
and flex dispatchers are not modelled).

Forward of the MoE block (T tokens routed by this rank, k = `moe_router_topk`, E
experts, EP / ETP the expert-parallel / expert-tensor-parallel sizes):

- the pre-MLP norm; the shared experts, a dense MLP of
  `moe_shared_expert_intermediate_size` split over the tensor-parallel ranks like the
  dense MLP (before the router; after it, beside the all-to-alls, with
  `moe_shared_expert_overlap`);
- the router: a (T x h) @ (h x E) GEMM, then softmax and top-k (memory-bound);
- token permutation: each token copied to its k experts' order (memory-bound);
- dispatch all-to-all over the EP group: T k h bytes-per-element per rank, scaled by
  the busiest rank's share over the mean (all ranks wait for it): `moe_load_imbalance`
  with EP > 1, capped by `moe_expert_capacity_factor` (dropped tokens), or the
  capacity factor itself with `moe_pad_expert_input_to_capacity` (`load_factor`);
- with ETP > 1 and tokens not already replicated over the ETP group: an all-gather of
  the dispatched tokens over it (and a reduce-scatter of the experts' output);
- the local experts, E / EP of them, as one grouped GEMM per projection: each expert
  gets T k EP ETP / E tokens on average (ETP only when gathered), times the imbalance,
  priced by the device model's GEMM curve at that real m (small GEMMs run less
  efficiently than the dense MLP's);
- combine all-to-all (the same volume) and unpermute (the probability-weighted sum of
  each token's k outputs).

T is the sequence-parallel shard b s / t with sequence parallelism, else b s. Without
sequence parallelism and t > 1 (Megatron allows it only with EP 1 and ETP = t) the
tokens are replicated over the tensor-parallel ranks, each expert is split over them
and the MoE output is all-reduced like the dense MLP's.

Backward: every GEMM twice (input and weight gradient), the element-wise kernels'
backward, the same all-to-alls in reverse, the ETP all-gather / reduce-scatter
swapped. Full recomputation repeats the forward (all-to-alls included); selective
recomputation repeats its `recompute_modules` as a dense layer does, but `mlp`, which
Megatron-Core applies to dense MLPs only.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.core.run_settings import DTYPE_BYTES, RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.ops import (  # the dense layer's pieces, shared by both layer kinds
    FP32_BYTES,
    LayerWork,
    PassWork,
    _attention_backward,
    _attention_forward,
    _Builder,
    _column_backward,
    _enter_tp,
    _leave_tp,
    _norm_backward,
    _norm_forward,
    _residual_backward,
    _residual_forward,
    _row_backward,
    _selective_recompute,
    _Shape,
    _shape,
    accumulate_bytes_per_param,
    layer_activation_bytes,
)
from paraplan.predict.work import NOT_HIDDEN

ROUTER_PASSES = 3  # softmax and top-k: read the fp32 logits, write probabilities, select


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
        gathered=gathered, a2a_bytes=dispatched * x.h * x.e)


def _act_forward(w: _Builder, gated: bool, e: int, tokens: float, width: float) -> None:
    w.memory(((2 if gated else 1) + 1) * e * tokens * width)


def _act_backward(w: _Builder, gated: bool, e: int, tokens: float, width: float) -> None:
    w.memory((2 * (2 if gated else 1) + 1) * e * tokens * width)


def _shared_forward(w: _Builder, model: TransformerModel, x: _Shape, m: MoeShape, overlap: bool) -> tuple[int, int]:
    """The shared experts as a tensor-parallel dense MLP; their two GEMMs' indices."""
    _enter_tp(w, x, overlap, len(w.rows))
    fc1 = w.gemm(x.tokens, x.h, m.shared_in)
    _act_forward(w, model.gated_mlp, x.e, x.tokens, m.shared_ffn)
    fc2 = w.gemm(x.tokens, m.shared_ffn, x.h)
    _leave_tp(w, x, fc2, overlap)
    return fc1, fc2


def _shared_backward(w: _Builder, model: TransformerModel, x: _Shape, m: MoeShape, overlap: bool,
                     async_reduce: bool) -> tuple[int, int]:
    fc2 = len(w.rows)
    _row_backward(w, x, m.shared_ffn, x.h, overlap)
    _act_backward(w, model.gated_mlp, x.e, x.tokens, m.shared_ffn)
    fc1 = len(w.rows)
    _column_backward(w, x, x.h, m.shared_in, async_reduce)
    return fc1, fc2


def _moe_forward(w: _Builder, model: TransformerModel, settings: RunSettings, x: _Shape, m: MoeShape) -> None:
    overlap_tp = settings.tp_comm_overlap
    shared = m.shared_ffn > 0
    beside = settings.moe_shared_expert_overlap
    _norm_forward(w, x)
    if shared and not beside:
        _shared_forward(w, model, x, m, overlap_tp)
    T, k = m.routed_tokens, m.topk
    w.gemm(T, x.h, m.experts, high_precision=True)  # router logits (not a Transformer Engine module: no FP8)
    w.memory(ROUTER_PASSES * FP32_BYTES * T * m.experts)  # softmax, top-k
    hide = (NOT_HIDDEN, NOT_HIDDEN)
    if shared and beside:
        hide = _shared_forward(w, model, x, m, overlap_tp)
    w.memory((1 + k) * x.e * T * x.h)  # permute
    if m.ep > 1:
        w.comm("all_to_all", m.a2a_bytes, hide[0], "ep")
    if m.gathered:
        w.comm("all_gather", m.etp * m.a2a_bytes, group="etp")
    n, batch = m.tokens_per_expert, m.local_experts
    w.gemm(n, x.h, m.expert_in, batch)
    _act_forward(w, model.gated_mlp, x.e, m.expert_tokens, m.expert_ffn)
    w.gemm(n, m.expert_ffn, x.h, batch)
    if m.gathered:
        w.comm("reduce_scatter", m.etp * m.a2a_bytes, group="etp")
    if m.ep > 1:
        w.comm("all_to_all", m.a2a_bytes, hide[1], "ep")
    w.memory((k + 1) * x.e * T * x.h + FP32_BYTES * T * k)  # unpermute: weighted sum of the k outputs
    if m.etp > 1 and not m.gathered:  # tokens replicated over the tensor-parallel ranks
        w.comm("all_reduce", T * x.h * x.e, group="etp")
    _residual_forward(w, model, x)


def _moe_backward(w: _Builder, model: TransformerModel, settings: RunSettings, x: _Shape, m: MoeShape) -> None:
    overlap_tp, async_reduce = settings.tp_comm_overlap, settings.async_tensor_model_parallel_allreduce
    shared = m.shared_ffn > 0
    hide = (NOT_HIDDEN, NOT_HIDDEN)
    if shared:
        hide = _shared_backward(w, model, x, m, overlap_tp, async_reduce)
    if not settings.moe_shared_expert_overlap:
        hide = (NOT_HIDDEN, NOT_HIDDEN)
    T, k = m.routed_tokens, m.topk
    _residual_backward(w, model, x)
    w.memory((2 * k + 1) * x.e * T * x.h + 2 * FP32_BYTES * T * k)  # unpermute backward (and the probs' grad)
    if m.ep > 1:
        w.comm("all_to_all", m.a2a_bytes, hide[1], "ep")
    if m.gathered:
        w.comm("all_gather", m.etp * m.a2a_bytes, group="etp")
    n, batch = m.tokens_per_expert, m.local_experts
    w.gemm(n, x.h, m.expert_ffn, batch)  # fc2 input gradient
    w.gemm(m.expert_ffn, n, x.h, batch, weight_grad=True)
    _act_backward(w, model.gated_mlp, x.e, m.expert_tokens, m.expert_ffn)
    w.gemm(n, m.expert_in, x.h, batch)  # fc1 input gradient
    w.gemm(x.h, n, m.expert_in, batch, weight_grad=True)
    if m.gathered:
        w.comm("reduce_scatter", m.etp * m.a2a_bytes, group="etp")
    if m.ep > 1:
        w.comm("all_to_all", m.a2a_bytes, hide[0], "ep")
    w.memory((k + 1) * x.e * T * x.h)  # permute backward: sum each token's k gradients
    if m.etp > 1 and not m.gathered:
        w.comm("all_reduce", T * x.h * x.e, group="etp")
    w.memory(ROUTER_PASSES * FP32_BYTES * T * m.experts)  # softmax / top-k backward
    w.gemm(T, m.experts, x.h, high_precision=True)
    w.gemm(x.h, T, m.experts, weight_grad=True, high_precision=True)
    _norm_backward(w, x)


def moe_activation_bytes(model: TransformerModel, settings: RunSettings) -> float:
    """Activations one MoE layer keeps per micro-batch until its backward, per rank:
    the attention half and the norm/router inputs as a dense layer
    (`ops.layer_activation_bytes` without its MLP), the router's fp32 probabilities
    (T x E), the dispatched tokens (the experts' input, T k h with the ETP gather and
    imbalance), the experts' inner activations (as the dense MLP's, on those tokens at
    the expert width), their outputs for the weighted combine, and the shared experts'
    inner activations. Full recomputation keeps only the layer's input; selective
    recomputation's modules act on the attention half and the norms as in a dense layer
    (Megatron-Core's `mlp` module skips MoE layers)."""
    x = _shape(model, settings)
    whole = layer_activation_bytes(model, settings)
    if settings.recompute_granularity == "full":
        return whole
    recomputed = settings.recompute_modules if settings.recompute_granularity == "selective" else ()
    dense_inner = 0.0 if "mlp" in recomputed else ((2 if model.gated_mlp else 1) + 1) * x.e * x.tokens * x.ffn
    m = moe_shape(model, settings)
    router = FP32_BYTES * m.routed_tokens * m.experts
    experts = x.e * m.expert_tokens * (x.h + m.expert_in + m.expert_ffn + x.h)
    shared = x.e * x.tokens * (m.shared_in + m.shared_ffn)
    return float(whole - dense_inner + router + experts + shared)


def moe_layer_work(model: TransformerModel, settings: RunSettings) -> LayerWork:
    """The work of one mixture-of-experts layer (see the module doc)."""
    x = _shape(model, settings)
    m = moe_shape(model, settings)
    flash = settings.use_flash_attn
    gemm_bytes = DTYPE_BYTES[settings.dtype]
    w = _Builder(gemm_bytes)
    _attention_forward(w, model, x, flash, settings.tp_comm_overlap)
    _moe_forward(w, model, settings, x, m)
    forward = w.build()
    w = _Builder(gemm_bytes, accumulate_bytes_per_param(settings))
    _moe_backward(w, model, settings, x, m)
    _attention_backward(w, model, x, flash, settings.tp_comm_overlap, settings.async_tensor_model_parallel_allreduce)
    backward = w.build()
    granularity = settings.recompute_granularity
    if granularity == "full":
        recompute = forward
    elif granularity == "selective":  # Megatron-Core's `mlp` module recomputes dense MLPs only
        modules = tuple(m for m in settings.recompute_modules if m != "mlp")
        recompute = _selective_recompute(model, x, flash, settings.tp_comm_overlap, gemm_bytes, modules)
    else:
        recompute = PassWork(_Builder(gemm_bytes).build().kernels)
    return LayerWork(forward, backward, recompute, moe_activation_bytes(model, settings))
