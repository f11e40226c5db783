"""torchtitan's per-op selective activation checkpointing (`selective_ac_option op`
with `recompute_granularity selective`), for its Llama layer without tensor parallelism.

torchtitan (9dec370, December 2024, `parallelisms/parallelize_llama.py`) wraps each
transformer block in a checkpoint whose policy saves the outputs of the ops in its save
list (`aten.mm`, the SDPA flash and efficient attention kernels, reduce-scatter, and the
`abs`/`max` of Float8's scales) except every second `aten.mm` of the block (its count
restarts in each block), and recomputes every other op in the block's backward. A
Llama block runs its seven matmuls in the order wq, wk, wv, wo, w1, w3, w2: it keeps
the outputs of wq, wv, w1, w2 and of the attention kernel (with its log-sum-exp), and
its input; its backward re-runs the norms, the rotary embedding, `repeat_kv`, the first
residual add, SwiGLU's silu and product, and the wk, wo and w3 matmuls (everything the
backward needs that was not kept). Each elementwise op is priced as the run's
`elementwise_kernels` runs it (fused or eager).
"""

from __future__ import annotations

from collections.abc import Callable

from paraplan.predict.eager_ops import FP32, EagerShape
from paraplan.predict.work import _Builder

SacShape = EagerShape  # the same sizes of `paraplan.predict.layer_shape`


def op_sac_activation_bytes(x: SacShape) -> float:
    """What a layer keeps until its backward: its input, the outputs of wq, wv, w1 and
    w2, and the attention output with its fp32 log-sum-exp per query and head."""
    kept = (x.sp_tokens * x.h + x.tokens * x.heads * x.d + x.tokens * x.groups * x.d + x.tokens * x.heads * x.d
            + x.tokens * x.ffn + x.tokens * x.h)
    return x.e * kept + FP32 * x.tokens * x.heads


def op_sac_recompute(w: _Builder, x: SacShape, norm: Callable[[_Builder], None], rope: Callable[[_Builder], None],
                     residual: Callable[[_Builder], None], activation: Callable[[_Builder], None]) -> None:
    """The forward ops the backward re-runs, in order (`norm`, `rope`, `residual`,
    `activation`: the layer's elementwise kernels as the run prices them)."""
    norm(w)
    w.gemm(x.tokens, x.h, x.groups * x.d)  # wk
    rope(w)
    w.gemm(x.tokens, x.heads * x.d, x.h)  # wo
    residual(w)
    norm(w)
    w.gemm(x.tokens, x.h, x.ffn)  # w3
    activation(w)
