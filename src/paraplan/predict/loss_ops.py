"""The cross-entropy loss on the last pipeline stage as each implementation runs it
(`RunSettings.cross_entropy_impl`): its memory-bound passes over the logits, forward
(`loss_forward`) and backward (`loss_backward`), which `edge_ops.head_work` prices, and
the bytes it allocates for a moment beyond what it keeps for the backward
(`loss_transient_bytes`, which `rank_state.rank_memory` adds to the last stage's peak).

Both implementations keep one fp32 value per logit for the backward (the softmax, or its
logarithm), which `head_work` counts as held activation. Per logit, with `e` bytes per
activation (2 for bf16, fp16 and fp8 runs, whose logits are 16-bit):

- `megatron`: Megatron-Core's `tensor_parallel.vocab_parallel_cross_entropy`
  (megatron/core/tensor_parallel/cross_entropy.py; Megatron-LM's default, no
  `--cross-entropy-loss-fusion`). `.float()` copies the logits into the fp32 buffer that
  becomes the kept softmax (max subtracted, exp and normalisation in place); the caller
  (`GPTModel.forward`) still references the 16-bit logits meanwhile: e transient bytes.
  Backward forms softmax - one-hot in place in that buffer and autograd casts it to the
  logits' dtype beside it: e again. An fp32 run's `.float()` copies nothing and the
  gradient is not cast: 0. Its kernels (`megatron_loss_kernels`), one launch each, as
  `GPTModel.compute_language_model_loss` and `_VocabParallelCrossEntropy` issue them
  (Megatron-LM d98e8a6, Aug 2026; the aten ops checked by running the source on CPU):
  forward, over the logits, the cast (e + 4; none in fp32), max (4), subtract the max in
  place (8), exp in place (8), sum (4) and the division that leaves the softmax for the
  backward (8): 36 + e; over the tokens, the labels' transpose copy, the target mask
  (`<`, `>=`, `|`), the masked target (clone, subtract, masked fill), the predicted
  logit (arange, gather, clone, masked fill), the loss (log, subtract) and its transpose
  copy: 14 small kernels. Backward: over the tokens, arange, the mask's cast, `1 -`, and
  the one-hot subtract (gather, subtract, scatter: `grad_2d[arange_1d, masked_target_1d]
  -= softmax_update`): 6; over the logits, the in-place multiply by `grad_output` (8)
  and autograd's cast back (4 + e; none in fp32): 12 + e. The three small all-reduces
  (max, predicted logit, sum of exponentials) are issued even with t = 1, on a group of
  one rank: NCCL moves nothing there, the host issues them (`head_work`). Older versions
  run the same passes: Megatron-LM of Aug 2021 (6985e589, megatron/mpu/cross_entropy.py,
  what the SC21 rows ran) has the caller's `.float()` and the [b, s] layout, without the
  two transpose copies (12 small forward kernels); Megatron-DeepSpeed
  (megatron/core/tensor_parallel/cross_entropy.py, what vTrain's runs ran) subtracts the
  max out of place, the same bytes and launches but a second fp32 buffer for a moment
  (e + 4 transient). paraplan has no setting for the framework version and models
  Megatron-Core's code (docs/execution-model.md).
- `torch`: PyTorch's `torch.nn.functional.cross_entropy` on an fp32 copy of the logits,
  as torchtitan calls it (train.py at 9dec370, Dec 2024: `cross_entropy(pred.flatten(0,
  1).float(), labels.flatten(0, 1))`, with `pred` referenced by the training loop until
  `del pred` after the loss). Forward: the e-byte logits, their fp32 copy (4) and
  log_softmax's kept output at once: e + 4 transient (4 for an fp32 run, whose
  `.float()` is the logits themselves). Backward: nll_loss's fp32 gradient (zeros with
  -1/N at the targets) and log_softmax's fp32 input gradient beside the kept output:
  8, the larger. Then the kept output and nll's gradient are freed before the cast to e
  bytes (4 + e <= 8). Passes from PyTorch's CUDA kernels (aten/src/ATen/native/cuda/
  SoftMax.cu, `cunn_SoftMaxForward` / `cunn_SoftMaxBackward`, the kernels for a row of
  128K fp32 values, too long for the shared-memory variant): the cast (e + 4),
  log_softmax (reads the row three times, for the max, the sum of exponentials and the
  output, and writes it: 16); backward the zero-filled nll gradient (4), log_softmax's
  backward (reads the gradient for its sum, then the gradient and the output, writes the
  input gradient: 16) and the cast (4 + e).
  With t > 1 torchtitan's default loss parallelism runs instead (the logits a DTensor
  sharded over the vocabulary; torch/distributed/tensor/parallel/loss.py, the same in
  the 2024 and 2026 versions read): `_log_softmax` forms `shifted = x - max` and
  `exp(shifted)` beside the fp32 copy, then `result = shifted - logsumexp`: e + 8 beyond
  the kept result; `_nll_loss_and_log_softmax_backward` returns `(zeros_like(x) with -1
  at the targets + exp(x)) * grad_output`, three fp32 tensors beside the kept x at its
  peak: 12, the larger. Its passes are PyTorch's elementwise kernels: forward the cast,
  max (4), subtract (8), exp (8), sum (4), subtract (8); backward the zero fill (4), exp
  (8), add (12), multiply (8) and the cast. With p > 1 the loss runs under
  `torch.distributed.pipelining`, which keeps each micro-batch's logits to the
  iteration's end (`paraplan.predict.torch_pipelining`), counted there: the loss's
  transient beyond them is the same, the backward's 8 bytes per logit (12 under loss
  parallelism), which does not include the logits and exceeds the forward's moment
  with or without them (e + 4, or e + 8).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.layer_shape import _shape
from paraplan.predict.ops import FP32_BYTES, _Builder

NLL_GRAD_BYTES = FP32_BYTES  # nll_loss's gradient of log_softmax's output (fp32)
SOFTMAX_PASS_BYTES = 4 * FP32_BYTES  # PyTorch's row softmax: three reads and one write, forward and backward
INDEX_BYTES = 8  # a target or row index (int64)
BOOL_BYTES = 1  # an entry of the target mask


@dataclass(frozen=True)
class LossKernel:
    """One kernel of the loss (one launch): the bytes it reads and writes per logit (the
    V / t columns of every token) and per token (the row's scalars, targets and masks)."""

    op: str  # the source's expression
    logit_bytes: int = 0
    token_bytes: int = 0


def megatron_loss_kernels(e: int) -> tuple[tuple[LossKernel, ...], tuple[LossKernel, ...]]:
    """Forward and backward kernels of Megatron-Core's loss over logits of `e` bytes, in
    the order the source issues them (module doc); an fp32 run has no casts."""
    f, i, m = FP32_BYTES, INDEX_BYTES, BOOL_BYTES
    cast = e != FP32_BYTES
    forward = (
        LossKernel("labels.transpose(0, 1).contiguous()", token_bytes=2 * i),
        *((LossKernel("vocab_parallel_logits.float()", logit_bytes=e + f),) if cast else ()),
        LossKernel("torch.max(dim=-1)", logit_bytes=f, token_bytes=f + i),  # values and indices
        LossKernel("vocab_parallel_logits -= logits_max", logit_bytes=2 * f, token_bytes=f),
        LossKernel("target < vocab_start_index", token_bytes=i + m),
        LossKernel("target >= vocab_end_index", token_bytes=i + m),
        LossKernel("|", token_bytes=3 * m),
        LossKernel("target.clone()", token_bytes=2 * i),
        LossKernel("- vocab_start_index", token_bytes=2 * i),
        LossKernel("masked_target[target_mask] = 0", token_bytes=2 * i + m),  # masked_fill_
        LossKernel("torch.arange", token_bytes=i),
        LossKernel("logits_2d[arange_1d, masked_target_1d]", token_bytes=2 * i + 2 * f),
        LossKernel("predicted_logits_1d.clone()", token_bytes=2 * f),
        LossKernel("predicted_logits[target_mask] = 0.0", token_bytes=2 * f + m),
        LossKernel("torch.exp(out=vocab_parallel_logits)", logit_bytes=2 * f),
        LossKernel("exp_logits.sum(dim=-1)", logit_bytes=f, token_bytes=f),
        LossKernel("torch.log(sum_exp_logits)", token_bytes=2 * f),
        LossKernel("- predicted_logits", token_bytes=3 * f),
        LossKernel("exp_logits.div_(sum_exp_logits)", logit_bytes=2 * f, token_bytes=f),  # the kept softmax
        LossKernel("loss.transpose(0, 1).contiguous()", token_bytes=2 * f),
    )
    backward = (
        LossKernel("torch.arange", token_bytes=i),
        LossKernel("target_mask.float()", token_bytes=m + f),
        LossKernel("1.0 - target_mask", token_bytes=2 * f),
        LossKernel("grad_2d[arange_1d, masked_target_1d]", token_bytes=2 * i + 2 * f),
        LossKernel("-= softmax_update", token_bytes=3 * f),
        LossKernel("grad_2d[arange_1d, masked_target_1d] =", token_bytes=2 * i + 2 * f),  # index_put_
        LossKernel("grad_input.mul_(grad_output)", logit_bytes=2 * f, token_bytes=f),
        *((LossKernel("cast to the logits' dtype", logit_bytes=f + e),) if cast else ()),
    )
    return forward, backward


def _issue(w: _Builder, kernels: tuple[LossKernel, ...], tokens: float, vocab: float) -> None:
    for kernel in kernels:
        w.memory(kernel.logit_bytes * tokens * vocab + kernel.token_bytes * tokens)


def loss_forward(w: _Builder, tokens: float, vocab: float, e: int, impl: str, loss_parallel: bool = False) -> None:
    """The loss's forward passes over `tokens` x `vocab` logits of `e` bytes (module doc);
    `loss_parallel`: torchtitan's vocabulary-parallel `torch` loss (t > 1)."""
    logits = tokens * vocab
    if impl == "torch":
        if e != FP32_BYTES:
            w.memory((e + FP32_BYTES) * logits)  # .float()
        if loss_parallel:
            for nbytes in (1, 2, 2, 1, 2):  # max, subtract, exp, sum, subtract logsumexp (kept)
                w.memory(nbytes * FP32_BYTES * logits)
            return
        w.memory(SOFTMAX_PASS_BYTES * logits)  # log_softmax (kept for backward)
        return
    _issue(w, megatron_loss_kernels(e)[0], tokens, vocab)


def loss_backward(w: _Builder, tokens: float, vocab: float, e: int, impl: str, loss_parallel: bool = False) -> None:
    """The loss's backward passes: the gradient of the logits, cast back to e bytes."""
    logits = tokens * vocab
    if impl == "torch":
        w.memory(NLL_GRAD_BYTES * logits)  # nll_loss's zero-filled gradient
        if loss_parallel:
            for nbytes in (2, 3, 2):  # exp(x), + the one-hot, x grad_output
                w.memory(nbytes * FP32_BYTES * logits)
        else:
            w.memory(SOFTMAX_PASS_BYTES * logits)  # log_softmax's backward
        if e != FP32_BYTES:
            w.memory((FP32_BYTES + e) * logits)  # cast to the logits' dtype
        return
    _issue(w, megatron_loss_kernels(e)[1], tokens, vocab)


def gathered_head_input_bytes(model: TransformerModel, settings: RunSettings) -> float:
    """What torchtitan's DTensor output layer keeps beyond Megatron's for its weight
    gradient (`cross_entropy_impl torch` with t > 1): `ColwiseParallel(input_layouts=
    Shard(1))` (torchtitan 9dec370 `parallelize_llama.apply_tp`) redistributes the final
    norm's sequence-parallel output to `Replicate()` (an all-gather) before the matmul,
    whose autograd saves that gathered input, e x tokens x h, where Megatron's
    `ColumnParallelLinear` saves its sequence shard (e x tokens / t x h) and gathers it
    again in the backward: e x (tokens - tokens / t) x h more per micro-batch, until the
    head's backward (0 without sequence parallelism or with Megatron's loss)."""
    if settings.cross_entropy_impl != "torch":
        return 0.0
    x = _shape(model, settings)
    return float(x.e * (x.tokens - x.sp_tokens) * x.h)


def loss_transient_bytes_per_logit(e: int, impl: str, loss_parallel: bool = False) -> int:
    """Bytes per logit the loss allocates beyond the fp32 value it keeps (module doc)."""
    if impl == "torch":
        copy = 0 if e == FP32_BYTES else FP32_BYTES  # an fp32 run's .float() is the logits
        if loss_parallel:  # forward: logits, copy, shifted and exp(shifted) (or the result); backward: three
            return max(e + copy + FP32_BYTES, 3 * FP32_BYTES)
        return max(e + copy, NLL_GRAD_BYTES + FP32_BYTES)
    return 0 if e == FP32_BYTES else e


def loss_transient_bytes(model: TransformerModel, settings: RunSettings) -> float:
    """The loss's transient bytes on one rank of the last stage for one micro-batch:
    `loss_transient_bytes_per_logit` x its logits (tokens x V / t)."""
    x = _shape(model, settings)
    logits = x.tokens * model.padded_vocab_size(x.t) / x.t
    return float(loss_transient_bytes_per_logit(x.e, settings.cross_entropy_impl, x.t > 1) * logits)
