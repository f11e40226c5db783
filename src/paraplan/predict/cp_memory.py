"""What context-parallel attention allocates for a while, on one rank for one
micro-batch, beyond what one flash-attention call over the rank's tokens keeps or
returns (the layer's activations count its queries, keys, values and output once,
`ops.layer_activation_bytes`); `rank_state.rank_memory` adds it to the working set of
the forward and backward moments of a stage with transformer layers.

Sizes as in `paraplan.predict.cp_ops` (heads per tensor-parallel rank, c = context
parallel ranks, e bytes per element, L = b s / c local tokens): n = L a d query (and
output) elements, m = L g d key (or value) elements, rows = L a softmax rows, fp32
accumulators 4 bytes per element. Each pass is priced on the rank that holds the most
(the last CP rank for the ring variants, whose calls all take whole query blocks), and
its buffers are counted together at their largest: an upper bound of the moments inside
the pass, off by at most one call's outputs.

`torch_allgather` / `torch_alltoall` (PyTorch's `context_parallel`,
torch/distributed/tensor/experimental/_attention.py, late-2024 version: with torchtitan
the keys and values carry every query head, `cp_ops.torch_cp_shape`, so m = n):
- forward: the keys and values of every rank, all-gathered once and held until the pass
  returns (`_AllGatherRotater`: 2 e m c), or with `alltoall` the block in use, the flat
  copy being sent and the block being received (`_AllToAllRotater`, 3 x 2 e m); the
  fp32 merge (`_SDPAMerger`): the running fp32 result, the call's output and its fp32
  cast, and eagerly the two fp32 temporaries of `out - sigmoid(..) * (out - block_out)`,
  (e + 4 x 4) n, or fused under torch.compile the new result beside the old, (e + 2 x 4) n;
- backward: the same key/value rotation, the fp32 dQ sum (4 n), the fp32 dK/dV ring
  (`dkv_rotater`, all-to-all whatever the rotate method): the block received, and the
  flat copy sent on, with eagerly the block rebuilt by `_partial_update` beside them
  (3 x 2 x 4 m; fused 2 x 2 x 4 m), and one call's dQ, dK, dV (e (n + 2m)).
At CP 8 for Llama 3.1 8B (L = 32,768, a = g = 32 after `repeat_kv`, d = 128) the
gathered keys and values alone are 2 x 2 x 134M x 8 = 4.3 GB.

Megatron-Core's context parallelism (Transformer Engine's `AttnFuncWithCPAndKVP2P`,
`AttnFuncWithCPAndKVAllGather`, `AttnFuncWithCPAndQKVOA2A`,
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py, TE at
d0067d0, Aug 2026, 16-bit path, `sbhd`):
- `p2p` forward: every step's key/value buffer stays in `p2p_comm_buffers` until the
  pass returns (c of them, the last saved for the backward) and the caller still holds
  the keys and values it passed: c x 2 e m beyond the saved one; every step's output and
  fp32 logsumexp stay in `out_per_step` / `softmax_lse_per_step` for the correction
  after the last step: c (e n + 4 rows);
- `p2p` backward: two double buffers of keys/values and their gradients
  (`p2p_comm_buffers`, 2 x [2, kv]: 4 x 2 e m, one of which is returned as dK/dV) and one
  step's dQ, dK, dV: 3 x 2 e m + e (n + 2m);
- `all_gather` forward: the gathered keys and values (2 e m c) and, while they are
  reordered by `index_select`, one more gathered tensor (e m c), or during the two steps
  the zeroed output and a step's output (2 e n): 2 e m c + max(e m c, 2 e n);
- `all_gather` backward: the gathered keys and values, the zeroed full-length dK and dV
  and the two steps' dK and dV over their key ranges (together the whole sequence and
  one chunk: (2c + 1) / 2c of it), (2 + 2 + (2c + 1) / c) e m c, and the steps' dQ (e n);
- `a2a` forward: the keys, queries and values the caller passed and their head-major
  copies beside the all-to-all's outputs: 2 e (n + 2m); backward: the output gradient's
  copies (2 e n) and the head-major copies of dQ, dK, dV for their all-to-all, e (n + 2m).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.cp_ops import FP32_BYTES, TORCH_ROTATE_METHODS, AttentionShape, torch_cp_shape
from paraplan.predict.layer_shape import _shape


@dataclass(frozen=True)
class CpTransientBytes:
    """Bytes the attention of one layer allocates for a while under context
    parallelism, in its forward and in its backward (module doc)."""

    forward_bytes: float = 0.0
    backward_bytes: float = 0.0
    recomputed: bool = False  # the attention's forward runs again in the backward (`attention_recomputed`)

    @property
    def backward_moment_bytes(self) -> float:
        """What a backward holds of it: the backward's buffers, or the recomputed forward's
        when larger."""
        return max(self.forward_bytes, self.backward_bytes) if self.recomputed else self.backward_bytes


def _sizes(x: AttentionShape) -> tuple[float, float, float]:
    """n, m, rows: query elements, key (or value) elements and softmax rows of the rank."""
    rows = x.local_tokens * x.heads
    return rows * x.d, x.local_tokens * x.groups * x.d, rows


def torch_cp_transient(shape: AttentionShape, rotate: str) -> CpTransientBytes:
    """PyTorch's context parallelism (module doc), `rotate` allgather or alltoall."""
    x = torch_cp_shape(shape)
    n, m, _ = _sizes(x)
    e, f, c = x.e, FP32_BYTES, x.cp
    kv = 2 * e * m * c if rotate == "allgather" else 3 * 2 * e * m
    merge = (e + 2 * f) * n if x.compiled else (e + 4 * f) * n
    dkv_ring = (2 if x.compiled else 3) * 2 * f * m
    return CpTransientBytes(kv + merge, kv + f * n + dkv_ring + e * (n + 2 * m))


