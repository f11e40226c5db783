"""What Megatron-Core's MoE router runs per MoE layer and micro-batch after its gating
GEMM (forward) and before the gating GEMMs' backward: kernel by kernel with their bytes,
its collectives, and the per-iteration all-reduce of the expert bias's token counts.

Source: Megatron-Core `transformer/moe/router.py` (`TopKRouter`) and `moe_utils.py`
at 0d8e0714cd29c01e164fe6de9f532182bdffa942 (core_r0.15.0, the Megatron-LM of
Megatron-Bridge v0.2.0, the 25.11 container); `distributed/finalize_model_grads.py`
(`_update_router_expert_bias`); Transformer Engine v2.9 `pytorch/router.py`,
`pytorch/csrc/extensions/router.cpp` and `common/fused_router/*.cu` (one kernel per fused
call, forward and backward); PyTorch's composite ops as ATen writes them (`logsumexp`:
amax, abs, eq, masked_fill_, sub, exp_, sum, log_, add_; `Tensor.scatter` out of place:
a copy, then `scatter_`; `topk`'s backward: zeros, a copy and `scatter_`; `gather`'s
backward: zeros and `scatter_add_`).

T tokens routed by the rank, E experts, k = `moe_router_topk`, b the bytes of a logit
(`MoeRouterSettings.router_logit_bytes`: 4 with `moe_router_dtype fp32`, else 2). Forward,
in issue order:

- forced balancing (`moe_router_force_load_balancing`): `RandomSTE` replaces the logits
  by `logits.clone().normal_()`: a copy and a fill of T E b; its backward passes the
  gradient through (no kernel);
- z-loss (`moe_z_loss_coeff` > 0): `logsumexp` (9 kernels), square, mean, the
  coefficient, and two for the loss tracker; backward 9 (the auto-scaler's ones and
  product, mean, square's two, logsumexp's sub, exp and product, the sum into the
  logits' gradient);
- top-k with its score function: with `moe_router_fusion`, one Transformer Engine
  kernel (reads the logits, writes probabilities, routing map and its saved scores: T E
  (3 b + 1) bytes; group-limited routing and the expert bias inside), and one backward
  kernel of the same bytes; unfused, PyTorch's ops one kernel each (`unfused_routing`:
  top-k, the softmax on the k chosen or on all E with `moe_router_pre_softmax`, the
  sigmoid and its normalisation, the expert bias's add and gather, group-limited routing's
  10 kernels, the scaling factor, and the dense T x E probabilities and routing map
  built by 8 kernels);
- an auxiliary loss (an aux-loss type with `moe_aux_loss_coeff` > 0): the scores for
  the loss (fused: one kernel; unfused: softmax or sigmoid and normalisation, top-k and
  a routing map), the tokens per expert (a sum), their all-reduce over tensor x context
  parallel (`aux_loss`, `seq_aux_loss`; with t c > 1) or tensor x data x context parallel
  (`global_aux_loss`, with its running sum, step count and average), the loss (fused: one
  kernel; unfused: four), the sequence loss's division by the batch, two tracker
  kernels; `MoEAuxLossAutoScaler` costs nothing forward and two scalar kernels backward;
- with `moe_expert_capacity_factor`, the token dropping (`_token_dropping`: 7 kernels,
  6 when padding to capacity; backward one);
- the expert bias (`moe_router_enable_expert_bias`): the tokens per expert added to
  the layer's buffer (a sum and an add).

Backward, besides what is listed: one add of T E b per extra path into the logits'
gradient (auxiliary scores, z-loss); with `fp32` routing the gating GEMMs' backward
casts the weight and the input to fp32 and the two gradients back (four casts); with a
router bias its gradient is a sum over the tokens.

No host synchronisation: none of these reads a device value on the host (sinkhorn
would, and is refused by `check_router`). Per iteration with the expert bias, the
rank's MoE layers' counts (L x E fp32) are all-reduced once over tensor x data x
context parallel before the optimizer step (`expert_bias_all_reduce_bytes`); its
handful of small update kernels are not priced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from paraplan.core.comm import CommModel, Group
from paraplan.core.moe_router_settings import MoeRouterSettings
from paraplan.predict.work import _Builder

INDEX_BYTES = 8  # a top-k index or a token count (int64)
FP32_BYTES = 4
SCALAR_BYTES = 8  # a one-element kernel (a loss, a step count), priced by its launch
AUX_GROUPS = {"aux_loss": "tp_cp", "seq_aux_loss": "tp_cp", "global_aux_loss": "tp_dp_cp"}
"""The group Megatron-Core all-reduces each auxiliary loss's token counts over."""


