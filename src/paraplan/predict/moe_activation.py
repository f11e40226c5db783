"""GPT-OSS's clamped gated activation in the routed experts, as Megatron-Core runs it.

Megatron-Bridge's GPT-OSS provider (v0.2.0, `gpt_oss_provider.py`) sets `quick_gelu`,
`glu_linear_offset` 1.0, `activation_func_clamp_value` 7.0 and `bias_activation_fusion`, so
the grouped experts (`TEGroupedMLP`, `experts.py` at 0d8e0714, the 25.11 container's
core_r0.15.0 line) call `weighted_bias_quick_geglu_impl` (`fusions/fused_bias_geglu.py`),
which before its fused kernel (priced as every gated activation, `moe_ops._act_forward`):

- clamps the gate half above and the linear half on both sides (`clamp`, two calls, each
  reading and writing N f e bytes: N dispatched tokens on the rank, f the expert width,
  e the activation's bytes) and concatenates them again (`torch.cat`, 2 N f e each way);
- builds the linear offset on the device, `torch.tensor(linear_offset, device=...)`: a
  host-to-device copy of a Python scalar, which PyTorch performs with `non_blocking=False`
  and then synchronises the stream (`memcpy_and_sync`): the host waits until the device
  has run everything queued, and the device then idles while the host issues the fused
  kernel (a host wait with nothing queued, `PassCost.sync_idle_s`).

Backward (PyTorch's autograd): the concatenation's backward is two views; the gate's
clamp backward is a comparison and a `where` (reads N f e, writes an N f mask; reads the
mask and the gradient, writes N f e), the linear half's two comparisons, their
`logical_and_` and a `where`; the chunk's backward concatenates the two gradients
(2 N f e each way): 7 calls, 11 N f e + 8 N f bytes.

Memory: the fused kernel saves its input, the concatenation, while the clamps keep fc1's
output (their input) alive: N 2f e bytes beyond the unclamped activation's
(`moe_ops.moe_activation_bytes`). `recompute_modules moe_act` runs the activation under a
checkpoint without gradients (nothing saved, the clamp, copy and wait repeated in the
recomputation).

Each call is one row of its pass (one `host_kernel_s`, one `kernel_latency_s`, its bytes).
"""

from __future__ import annotations

from paraplan.predict.work import _Builder

MASK_BYTES = 1  # a comparison's bool


def clamp_forward(w: _Builder, tokens: float, width: float, e: int, scalar_bytes: int) -> None:
    """The clamps, the concatenation and the offset's copy with its wait (module doc);
    `width` f, one half of fc1's output."""
    w.memory(2 * tokens * width * e)  # the gate's clamp
    w.memory(2 * tokens * width * e)  # the linear half's clamp
    w.memory(4 * tokens * width * e)  # torch.cat
    w.memory(scalar_bytes)  # torch.tensor(linear_offset, device=...)
    w.host_syncs.append((len(w.rows), len(w.rows)))


def clamp_backward(w: _Builder, tokens: float, width: float, e: int) -> None:
    """The clamps' backward and the chunk's (module doc)."""
    n = tokens * width
    w.memory(n * e + n * MASK_BYTES)  # gate <= limit
    w.memory(n * MASK_BYTES + 2 * n * e)  # where
    w.memory(n * e + n * MASK_BYTES)  # linear >= -limit
    w.memory(n * e + n * MASK_BYTES)  # linear <= limit
    w.memory(3 * n * MASK_BYTES)  # logical_and_
    w.memory(n * MASK_BYTES + 2 * n * e)  # where
    w.memory(4 * n * e)  # the chunk's backward: torch.cat


def clamp_saved_bytes(tokens: float, fc1_width: float, e: int) -> float:
    """What the clamped activation keeps beyond the unclamped one: fc1's output."""
    return tokens * fc1_width * e