def te_cp_transient(shape: AttentionShape, cp_comm_type: str) -> CpTransientBytes:
    """Transformer Engine's context-parallel attention (module doc)."""
    n, m, rows = _sizes(shape)
    e, f, c = shape.e, FP32_BYTES, shape.cp
    if cp_comm_type == "p2p":
        return CpTransientBytes(c * (2 * e * m + e * n + f * rows), 3 * 2 * e * m + e * (n + 2 * m))
    if cp_comm_type == "all_gather":
        gathered = 2 * e * m * c
        steps = (2 * c + 1) / (2 * c) * gathered
        return CpTransientBytes(gathered + max(e * m * c, 2 * e * n), 2 * gathered + steps + e * n)
    if cp_comm_type == "a2a":
        return CpTransientBytes(2 * e * (n + 2 * m), 2 * e * n + e * (n + 2 * m))
    raise ValueError(f"cp_comm_type {cp_comm_type!r} has no memory model")  # RunSettings checks the choices


def cp_transient(shape: AttentionShape, cp_comm_type: str) -> CpTransientBytes:
    """The attention's transient under `cp_comm_type` (none without context parallelism)."""
    if shape.cp <= 1:
        return CpTransientBytes()
    if cp_comm_type in TORCH_ROTATE_METHODS:
        return torch_cp_transient(shape, TORCH_ROTATE_METHODS[cp_comm_type])
    return te_cp_transient(shape, cp_comm_type)


def attention_recomputed(settings: RunSettings) -> bool:
    """Whether the backward runs the attention's forward again (`ops.layer_work`): full
    recomputation, or Megatron's selective recomputation of `core_attn`; torchtitan's
    per-op policy saves flash attention's outputs."""
    if settings.recompute_granularity == "full":
        return True
    return (settings.recompute_granularity == "selective" and settings.selective_ac_option != "op"
            and "core_attn" in settings.recompute_modules)


def layer_cp_transient(model: TransformerModel, settings: RunSettings) -> CpTransientBytes:
    """The transient of one layer's attention as the run's settings shape it."""
    got = cp_transient(_shape(model, settings).attention_shape(), settings.cp_comm_type)
    return replace(got, recomputed=attention_recomputed(settings))