@dataclass(frozen=True)
class RouterPass:
    """The router's memory-bound kernels (bytes each, in issue order) and its
    all-reduces (group, bytes) in one pass."""

    kernel_bytes: tuple[float, ...]
    all_reduces: tuple[tuple[str, float], ...] = ()

    def add_to(self, w: _Builder) -> None:
        """Append to a pass being built (the all-reduces block the compute stream)."""
        for nbytes in self.kernel_bytes:
            w.memory(nbytes)
        for group, nbytes in self.all_reduces:
            w.comm("all_reduce", nbytes, group=group)


@dataclass(frozen=True)
class RouterShape:
    """The sizes the router's kernels scale with."""

    tokens: float  # T
    experts: int  # E
    topk: int  # k
    hidden: int  # h (the gating GEMM's casts)
    groups: tuple[int, int] = (1, 1)  # group-limited routing: (groups, groups per token)
    tp_cp: int = 1  # ranks of the tensor x context-parallel group
    tp_dp_cp: int = 1  # ranks of the tensor x data x context-parallel group
    router_bias: bool = False  # the gating linear has a bias (`add_bias_linear`)
    capacity_factor: float = 0.0  # `moe_expert_capacity_factor` (0: dropless)
    pad_to_capacity: bool = False  # `moe_pad_expert_input_to_capacity`


def _token_dropping(x: RouterShape, b: int) -> tuple[list[float], list[float]]:
    """`apply_router_token_dropping` (drop policy `probs`): each expert keeps its
    `capacity` = ceil(T k / E x factor) most probable tokens: a top-k over the tokens,
    a mask (zeros, copy, scatter_, bool), the map (the mask itself when padding, else
    its `and` with the routing map) and the probabilities masked; backward: the product's."""
    T, E, k = x.tokens, x.experts, x.topk
    capacity = math.ceil(T * k / E * x.capacity_factor)
    mask = [T * E * b + capacity * E * (b + INDEX_BYTES), T * E * b, 2 * T * E * b,
            capacity * E * (INDEX_BYTES + 1), T * E * (b + 1)]
    routing_map = [] if x.pad_to_capacity else [3 * T * E]
    return [*mask, *routing_map, T * E * (2 * b + 1)], [T * E * (2 * b + 1)]


def _z_loss_forward(T: float, E: int, b: int) -> list[float]:
    lse = [T * E * b + T * b, 2 * T * b, T * b + T, 2 * T * b + T, 2 * T * E * b + T * b, 2 * T * E * b,
           T * E * b + T * b, 2 * T * b, 3 * T * b]  # amax, abs, eq, masked_fill_, sub, exp_, sum, log_, add_
    return [*lse, 2 * T * b, T * b + b, 2 * b, 2 * b, 3 * b]  # square, mean, x coeff; tracker: / coeff, +=


def _z_loss_backward(T: float, E: int, b: int) -> list[float]:
    return [SCALAR_BYTES, SCALAR_BYTES, T * b, 2 * T * b, 3 * T * b,  # scaler ones, x scale; mean; square's two
            2 * T * E * b + T * b, 2 * T * E * b, 3 * T * E * b, 3 * T * E * b]  # sub, exp, x grad; sum into logits


