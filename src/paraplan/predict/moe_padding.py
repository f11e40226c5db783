"""The routed experts' FP8 row padding: each local expert's tokens padded to a multiple
of 16 rows before its FP8 GEMMs and unpadded after them.

Megatron-Core's grouped experts (`TEGroupedMLP.forward`, `megatron/core/transformer/moe/
experts.py` at 0d8e0714, core_r0.15.0, the 25.11 container's) wrap the experts in an fp8
run with Transformer Engine's `Fp8Padding` and `Fp8Unpadding` (`pytorch/module/
fp8_padding.py`, `fp8_unpadding.py` at v2.9): the dispatched tokens and their routing
probabilities are padded per local expert to a multiple of the alignment (16 rows; 32
with MXFP8), the experts' output unpadded. Each is one `fused_multi_row_padding` or
`fused_multi_row_unpadding` kernel from one autograd function, forward and backward. The
padding returns its input untouched only when every expert's count is already aligned:
Megatron's `moe_router_padding_for_quantization` arranges that in the router, but no
Megatron-Bridge MoE recipe sets it (v0.2.0 to v0.5.0). Dropless routing, forced balancing
included (random logits), gives each expert a random count, so paraplan prices the
padding; with `moe_pad_expert_input_to_capacity` every count is the capacity
ceil(T k cf / E) times the EP (and gathered ETP) ranks, a host constant, and the padding
runs only when that is not aligned. torchao's Float8 (torchtitan) pads nothing.

Per MoE layer forward, N dispatched tokens on the rank of h e bytes and q bytes of
probability (`moe_bias.probs_bytes`): the tokens' padding (reads N h e, writes N h e), the
probabilities' (reads and writes N q), the output's unpadding (reads and writes N h e);
the padded rows themselves (under 16 per expert) are not counted. Backward: the
unpadding's backward pads the output gradient, the paddings' backward unpad the tokens'
and the probabilities' gradients: the same three kernels. Each kernel is one row of its
pass (one `host_kernel_s`, one `kernel_latency_s`, its bytes).
"""

from __future__ import annotations

import math

from paraplan.core.run_settings import RunSettings
from paraplan.predict.work import _Builder

ALIGN_ROWS = 16  # Transformer Engine's FP8 alignment of a GEMM's rows
MXFP8_ALIGN_ROWS = 32


def pads_fp8_rows(settings: RunSettings, routed_tokens: float, topk: int, experts: int, ranks: int) -> bool:
    """Whether Transformer Engine pads the local experts' rows (module doc); `ranks`: the
    EP ranks (times the ETP ranks when the tokens are gathered) each expert receives from."""
    if settings.dtype != "fp8" or settings.fp8_recipe.startswith("torchao"):
        return False
    if not settings.moe_pad_expert_input_to_capacity:
        return True
    align = MXFP8_ALIGN_ROWS if settings.fp8_recipe == "mxfp8" else ALIGN_ROWS
    capacity = math.ceil(routed_tokens * topk * float(settings.moe_expert_capacity_factor) / experts)
    return capacity * ranks % align != 0


def fp8_padding(w: _Builder, tokens: float, hidden: float, e: int, q: int) -> None:
    """The tokens' and the probabilities' padding: the forward's, or the backward's
    unpadding of their gradients (module doc)."""
    w.memory(2 * tokens * hidden * e)
    w.memory(2 * tokens * q)


def fp8_unpadding(w: _Builder, tokens: float, hidden: float, e: int) -> None:
    """The experts' output unpadded (forward), or its gradient padded (backward)."""
    w.memory(2 * tokens * hidden * e)
