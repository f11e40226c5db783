"""The work of the first and last pipeline stage beyond their transformer layers: the
word embedding (`embedding_work`) and the final norm, LM head and cross-entropy
(`head_work`), built with the same pass vocabulary as a layer (`paraplan.predict.ops`)."""

from __future__ import annotations

from paraplan.core.run_settings import DTYPE_BYTES, RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.layer_shape import _shape
from paraplan.predict.loss_ops import gathered_head_input_bytes, loss_backward, loss_forward
from paraplan.predict.ops import (
    FP32_BYTES,
    MASK_BYTES,
    NOT_HIDDEN,
    LayerWork,
    _Builder,
    _enter_tp,
    _norm_backward,
    _norm_forward,
    accumulate_bytes_per_param,
)


def embedding_work(model: TransformerModel, settings: RunSettings) -> LayerWork:
    """Word (and learned position) embedding on the first pipeline stage: a gather,
    an add and a dropout; vocabulary-parallel, so the partial lookups are summed
    over the tensor-parallel group. Backward scatters the gradient into the table."""
    x = _shape(model, settings)
    gemm_bytes = DTYPE_BYTES[settings.dtype]
    w = _Builder(gemm_bytes)
    w.memory(2 * x.e * x.tokens * x.h)  # gather rows
    if model.position_embedding_type == "learned_absolute":
        w.memory(3 * x.e * x.tokens * x.h)
    if x.t > 1:
        w.comm("reduce_scatter" if x.sp else "all_reduce", x.tokens * x.h * x.e)
    if model.hidden_dropout > 0:
        w.memory((2 * x.e + MASK_BYTES) * x.sp_tokens * x.h)
    forward = w.build()
    w = _Builder(gemm_bytes)
    if x.sp:
        w.comm("all_gather", x.tokens * x.h * x.e)
    if model.hidden_dropout > 0:
        w.memory((2 * x.e + MASK_BYTES) * x.sp_tokens * x.h)
    w.memory(3 * x.e * x.tokens * x.h)  # scatter-add into the table's gradient
    backward = w.build()
    mask = MASK_BYTES * x.sp_tokens * x.h if model.hidden_dropout > 0 else 0.0
    return LayerWork(forward, backward, _Builder(gemm_bytes).build(), mask)


def head_work(model: TransformerModel, settings: RunSettings) -> LayerWork:
    """Final norm, LM head and cross-entropy on the last pipeline stage. The head is
    vocabulary-parallel (V / t logits per rank); the loss is computed in fp32 in a
    few passes over the logits and small kernels over the tokens, as `cross_entropy_impl`
    runs it (`loss_ops`), with three small all-reduces of per-token values (Megatron's
    loss issues them with t = 1 too: host work, no transfer); it keeps one fp32 value per
    logit for its backward, which forms the gradient of the logits."""
    x = _shape(model, settings)
    vocab = model.padded_vocab_size(x.t) / x.t
    gemm_bytes = DTYPE_BYTES[settings.dtype]
    logits = x.tokens * vocab
    w = _Builder(gemm_bytes)
    _norm_forward(w, x)
    _enter_tp(w, x, settings.tp_comm_overlap, len(w.rows))
    w.gemm(x.tokens, x.h, vocab, high_precision=True)  # the output layer: no Transformer Engine module
    loss_forward(w, x.tokens, vocab, x.e, settings.cross_entropy_impl, x.t > 1)
    if x.t > 1 or settings.cross_entropy_impl == "megatron":  # Megatron issues them on a one-rank group too
        for _ in range(3):
            w.comm("all_reduce", FP32_BYTES * x.tokens)
    forward = w.build()
    w = _Builder(gemm_bytes, accumulate_bytes_per_param(settings))
    loss_backward(w, x.tokens, vocab, x.e, settings.cross_entropy_impl, x.t > 1)
    dgrad = w.gemm(x.tokens, vocab, x.h, high_precision=True)
    if x.sp:
        w.comm("all_gather", x.tokens * x.h * x.e, dgrad)
    wgrad = w.gemm(x.h, x.tokens, vocab, weight_grad=True, high_precision=True)
    if x.t > 1:
        hidden = wgrad if (x.sp or settings.async_tensor_model_parallel_allreduce) else NOT_HIDDEN
        w.comm("reduce_scatter" if x.sp else "all_reduce", x.tokens * x.h * x.e, hidden)
    _norm_backward(w, x)
    backward = w.build()
    held = 2 * x.e * x.sp_tokens * x.h + x.e * x.sp_tokens * x.h + FP32_BYTES * logits
    held += gathered_head_input_bytes(model, settings)  # torchtitan's DTensor head keeps the gathered input
    return LayerWork(forward, backward, _Builder(gemm_bytes).build(), held)