def _limited_topk(T: float, E: int, k: int, groups: tuple[int, int], s: int) -> list[float]:
    """Megatron-Core's `group_limited_topk` on scores of s bytes: 10 kernels."""
    G, g = groups
    per = k // g
    return [T * E * s + T * G * per * (s + INDEX_BYTES), T * G * per * s + T * G * s,  # top k/g per group, sum
            T * G * s + T * g * (s + INDEX_BYTES), T * G * s, T * g * (INDEX_BYTES + s),  # top g, zeros, scatter_
            T * G * s + T * E * s, T * E * s + T * E, 2 * T * E, 2 * T * E * s + T * E,  # mask copy, bool, ~, fill
            T * E * s + T * k * (s + INDEX_BYTES)]  # top k of the masked scores


def _topk(x: RouterShape, s: int) -> list[float]:
    T, E, k = x.tokens, x.experts, x.topk
    if x.groups[0] > 1:
        return _limited_topk(T, E, k, x.groups, s)
    return [T * E * s + T * k * (s + INDEX_BYTES)]


def _cast(n: float, src: int, dst: int) -> list[float]:
    return [] if src == dst else [n * (src + dst)]


def _dense_outputs(T: float, E: int, k: int, b: int) -> list[float]:
    """The T x E probabilities and routing map from the k chosen: zeros, copy and
    scatter_ for each, the map's int cast and bool cast (8 kernels)."""
    probs = [T * E * b, 2 * T * E * b, T * k * (INDEX_BYTES + 2 * b)]
    routing_map = [T * E * b, T * E * (b + 4), 2 * T * E * 4, T * k * (INDEX_BYTES + 4), T * E * (4 + 1)]
    return probs + routing_map


def unfused_routing(s: MoeRouterSettings, x: RouterShape) -> tuple[list[float], list[float]]:
    """`topk_routing_with_score_function` without fusion: (forward, backward) kernels."""
    T, E, k, b = x.tokens, x.experts, x.topk, s.router_logit_bytes
    fwd: list[float] = []
    bwd: list[float] = [T * k * (INDEX_BYTES + 2 * b)]  # the probabilities' scatter backward: a gather
    topk_bwd = [T * E * b, 2 * T * E * b, T * k * (INDEX_BYTES + 2 * b)]  # zeros, copy, scatter_
    if s.moe_router_score_function == "softmax":
        if s.moe_router_pre_softmax:
            fwd += [T * E * (b + FP32_BYTES), *_cast(T * E, FP32_BYTES, b), *_topk(x, b)]
            bwd += [*topk_bwd, *_cast(T * E, b, FP32_BYTES), T * E * (2 * FP32_BYTES + b)]
        else:
            fwd += [*_topk(x, b), T * k * (b + FP32_BYTES), *_cast(T * k, FP32_BYTES, b)]
            bwd += [*_cast(T * k, b, FP32_BYTES), T * k * (2 * FP32_BYTES + b), *topk_bwd]
    else:  # sigmoid in fp32, normalised over the k chosen
        fwd += [*_cast(T * E, b, FP32_BYTES), 2 * T * E * FP32_BYTES, *_cast(T * E, FP32_BYTES, b)]
        if s.moe_router_enable_expert_bias:
            fwd += [T * E * (b + FP32_BYTES) + E * FP32_BYTES, *_topk(x, FP32_BYTES), T * k * (INDEX_BYTES + 2 * b)]
            chosen_bwd = [T * E * b, T * k * (INDEX_BYTES + 2 * b)]  # gather's backward: zeros, scatter_add_
        else:
            fwd += _topk(x, b)
            chosen_bwd = topk_bwd
        if k > 1:  # scores / (sum + 1e-20)
            fwd += [T * k * b + T * b, 2 * T * b, 2 * T * k * b + T * b]
            bwd += [2 * T * k * b + T * b, 2 * T * k * b, 2 * T * k * b, 2 * T * k * b, 2 * T * k * b,  # div's two
                    T * k * b + T * b, 3 * T * k * b]  # sum_to the denominator; the sum's gradient added in
        bwd += [*chosen_bwd, *_cast(T * E, FP32_BYTES, b), 3 * T * E * FP32_BYTES, *_cast(T * E, FP32_BYTES, b)]
    if x.groups[0] > 1:
        bwd.append(2 * T * E * b + T * E)  # masked_fill's backward
    if s.moe_router_topk_scaling_factor:
        fwd.append(2 * T * k * b)
        bwd.append(2 * T * k * b)
    return fwd + _dense_outputs(T, E, k, b), bwd


