"""The routed experts' second bias, applied one local expert at a time.

Megatron-Core's grouped experts (`TEGroupedMLP`, `megatron/core/transformer/moe/experts.py`
at 0d8e0714, the core_r0.15.0 line of the 25.11 container, and unchanged at d7288711, the
26.04 container's) build fc2 with `skip_bias_add=True` when the experts have biases
(`add_bias_linear`, GPT-OSS): Transformer Engine's grouped GEMM returns the local experts'
biases instead of adding them, and `TEGroupedMLP._apply_bias` adds each expert's bias,
weighted by each token's routing probability, after the GEMM:

    torch.cat([t + b * p for t, b, p in zip(split(out, tokens_per_expert), biases,
                                              split(probs, tokens_per_expert))]).to(out.dtype)

Per MoE layer forward, with E_l local experts, N dispatched tokens on the rank
(n = N / E_l each), h the hidden size, e the output's bytes and q the probabilities'
(the router's output dtype: `MoeRouterSettings.router_logit_bytes`, 4 with the flex
dispatcher, which casts them to fp32 for DeepEP), r = max(e, q) the products' bytes
(PyTorch's type promotion):

- per expert: `b * p` (reads n q + h e, writes n h r) and `t + b p` (reads n h (e + r),
  writes n h r): 2 E_l framework calls;
- the concatenation (reads and writes N h r), and with r > e the cast back to e.

Its backward (PyTorch's autograd of these ops; the concatenation's backward is a view):
with r > e the cast's backward (reads N h e, writes N h r); per expert the gradient
through `b * p`: `grad * p` and its sum over the tokens for b (reads n h r + n q, writes
n h r; reads n h r), `grad * b` and its sum over h for p (the same, with h e read); with
r > e the cast of t's gradient back to e (reads n h r, writes n h e); then the two splits'
backward, each a concatenation: the output gradient (reads and writes N h e) and the
probabilities' (reads and writes N q): 4 E_l framework calls (5 E_l with r > e) and 2.

Each call is one row of its pass (`paraplan.predict.moe_ops`), priced like every other
kernel: one `host_kernel_s` on the host, one `kernel_latency_s` and its bytes on the device.
Nothing is saved for the backward beyond views of tensors already kept (the biases and
probabilities). Full recomputation and `recompute_modules moe` repeat the forward;
`moe_act` does not (the bias is applied outside its checkpoint).
"""

from __future__ import annotations

from paraplan.core.run_settings import RunSettings
from paraplan.predict.work import _Builder

FP32_BYTES = 4


def probs_bytes(settings: RunSettings) -> int:
    """Bytes of one routing probability as the experts receive it (module doc)."""
    return FP32_BYTES if settings.moe_token_dispatcher_type == "flex" else settings.router_logit_bytes


def expert_bias_forward(w: _Builder, tokens: float, local_experts: int, hidden: float, e: int, q: int) -> None:
    """`_apply_bias` forward on the rank's `tokens` dispatched tokens (module doc)."""
    n, r = tokens / local_experts, max(e, q)
    for _ in range(local_experts):
        w.memory(n * q + hidden * e + n * hidden * r)  # b * p
        w.memory(n * hidden * (e + 2 * r))  # t + b p
    w.memory(2 * tokens * hidden * r)  # torch.cat
    if r > e:
        w.memory(tokens * hidden * (r + e))  # .to(out.dtype)


def expert_bias_backward(w: _Builder, tokens: float, local_experts: int, hidden: float, e: int, q: int) -> None:
    """`_apply_bias` backward (module doc)."""
    n, r = tokens / local_experts, max(e, q)
    if r > e:
        w.memory(tokens * hidden * (e + r))  # the cast's backward
    for _ in range(local_experts):
        w.memory(n * hidden * 2 * r + n * q)  # grad * p
        w.memory(n * hidden * r + hidden * r)  # its sum over the tokens: b's gradient
        w.memory(n * hidden * 2 * r + hidden * e)  # grad * b
        w.memory(n * hidden * r + n * r)  # its sum over h: p's gradient
        if r > e:
            w.memory(n * hidden * (r + e))  # t's gradient cast back
    w.memory(2 * tokens * hidden * e)  # split's backward: the output gradient concatenated
    w.memory(2 * tokens * q)  # and the probabilities'
