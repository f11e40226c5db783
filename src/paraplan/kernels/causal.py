"""A causal attention backward pass where only the non-causal one was published.

The FlashAttention-3 paper publishes H100 backward TFLOP/s without the causal mask only,
and forward TFLOP/s with and without it. A causal kernel skips the masked tiles in both
passes with the same tiling, so the mask costs the backward the share of throughput it
costs the forward at the same sequence length and head dimension:

    causal bwd TFLOP/s = non-causal bwd TFLOP/s x causal fwd TFLOP/s / non-causal fwd TFLOP/s

(TFLOP/s as the published figures count them: causal FLOPs halved). Checked on
FlashAttention-2 at head dim 128 on H100, whose causal forward+backward is published too
(`data/published/attention/flash2_fwd_bwd.csv`): the derived rows price its causal
forward+backward 3-12% slow (the backward loses less to the mask than the forward), so a
ceiling fitted on them is conservative. Where a causal backward or forward+backward is measured at that sequence
length and head dimension, nothing is derived.
"""

from __future__ import annotations

import numpy as np

from paraplan.kernels.results import AttentionTimes, attention_flops


def with_causal_backward(times: AttentionTimes) -> tuple[AttentionTimes, int]:
    """`times` plus a derived causal backward row for every (head_dim, seq_length) that
    has a non-causal backward and both forward rows but no causal backward or
    forward+backward (see the module doc); returns the rows and how many were derived."""
    tflops = times.flops / times.time_s

    def rate(attention_pass: str, causal: bool, head_dim: float, seq: float) -> float | None:
        hit = np.flatnonzero((times.attention_pass == attention_pass) & (times.causal == causal)
                             & (times.head_dim == head_dim) & (times.seq_length == seq))
        return float(tflops[hit[0]]) if hit.size else None

    derived: list[tuple[float, float, float, float, float]] = []  # batch, heads, seq, head_dim, time_s
    for i in np.flatnonzero((times.attention_pass == "bwd") & ~times.causal.astype(bool)):
        d, s = float(times.head_dim[i]), float(times.seq_length[i])
        fwd_causal, fwd_full = rate("fwd", True, d, s), rate("fwd", False, d, s)
        measured = rate("bwd", True, d, s) is not None or rate("fwd_bwd", True, d, s) is not None
        if measured or fwd_causal is None or fwd_full is None:
            continue
        b, h = float(times.batch[i]), float(times.heads[i])
        derived_rate = float(tflops[i]) * fwd_causal / fwd_full
        derived.append((b, h, s, d, attention_flops(b, h, s, d, True, "bwd") / derived_rate))
    if not derived:
        return times, 0
    col = np.array(derived).T
    n = col.shape[1]
    return AttentionTimes(
        times.device, times.dtype,
        np.concatenate([times.attention_pass, np.full(n, "bwd", dtype=object)]),
        np.concatenate([times.batch, col[0]]), np.concatenate([times.heads, col[1]]),
        np.concatenate([times.seq_length, col[2]]), np.concatenate([times.head_dim, col[3]]),
        np.concatenate([times.causal, np.ones(n, dtype=bool)]), np.concatenate([times.time_s, col[4]])), n