def _aux_loss(s: MoeRouterSettings, x: RouterShape) -> tuple[list[float], list[float], list[tuple[str, float]]]:
    """An auxiliary loss's (forward, backward, all-reduces) (module doc)."""
    T, E, k, b = x.tokens, x.experts, x.topk, s.router_logit_bytes
    kind = s.moe_router_load_balancing_type
    fused = s.moe_router_fusion
    if fused:
        sa = b
        fwd = [T * E * (3 * b + 1)]
        bwd = [3 * T * E * b]
    elif s.moe_router_score_function == "softmax":
        sa = FP32_BYTES  # the unfused scores stay fp32
        fwd = [T * E * (b + sa), T * E * sa + T * k * (sa + INDEX_BYTES)]
        bwd = [T * E * (2 * sa + b)]
    else:
        sa = b
        fwd = [2 * T * E * b, T * E * b + T * b, 2 * T * b, 2 * T * E * b + T * b,  # sigmoid, sum, add, div
               T * E * b + T * k * (b + INDEX_BYTES)]  # top-k
        bwd = [2 * T * E * b + T * b, 2 * T * E * b, 2 * T * E * b, 2 * T * E * b, 2 * T * E * b, T * E * b + T * b,
               3 * T * E * b, 2 * T * E * b]  # div's two, sum_to, the sum's gradient added in, sigmoid's
    if not fused:  # the loss's own routing map
        fwd += [T * E * b, T * E * (b + 4), 2 * T * E * 4, T * k * (INDEX_BYTES + 4), T * E * (4 + 1)]
    fwd.append(T * E + E * INDEX_BYTES)  # tokens per expert
    group = AUX_GROUPS[kind]
    size = x.tp_dp_cp if kind == "global_aux_loss" else x.tp_cp
    reduces = [(group, float(E * INDEX_BYTES))] if size > 1 else []
    if kind == "global_aux_loss":  # running sum, step count, average
        fwd += [E * (FP32_BYTES + INDEX_BYTES + FP32_BYTES), SCALAR_BYTES, 2 * E * FP32_BYTES + FP32_BYTES]
    if fused:
        fwd.append(T * E * sa + E * INDEX_BYTES)
        bwd.insert(0, T * E * sa + E * INDEX_BYTES)
    else:  # sum over tokens, x counts, sum, x constant; backward: x constant, x counts, the expanded copy
        fwd += [T * E * sa + E * sa, E * (sa + INDEX_BYTES + FP32_BYTES), E * FP32_BYTES + FP32_BYTES, SCALAR_BYTES]
        bwd[:0] = [SCALAR_BYTES, E * (sa + INDEX_BYTES + FP32_BYTES), 2 * T * E * sa]
    if kind == "seq_aux_loss":  # / batch size, and its backward
        fwd.append(SCALAR_BYTES)
        bwd.insert(0, SCALAR_BYTES)
    fwd += [SCALAR_BYTES, SCALAR_BYTES]  # the tracker: / coefficient, += into the layer's slot
    bwd[:0] = [SCALAR_BYTES, SCALAR_BYTES]  # MoEAuxLossAutoScaler: ones_like, x scale
    bwd.append(3 * T * E * b)  # its gradient added into the logits'
    return fwd, bwd, reduces


