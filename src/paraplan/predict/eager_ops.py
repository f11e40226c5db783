"""The memory-bound ops of a Llama layer as PyTorch runs them without fusion
(`RunSettings.elementwise_kernels` "eager": torchtitan with `training.compile` false).

`paraplan.predict.ops` prices the layer's norms, rotary embedding, activation and
residual adds as fused kernels (Transformer Engine's and Megatron's; torch.compile's
per-block fusion, torchtitan's `compile`, does the same work in as many kernels). In
eager mode each PyTorch op is one kernel that reads its inputs from and writes its
output to memory; this module lists those ops, one memory-bound kernel each, with
the bytes each moves, derived from torchtitan's Llama code of December 2024
(`torchtitan/models/norms.py`, `torchtitan/models/llama/model.py`) and the autograd
formulas of the ops (PyTorch's `derivatives.yaml`). The device model prices each
kernel with the calibration's memory efficiency and kernel latency, unchanged.

Sizes: `n` elements of the activation (tokens x width), `r` rows (tokens); e bytes
per activation element (2 in bf16), fp32 4. Vectors of the width (the norm weight,
the rotary table) are small beside `n` and their bytes are left out.

RMSNorm (`x * rsqrt(mean(x.float()^2) + eps)`, cast back, times the weight): forward
cast (e + 4) n, pow 8n, mean 4n + 4r, add eps and rsqrt 8r each, multiply 8n + 4r,
cast (4 + e) n, weight 2e n. Backward: weight product 2e n, the weight's gradient
(product 3e n, row sum e n), cast (e + 4) n, the rsqrt product's two gradients 8n + 4r
and 12n then a row sum 4n, rsqrt 12r, mean's expand 4n + 4r, pow's `grad * 2 x^1`
(8n, 8n, 12n), the two fp32 gradients added 12n, the cast back (4 + e) n.

Rotary (`view_as_complex(x.float()) * freqs_cis`, cast back) on queries and keys, per
tensor of m elements: cast (e + 4) m, complex product 8m, cast (4 + e) m; backward the
same three. `repeat_kv` copies keys and values to every query head (`expand` then
`reshape`, then summed back in the backward).

SwiGLU (`silu(w1 x) * w3 x`): silu 2e m, product 3e m; backward the product's two
gradients 3e m each and silu's 3e m. Residual add 3e n; backward the add of the two
gradients of the residual stream 3e n.
"""

from __future__ import annotations

from typing import Protocol

from paraplan.predict.work import _Builder

FP32 = 4


class EagerShape(Protocol):
    """The sizes of `paraplan.predict.layer_shape` that eager pricing reads."""

    @property
    def tokens(self) -> float: ...
    @property
    def sp_tokens(self) -> float: ...
    @property
    def h(self) -> float: ...
    @property
    def heads(self) -> float: ...
    @property
    def groups(self) -> float: ...
    @property
    def d(self) -> float: ...
    @property
    def ffn(self) -> float: ...
    @property
    def e(self) -> int: ...


def _kernels(w: _Builder, byte_counts: tuple[float, ...]) -> None:
    for nbytes in byte_counts:
        w.memory(nbytes)


def rms_norm_forward_bytes(n: float, r: float, e: int) -> tuple[float, ...]:
    """Bytes of each kernel of torchtitan's `RMSNorm.forward` on n elements in r rows."""
    f = FP32
    return ((e + f) * n, 2 * f * n, f * n + f * r, 2 * f * r, 2 * f * r, 2 * f * n + f * r, (f + e) * n, 2 * e * n)


def rms_norm_backward_bytes(n: float, r: float, e: int) -> tuple[float, ...]:
    """Bytes of each kernel autograd runs for `rms_norm_forward_bytes`' ops."""
    f = FP32
    return (2 * e * n, 3 * e * n, e * n, (e + f) * n, 2 * f * n + f * r, 3 * f * n, f * n, 3 * f * r,
            f * n + f * r, 2 * f * n, 2 * f * n, 3 * f * n, 3 * f * n, (f + e) * n)


def rope_forward_bytes(m: float, e: int) -> tuple[float, ...]:
    """Bytes of each kernel of `apply_rotary_emb` on one tensor of m elements."""
    return ((e + FP32) * m, 2 * FP32 * m, (FP32 + e) * m)


def swiglu_forward_bytes(m: float, e: int) -> tuple[float, ...]:
    """`silu(a) * b` on m elements: silu, product."""
    return (2 * e * m, 3 * e * m)


def swiglu_backward_bytes(m: float, e: int) -> tuple[float, ...]:
    """The product's gradients to both inputs, then silu's backward."""
    return (3 * e * m, 3 * e * m, 3 * e * m)


def norm_forward(w: _Builder, x: EagerShape) -> None:
    _kernels(w, rms_norm_forward_bytes(x.sp_tokens * x.h, x.sp_tokens, x.e))


def norm_backward(w: _Builder, x: EagerShape) -> None:
    _kernels(w, rms_norm_backward_bytes(x.sp_tokens * x.h, x.sp_tokens, x.e))


def rope(w: _Builder, x: EagerShape) -> None:
    """Forward or backward of the rotary embedding of queries and keys, and the copy
    (or, backward, the sum) of `repeat_kv` when keys and values have fewer heads."""
    for heads in (x.heads, x.groups):
        _kernels(w, rope_forward_bytes(x.tokens * heads * x.d, x.e))
    if x.groups < x.heads:
        for _ in ("keys", "values"):
            w.memory(x.e * x.tokens * (x.heads + x.groups) * x.d)


def activation_forward(w: _Builder, x: EagerShape) -> None:
    _kernels(w, swiglu_forward_bytes(x.tokens * x.ffn, x.e))


def activation_backward(w: _Builder, x: EagerShape) -> None:
    _kernels(w, swiglu_backward_bytes(x.tokens * x.ffn, x.e))


def residual(w: _Builder, x: EagerShape) -> None:
    """The residual add, or in the backward the add of the residual stream's two gradients."""
    w.memory(3 * x.e * x.sp_tokens * x.h)


def extra_activation_bytes(x: EagerShape, norms_kept: bool, mlp_kept: bool) -> float:
    """What eager autograd keeps per layer beyond the fused kernels' saved tensors
    (`paraplan.predict.ops.layer_activation_bytes`): each norm keeps its fp32 copy of
    the input (for pow and the product) and the 1 / rms per row, and the cast output
    for the weight's gradient in place of the bf16 input (+4n + 4r); silu keeps its
    output for the product's
    backward (+e m). A recomputed module keeps none."""
    n, r = x.sp_tokens * x.h, x.sp_tokens
    norms = 2 * (FP32 * n + FP32 * r) if norms_kept else 0.0
    mlp = x.e * x.tokens * x.ffn if mlp_kept else 0.0
    return norms + mlp
