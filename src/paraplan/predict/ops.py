"""What one transformer layer (and the embedding and LM head) runs on one
tensor-parallel rank for one micro-batch: its kernels with their shapes, FLOPs and
bytes, and its collectives, for the forward, the backward and the recomputation, at
the sizes that rank sees (`paraplan.predict.layer_shape`).

This is Megatron-LM's layer (Narayanan et al. 2021; Korthikanti et al. 2022):
norm, fused QKV projection, attention core, output projection, bias-dropout-add,
norm, MLP (GeLU, or SwiGLU's gated pair), bias-dropout-add. With tensor
parallelism t the projections are split column/row-wise (QKV and the first MLP
projection by output, the output projection and the second MLP projection by
input), so a layer's forward ends each half with an all-reduce of the activation
(`g`) and its backward all-reduces the input gradient of each half (`f`). With
sequence parallelism the norms and dropouts run on s / t tokens and each
all-reduce becomes a reduce-scatter after the row-parallel projection plus an
all-gather before the column-parallel one.

Overlaps are recorded on the collective (the kernel it runs beside):
the backward all-reduce of a column-parallel layer's input gradient runs while that
layer's weight gradient is computed when `async_tensor_model_parallel_allreduce` is on
(Megatron's default since 2021; off, it blocks); with sequence parallelism the
backward reduce-scatter runs beside the weight gradient and the re-gather of the input
beside the input gradient, always (Megatron and Megatron-DeepSpeed alike);
`tp_comm_overlap` also puts the forward collectives and the row-parallel backward
re-gathers beside their GEMMs. An overlapped collective is not free: the step builder
charges the contention of `DeviceEfficiency.comm_overlap_contention` (tensor-parallel
collectives; the others' share is the device's occupancy, `overlap_share`). The device model
(`paraplan.predict.device_model`) prices the kernels; the step builder prices the
collectives with the communication model.

Without `gradient_accumulation_fusion` each weight-gradient GEMM is followed by a
memory-bound kernel adding it to the main gradient (`accumulate_bytes_per_param`).

Only FLOPs that a kernel executes are counted here (causal flash attention skips
the masked half of the score matrix); the closed-form model FLOPs of
`paraplan.core.transformer` count the full matrices as Megatron-LM's papers do.
"""

from __future__ import annotations

import numpy as np

from paraplan.core.run_settings import DTYPE_BYTES, RunSettings, main_grad_bytes
from paraplan.core.transformer import TransformerModel
from paraplan.predict import eager_ops, torchtitan_ac
from paraplan.predict.cp_ops import (
    FLASH_BACKWARD_FLOPS,
    cp_attention_backward,
    cp_attention_forward,
)
from paraplan.predict.layer_shape import _Shape, _shape
from paraplan.predict.mla_ops import mla_activation_bytes, mla_backward, mla_forward, mla_up_forward
from paraplan.predict.work import (
    ATTENTION,
    FP8_GEMM,
    FP8_OPERAND_BYTES,
    GEMM,
    KERNEL_FIELDS_ORDER,
    MEMORY,
    NOT_HIDDEN,
    Collective,
    Kernels,
    LayerWork,
    PassWork,
    _Builder,
)

__all__ = [  # with the pass vocabulary of `paraplan.predict.work`, which this module's users import from here too
    "ATTENTION", "FP8_GEMM", "FP8_OPERAND_BYTES", "FP32_BYTES", "GEMM", "KERNEL_FIELDS_ORDER", "MASK_BYTES", "MEMORY",
    "NOT_HIDDEN", "Collective", "Kernels", "LayerWork", "PassWork", "accumulate_bytes_per_param",
    "fused_softmax_available", "layer_activation_bytes", "layer_work",
]

MASK_BYTES = 1  # dropout masks are stored as bytes
FP32_BYTES = 4