def router_passes(s: MoeRouterSettings, x: RouterShape) -> tuple[RouterPass, RouterPass]:
    """The router's (forward, backward) after / before its gating GEMM (module doc)."""
    T, E, b = x.tokens, x.experts, s.router_logit_bytes
    fwd: list[float] = []
    bwd: list[float] = []
    reduces: list[tuple[str, float]] = []
    if s.moe_router_force_load_balancing:
        fwd += [2 * T * E * b, T * E * b]  # clone, normal_
    if s.moe_z_loss_coeff:
        fwd += _z_loss_forward(T, E, b)
        bwd += _z_loss_backward(T, E, b)
    if s.moe_router_fusion:
        bias = E * FP32_BYTES if s.moe_router_enable_expert_bias else 0.0
        fwd.append(T * E * (3 * b + 1) + bias)
        route_bwd = [T * E * (3 * b + 1)]
    else:
        route_fwd, route_bwd = unfused_routing(s, x)
        fwd += route_fwd
    if x.capacity_factor:
        drop_fwd, drop_bwd = _token_dropping(x, b)
        fwd += drop_fwd
        bwd += drop_bwd
    if s.aux_loss_on:
        aux_fwd, aux_bwd, reduces = _aux_loss(s, x)
        fwd += aux_fwd
        bwd += aux_bwd
    if s.moe_router_enable_expert_bias:
        fwd += [T * E + E * INDEX_BYTES, E * (FP32_BYTES + INDEX_BYTES + FP32_BYTES)]  # sum, +=
    bwd += route_bwd
    h = x.hidden
    if s.router_logit_bytes == FP32_BYTES:  # the gating GEMMs' fp32 operands and 16-bit gradients
        bwd += [E * h * (2 + FP32_BYTES), T * h * (FP32_BYTES + 2), T * h * (2 + FP32_BYTES), E * h * (FP32_BYTES + 2)]
    if x.router_bias:
        bwd += [T * E * b + E * b, *_cast(E, b, 2)]  # the bias gradient: a sum over tokens (and a cast)
    return RouterPass(tuple(fwd), tuple(reduces)), RouterPass(tuple(bwd))


def expert_bias_all_reduce_bytes(s: MoeRouterSettings, moe_layers: float, experts: int) -> float:
    """Per iteration and pipeline rank: the stacked token counts of its MoE layers (fp32)
    all-reduced over tensor x data x context parallel (`_update_router_expert_bias`)."""
    return moe_layers * experts * FP32_BYTES if s.moe_router_enable_expert_bias and moe_layers else 0.0


def expert_bias_sync_s(s: MoeRouterSettings, comm: CommModel, group: Group, stage_moe_layers: np.ndarray,
                       experts: int) -> np.ndarray:
    """Per pipeline stage: the expert bias's all-reduce time per iteration (after the
    backward, before the optimizer step; zeros without the expert bias or MoE layers)."""
    return np.array([float(comm.time_s("all_reduce", nbytes, group)) if nbytes and group.size > 1 else 0.0
                     for nbytes in (expert_bias_all_reduce_bytes(s, float(n), experts) for n in stage_moe_layers)])


def fake_balanced_gate(x: RouterShape) -> RouterPass:
    """NeMo AutoModel's `FakeBalancedGate.forward` (components/moe/layers.py at 037e04a6):
    `torch.ones(T, k) / k`, `arange(T k) % E + 0`, the weights cast to the activations'
    dtype: six kernels, nothing backward (no parameter, no gradient)."""
    Tk = x.tokens * x.topk
    return RouterPass((Tk * FP32_BYTES, 2 * Tk * FP32_BYTES, Tk * INDEX_BYTES, 2 * Tk * INDEX_BYTES,
                       2 * Tk * INDEX_BYTES, Tk * (FP32_BYTES + 2)))
