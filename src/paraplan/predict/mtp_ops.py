"""The last pipeline stage's work after its transformer layers: the final norm, LM head
and loss (`paraplan.predict.edge_ops.head_work`) and, for a model with multi-token
prediction (DeepSeek-V3; Megatron-Core's MTP block), its MTP layers.

Each MTP layer runs after the main model's head: the shared embedding of the tokens
shifted by one more position, a norm of it and one of the previous hidden state, the
column-parallel projection of their concatenation [h; h] to h (its output gathered over
the tensor-parallel group), a transformer layer like the main model's last one (a
mixture-of-experts layer, `moe_ops`, in DeepSeek-V3), then
the final norm, the shared LM head and the loss again. Its backward runs first (it
comes last in the forward), recomputing its layer as the main layers are recomputed.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from paraplan.core.run_settings import DTYPE_BYTES, RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.edge_ops import head_work
from paraplan.predict.layer_shape import _Shape, _shape
from paraplan.predict.moe_ops import moe_activation_bytes, moe_layer_work
from paraplan.predict.ops import (
    KERNEL_FIELDS_ORDER,
    Collective,
    Kernels,
    LayerWork,
    PassWork,
    _Builder,
    _norm_backward,
    _norm_forward,
    accumulate_bytes_per_param,
    layer_activation_bytes,
    layer_work,
)
from paraplan.predict.work import NOT_HIDDEN


def concat(*works: PassWork) -> PassWork:
    """Passes run one after another, as one pass."""
    cols = np.concatenate([np.stack([getattr(p.kernels, f) for f in KERNEL_FIELDS_ORDER]).astype(float)
                           for p in works], axis=1) if works else np.zeros((len(KERNEL_FIELDS_ORDER), 0))
    kernels = Kernels(cols[0].astype(np.int8), cols[1], cols[2], cols[3], cols[4], cols[5], cols[6],
                      cols[7].astype(bool), cols[8])
    collectives: list[Collective] = []
    syncs: list[tuple[int, int]] = []
    offset = 0
    for p in works:
        # z10-planfsdp: a collective not hidden, or in the first pass, keeps its index (no copy: the planner's hot path)
        collectives += [c if c.hidden_by < 0 or not offset else replace(c, hidden_by=c.hidden_by + offset)
                        for c in p.collectives]
        syncs += [(first + offset, end + offset) for first, end in p.host_syncs]
        offset += len(p.kernels)
    return PassWork(kernels, tuple(collectives), tuple(syncs))


def _mtp_inputs(model: TransformerModel, settings: RunSettings) -> tuple[PassWork, PassWork, float]:
    """Forward and backward of an MTP layer's embedding, norms and [h; h] -> h
    projection, and what they keep for the backward."""
    x = _shape(model, settings)
    gemm_bytes = DTYPE_BYTES[settings.dtype]
    w = _Builder(gemm_bytes)
    w.memory(2 * x.e * x.tokens * x.h)  # embedding rows
    _norm_forward(w, x)
    _norm_forward(w, x)
    w.gemm(x.tokens, 2 * x.h, x.h / x.t)
    if x.t > 1:
        w.comm("all_gather", x.tokens * x.h * x.e)
    forward = w.build()
    w = _Builder(gemm_bytes, accumulate_bytes_per_param(settings))
    w.gemm(x.tokens, x.h / x.t, 2 * x.h)
    wgrad = w.gemm(2 * x.h, x.tokens, x.h / x.t, weight_grad=True)
    if x.t > 1:
        hidden = wgrad if settings.async_tensor_model_parallel_allreduce else NOT_HIDDEN
        w.comm("all_reduce", x.tokens * 2 * x.h * x.e, hidden)
    _norm_backward(w, x)
    _norm_backward(w, x)
    w.memory(3 * x.e * x.tokens * x.h)  # scatter-add into the embedding's gradient
    return forward, w.build(), _mtp_inputs_held(x)


def _mtp_inputs_held(x: _Shape) -> float:
    """What an MTP layer's inputs keep for the backward: the two norms' inputs and the
    projection's [h; h] input."""
    return float(2 * x.e * x.sp_tokens * x.h + x.e * x.tokens * 2 * x.h)


def last_stage_activation_bytes(model: TransformerModel, settings: RunSettings, head_bytes: float | None = None,
                                moe_layer_bytes: float | None = None) -> float:
    """`last_stage_work(model, settings).activation_bytes` without building its kernels
    (the planner asks it for thousands of settings). `head_bytes`, `moe_layer_bytes`:
    `head_work(...).activation_bytes` and `moe_activation_bytes(...)` of these settings
    where the caller has them already (z10-planfsdp: the planner's layer table)."""
    head = head_work(model, settings).activation_bytes if head_bytes is None else head_bytes
    if not model.mtp_num_layers:
        return head
    last = model.num_layers - 1
    if model.moe_layers[last]:
        layer = moe_activation_bytes(model, settings) if moe_layer_bytes is None else moe_layer_bytes
    else:
        layer = layer_activation_bytes(model, settings, last)
    held = _mtp_inputs_held(_shape(model, settings))
    return head + model.mtp_num_layers * (held + layer + head)


def last_stage_work(model: TransformerModel, settings: RunSettings, moe_layer: LayerWork | None = None) -> LayerWork:
    """Final norm, LM head and loss, then the MTP layers (see the module doc); their
    recomputation is part of the backward. `moe_layer`: `moe_layer_work(model, settings)`
    where the caller has it already (z10-planfsdp: the planner's probes)."""
    head = head_work(model, settings)
    if not model.mtp_num_layers:
        return head
    last = model.num_layers - 1
    if model.moe_layers[last]:
        layer = moe_layer if moe_layer is not None else moe_layer_work(model, settings)
    else:
        layer = layer_work(model, settings, last)
    inputs_fwd, inputs_bwd, inputs_held = _mtp_inputs(model, settings)
    mtp_fwd = concat(inputs_fwd, layer.forward, head.forward)
    mtp_bwd = concat(head.backward, layer.recompute, layer.backward, inputs_bwd)
    n = model.mtp_num_layers
    held = head.activation_bytes + n * (inputs_held + layer.activation_bytes + head.activation_bytes)
    return LayerWork(concat(head.forward, *[mtp_fwd] * n), concat(*[mtp_bwd] * n, head.backward),
                     head.recompute, held)