def _enter_tp(w: _Builder, x: _Shape, overlap: bool, next_gemm: int = NOT_HIDDEN) -> None:
    """Before a column-parallel projection: all-gather the sequence-parallel input."""
    if x.sp:
        w.comm("all_gather", x.tokens * x.h * x.e, next_gemm if overlap else NOT_HIDDEN)


def _leave_tp(w: _Builder, x: _Shape, gemm: int, overlap: bool) -> None:
    """After a row-parallel projection: sum the partial outputs over the group."""
    if x.t > 1:
        w.comm("reduce_scatter" if x.sp else "all_reduce", x.tokens * x.h * x.e, gemm if overlap else NOT_HIDDEN)


def fused_softmax_available(model: TransformerModel, x: _Shape) -> bool:
    """Megatron's fused scale-mask-softmax kernel runs only for 16-bit inputs with
    16 < s <= 4096, s divisible by 4 and the b x heads score matrices in whole
    blocks of its thread block (4 matrices for s >= 256, 8 below); otherwise the
    softmax falls back to PyTorch in fp32."""
    if x.e != 2 or not 16 < x.s <= 4096 or x.s % 4:
        return False
    width = 1 << int(np.ceil(np.log2(x.s)))
    warp = min(width, 32)
    per_block = (128 // warp) * (2 if width <= 128 else 1)
    batches = x.b * x.heads
    return batches % 4 == 0 and batches % per_block == 0


def _softmax_forward(w: _Builder, x: _Shape, scores: float, fused: bool) -> None:
    if fused:
        w.memory(2 * x.e * scores)  # scale, mask and softmax in one kernel
        return
    w.memory((x.e + FP32_BYTES) * scores)  # to fp32
    w.memory(2 * FP32_BYTES * scores)  # scale
    w.memory((2 * FP32_BYTES + MASK_BYTES) * scores)  # mask
    w.memory(2 * FP32_BYTES * scores)  # softmax
    w.memory((FP32_BYTES + x.e) * scores)  # back to 16 bits


def _softmax_backward(w: _Builder, x: _Shape, scores: float, fused: bool) -> None:
    if fused:
        w.memory(3 * x.e * scores)
        return
    w.memory((x.e + FP32_BYTES) * scores)
    w.memory(3 * FP32_BYTES * scores)  # softmax backward
    w.memory((2 * FP32_BYTES + MASK_BYTES) * scores)
    w.memory(2 * FP32_BYTES * scores)
    w.memory((FP32_BYTES + x.e) * scores)


def _qkvo_bytes(x: _Shape) -> float:
    """Bytes of the attention core's Q, K, V and output on one rank."""
    return x.e * x.tokens * ((x.heads + x.groups) * x.qk_d + (x.groups + x.heads) * x.v_d)


def _attention_core_forward(w: _Builder, model: TransformerModel, x: _Shape, flash: bool) -> None:
    if x.cp > 1:  # `RunSettings.check`: context parallelism runs flash attention
        cp_attention_forward(w, x.attention_shape(), x.cp_comm_type)
        return
    batch = x.b * x.heads
    if flash:
        # causal: the kernel skips the blocks above the diagonal (and, with a sliding
        # window, those left of it): Q K^T and P V over `causal_scores` pairs
        flops = 2.0 * batch * x.causal_scores * (x.qk_d + x.v_d)
        w.attention(flops, _qkvo_bytes(x), x.kernel_seq, backward=False)
        return
    scores = batch * x.s * x.s  # the unfused path masks the full matrix (windows too)
    w.gemm(x.s, x.qk_d, x.s, batch, high_precision=True)  # Q K^T
    _softmax_forward(w, x, scores, fused_softmax_available(model, x))
    if model.attention_dropout > 0:
        w.memory((2 * x.e + MASK_BYTES) * scores)
    w.gemm(x.s, x.s, x.v_d, batch, high_precision=True)  # probabilities @ V


def _attention_core_backward(w: _Builder, model: TransformerModel, x: _Shape, flash: bool) -> None:
    if x.cp > 1:
        cp_attention_backward(w, x.attention_shape(), x.cp_comm_type)
        return
    batch = x.b * x.heads
    if flash:
        flops = 2.0 * batch * x.causal_scores * (x.qk_d + x.v_d) * FLASH_BACKWARD_FLOPS
        w.attention(flops, 2 * _qkvo_bytes(x), x.kernel_seq, backward=True)  # reads Q K V O dO; writes dQ dK dV
        return
    scores = batch * x.s * x.s
    w.gemm(x.s, x.v_d, x.s, batch, high_precision=True)  # d probs = dO V^T
    w.gemm(x.s, x.s, x.v_d, batch, high_precision=True)  # dV = probs^T dO
    if model.attention_dropout > 0:
        w.memory((2 * x.e + MASK_BYTES) * scores)
    _softmax_backward(w, x, scores, fused_softmax_available(model, x))
    w.gemm(x.s, x.s, x.qk_d, batch, high_precision=True)  # dQ = dS K
    w.gemm(x.s, x.s, x.qk_d, batch, high_precision=True)  # dK = dS^T Q


def _residual_forward(w: _Builder, model: TransformerModel, x: _Shape) -> None:
    """bias + dropout + residual add, one fused kernel (after the sublayer output's own
    norm with `sandwich_norm`)."""
    if model.sandwich_norm:
        _norm_forward(w, x)
    if x.eager:
        return eager_ops.residual(w, x)
    per_token = 3 * x.e + (MASK_BYTES if model.hidden_dropout > 0 else 0)
    w.memory(per_token * x.sp_tokens * x.h)


def _residual_backward(w: _Builder, model: TransformerModel, x: _Shape) -> None:
    """Backward of a residual junction (`residual + dropout(y + bias)`): the dropout's
    backward (one fused kernel), and the sum of the residual stream's two gradients where
    it branched (autograd adds the norm path's input gradient to the skip path's: read
    two, write one), a kernel of its own in every Megatron version (docs/execution-model.md,
    "What the backward costs besides its GEMMs"); then, with `sandwich_norm`, the backward
    of the sublayer output's norm."""
    if x.eager:
        eager_ops.residual(w, x)
    else:
        per_token = 2 * x.e + (MASK_BYTES if model.hidden_dropout > 0 else 0)
        w.memory(per_token * x.sp_tokens * x.h)
        w.memory(3 * x.e * x.sp_tokens * x.h)
    if model.sandwich_norm:  # the sublayer output's norm, backward
        _norm_backward(w, x)


def _row_bias_backward(w: _Builder, model: TransformerModel, x: _Shape) -> None:
    """The gradient of a row-parallel projection's bias, which Megatron adds in the
    junction (`bias.expand_as(residual)`): autograd sums the junction's gradient over the
    tokens, a reduction of its own (Megatron-LM, Megatron-DeepSpeed and Megatron-Core
    alike). A MoE layer's experts add their biases themselves (`paraplan.predict.moe_bias`)."""
    if model.add_bias_linear and not x.eager:
        w.memory(x.e * x.sp_tokens * x.h)


def _norm_forward(w: _Builder, x: _Shape) -> None:
    if x.eager:
        return eager_ops.norm_forward(w, x)
    w.memory(2 * x.e * x.sp_tokens * x.h)


def _norm_backward(w: _Builder, x: _Shape) -> None:
    if x.eager:
        return eager_ops.norm_backward(w, x)
    w.memory(3 * x.e * x.sp_tokens * x.h)


def _activation_forward(w: _Builder, model: TransformerModel, x: _Shape) -> None:
    if x.eager:
        return eager_ops.activation_forward(w, x)
    inputs = 2 if model.gated_mlp else 1
    w.memory((inputs + 1) * x.e * x.tokens * x.ffn)
    if x.fp8_act_store:  # the input's FP8 cast for the backward (`activation_func_fp8_input_store`)
        w.memory((x.e + FP8_OPERAND_BYTES) * inputs * x.tokens * x.ffn)


def _activation_backward(w: _Builder, model: TransformerModel, x: _Shape) -> None:
    if x.eager:
        return eager_ops.activation_backward(w, x)
    inputs = 2 if model.gated_mlp else 1
    w.memory((2 * inputs + 1) * x.e * x.tokens * x.ffn)
    if x.fp8_act_store:  # the FP8 input cast back
        w.memory((x.e + FP8_OPERAND_BYTES) * inputs * x.tokens * x.ffn)


def _rope(w: _Builder, model: TransformerModel, x: _Shape) -> None:
    """Rotary positions on queries and keys, and their normalisation (`qk_layernorm`)."""
    if x.eager:
        return eager_ops.rope(w, x)
    if model.position_embedding_type == "rope":
        w.memory(2 * x.e * x.tokens * (x.heads + x.groups) * x.d)
    if model.qk_layernorm:
        w.memory(2 * x.e * x.tokens * (x.heads + x.groups) * x.d)


def _attention_forward(w: _Builder, model: TransformerModel, x: _Shape, flash: bool, overlap: bool) -> None:
    """The layer's first half: norm, QKV, attention core, output projection, residual."""
    _norm_forward(w, x)
    if model.multi_latent_attention:
        mla_forward(w, model, x, overlap)
    else:
        _enter_tp(w, x, overlap, len(w.rows))
        w.gemm(x.tokens, x.h, x.qkv)
        _rope(w, model, x)
    _attention_core_forward(w, model, x, flash)
    proj = w.gemm(x.tokens, x.heads * x.v_d, x.h)
    _leave_tp(w, x, proj, overlap)
    _residual_forward(w, model, x)


def _forward(model: TransformerModel, x: _Shape, flash: bool, overlap: bool, gemm_bytes: int) -> PassWork:
    w = _Builder(gemm_bytes)
    _attention_forward(w, model, x, flash, overlap)
    _norm_forward(w, x)
    _enter_tp(w, x, overlap, len(w.rows))
    w.gemm(x.tokens, x.h, x.mlp_in)
    _activation_forward(w, model, x)
    fc2 = w.gemm(x.tokens, x.ffn, x.h)
    _leave_tp(w, x, fc2, overlap)
    _residual_forward(w, model, x)
    return w.build()


def _column_backward(w: _Builder, x: _Shape, k_in: float, n_out: float, async_reduce: bool) -> None:
    """Backward of a column-parallel projection (k_in -> n_out per rank): input gradient,
    then weight gradient. The input-gradient all-reduce runs beside the weight gradient
    when `async_reduce` (Megatron's asynchronous all-reduce), else it blocks; with
    sequence parallelism the reduce-scatter runs beside the weight gradient and the
    input is re-gathered beside the input gradient."""
    dgrad = w.gemm(x.tokens, n_out, k_in)
    if x.sp:
        w.comm("all_gather", x.tokens * x.h * x.e, dgrad)
    wgrad = w.gemm(k_in, x.tokens, n_out, weight_grad=True)
    if x.t > 1:
        hidden = wgrad if (x.sp or async_reduce) else NOT_HIDDEN
        w.comm("reduce_scatter" if x.sp else "all_reduce", x.tokens * x.h * x.e, hidden)


def _row_backward(w: _Builder, x: _Shape, k_in: float, n_out: float, overlap: bool) -> None:
    """Backward of a row-parallel projection: with sequence parallelism its output
    gradient is first all-gathered (the backward of the reduce-scatter)."""
    dgrad_index = len(w.rows)
    if x.sp:
        w.comm("all_gather", x.tokens * x.h * x.e, dgrad_index if overlap else NOT_HIDDEN)
    w.gemm(x.tokens, n_out, k_in)
    w.gemm(k_in, x.tokens, n_out, weight_grad=True)


def _backward(model: TransformerModel, x: _Shape, flash: bool, overlap: bool, async_reduce: bool,
              gemm_bytes: int, accumulate: float) -> PassWork:
    w = _Builder(gemm_bytes, accumulate)
    _residual_backward(w, model, x)
    _row_bias_backward(w, model, x)
    _row_backward(w, x, x.ffn, x.h, overlap)  # fc2
    _activation_backward(w, model, x)
    _column_backward(w, x, x.h, x.mlp_in, async_reduce)  # fc1
    _norm_backward(w, x)
    _attention_backward(w, model, x, flash, overlap, async_reduce)
    return w.build()


def _attention_backward(w: _Builder, model: TransformerModel, x: _Shape, flash: bool, overlap: bool,
                        async_reduce: bool) -> None:
    """Backward of the layer's first half (`_attention_forward`)."""
    _residual_backward(w, model, x)
    _row_bias_backward(w, model, x)
    _row_backward(w, x, x.heads * x.v_d, x.h, overlap)  # output projection
    _attention_core_backward(w, model, x, flash)
    if model.multi_latent_attention:
        mla_backward(w, model, x, async_reduce)
    else:
        _rope(w, model, x)
        _column_backward(w, x, x.h, x.qkv, async_reduce)  # QKV
    _norm_backward(w, x)


def _selective_recompute(model: TransformerModel, x: _Shape, flash: bool, overlap: bool, gemm_bytes: int,
                         modules: tuple[str, ...]) -> PassWork:
    """What the backward recomputes with `recompute_granularity: selective`
    (`RunSettings.recompute_modules`, Megatron-Core's checkpointed modules)."""
    w = _Builder(gemm_bytes)
    if "layernorm" in modules:
        _norm_forward(w, x)
        _norm_forward(w, x)
    if "mla_up_proj" in modules:
        mla_up_forward(w, model, x, overlap)
    if "core_attn" in modules:
        _attention_core_forward(w, model, x, flash)
    if "mlp" in modules:  # the whole MLP, with its tensor-parallel collectives
        _enter_tp(w, x, overlap, len(w.rows))
        w.gemm(x.tokens, x.h, x.mlp_in)
        _activation_forward(w, model, x)
        fc2 = w.gemm(x.tokens, x.ffn, x.h)
        _leave_tp(w, x, fc2, overlap)
    return w.build()


def layer_activation_bytes(model: TransformerModel, settings: RunSettings, layer: int = 0) -> float:
    """Activations one layer keeps per micro-batch until its backward, per rank.

    Korthikanti et al. 2022, Table 2, from its parts (e = 2 bytes, masks 1 byte):
    norm inputs 2 x e sbh; QKV and first-MLP inputs 2 x e sbh (all three sharded by
    the sequence-parallel split); Q, K, V; the output-projection input e sbh/t; the
    MLP's inner activations; the attention scores (softmax output, dropout mask and
    output: (2e + 1) as^2 b / t) unless flash attention or selective recomputation
    drops them; the two dropout masks sbh. GPT with TP and SP: sbh(34/t + 5as/ht).
    Full recomputation keeps only the layer's input (e sbh, / t with SP). Selective
    recomputation drops what its modules recompute (`RunSettings.recompute_modules`):
    core_attn the scores, layernorm the norms' outputs (the QKV and first-MLP inputs),
    mla_up_proj the attention core's Q, K, V, mlp the MLP's inner activations. In an
    fp8 run the inputs of the QKV, output-projection, fc1 and fc2 GEMMs are kept in FP8
    (1 byte; `paraplan.predict.fp8_ops`)."""
    x = _shape(model, settings, layer)
    granularity = settings.recompute_granularity
    if granularity == "full":
        return x.e * x.sp_tokens * x.h
    if granularity == "selective" and settings.selective_ac_option == "op":
        return torchtitan_ac.op_sac_activation_bytes(x)
    recomputed = settings.recompute_modules if granularity == "selective" else ()
    split = x.sp_tokens * x.h  # sequence-parallel regions
    hidden_masks = 2 * MASK_BYTES * split if model.hidden_dropout > 0 else 0.0
    # fp8: Transformer Engine keeps the linear layers' inputs as their FP8 copies (`fp8_ops`)
    lin = FP8_OPERAND_BYTES if settings.dtype == "fp8" else x.e
    norm_outputs = 0.0 if "layernorm" in recomputed else 2 * lin * split  # QKV/fc1 inputs
    # norm inputs too (with sandwich_norm the two output norms' inputs, the sublayers' outputs)
    outside = model.layer_norms * x.e * split + norm_outputs + hidden_masks
    if model.multi_latent_attention:
        qkv = mla_activation_bytes(model, x, keep_qkv="mla_up_proj" not in recomputed)
    else:
        qkv = x.e * x.tokens * (x.heads + 2 * x.groups) * x.d
    proj_in = lin * x.tokens * x.heads * x.v_d
    mlp_inner = 0.0
    if "mlp" not in recomputed:
        act_in = FP8_OPERAND_BYTES if x.fp8_act_store else x.e  # the activation's saved input
        mlp_inner = (2 if model.gated_mlp else 1) * act_in * x.tokens * x.ffn + lin * x.tokens * x.ffn
    scores = 0.0
    flash = settings.use_flash_attn
    if flash:
        scores = FP32_BYTES * x.tokens * x.heads  # softmax statistics of this rank's queries
    elif "core_attn" not in recomputed:
        per = (2 * x.e + MASK_BYTES) if model.attention_dropout > 0 else x.e
        scores = per * x.b * x.heads * x.s * x.s
    eager = (eager_ops.extra_activation_bytes(x, "layernorm" not in recomputed, "mlp" not in recomputed)
             if x.eager else 0.0)
    return float(outside + qkv + proj_in + mlp_inner + scores + eager)


def accumulate_bytes_per_param(settings: RunSettings) -> float:
    """Memory traffic per weight of adding one micro-batch's weight gradient to the main
    gradient without `gradient_accumulation_fusion`: read the GEMM's 16-bit (or fp32)
    output, read and write the main gradient. Fused: none (the GEMM accumulates)."""
    if settings.gradient_accumulation_fusion:
        return 0.0
    return float(DTYPE_BYTES[settings.dtype] if settings.dtype != "fp8" else 2) + 2 * main_grad_bytes(settings)


def layer_work(model: TransformerModel, settings: RunSettings, layer: int = 0) -> LayerWork:
    """The work of transformer layer `layer` (0-based; layers differ only by their
    attention window, see the module doc)."""
    x = _shape(model, settings, layer)
    flash = settings.use_flash_attn
    overlap = settings.tp_comm_overlap
    gemm_bytes = DTYPE_BYTES[settings.dtype]
    forward = _forward(model, x, flash, overlap, gemm_bytes)
    granularity = settings.recompute_granularity
    if granularity == "full":
        recompute = forward
    elif granularity == "selective" and settings.selective_ac_option == "op":
        w = _Builder(gemm_bytes)
        torchtitan_ac.op_sac_recompute(w, x, lambda b: _norm_forward(b, x), lambda b: _rope(b, model, x),
                                       lambda b: _residual_forward(b, model, x),
                                       lambda b: _activation_forward(b, model, x))
        recompute = w.build()
    elif granularity == "selective":
        recompute = _selective_recompute(model, x, flash, overlap, gemm_bytes, settings.recompute_modules)
    else:
        recompute = _Builder(gemm_bytes).build()
    return LayerWork(
        forward=forward,
        backward=_backward(model, x, flash, overlap, settings.async_tensor_model_parallel_allreduce, gemm_bytes,
                           accumulate_bytes_per_param(settings)),
        recompute=recompute,
        activation_bytes=layer_activation_bytes(model, settings, layer),
    )
