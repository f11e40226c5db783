"""The attention core of one layer under context parallelism (Megatron-Core's
`context_parallel_size` c, Transformer Engine's fused attention), on one rank for one
micro-batch: its kernels and its collectives over the context-parallel group.

Every rank holds s / c tokens of each sequence. Causal load balancing, as Megatron
does it: the sequence is cut into 2c chunks and rank i holds chunks i and 2c-1-i, so
that every rank, and every step of the ring, does the same work: one causal
attention over s tokens costs 4 b a s^2 d / 2 FLOPs (a query heads of width d), and
each rank does 1 / c of it.

`p2p` (ring attention): c steps; in each the rank's queries meet one rank's key/value
block (its own first, then the one received from its ring neighbour). With the
balanced chunks each step is two (s / 2c) x (s / 2c) blocks of work, i.e.
4 b a d (s / c)^2 / 2 FLOPs, equal for every step. The block for step k + 1 travels
during step k (c - 1 transfers of 2 (s / c) b g d e bytes, keys and values of the g
key/value heads, e bytes per element), each beside that step's kernel. Each step is
one attention call over s / c queries and keys (its efficiency is that of a sequence
of s / c, `device_model.attention_efficiency`); each step after the first merges its
partial output into the fp32 accumulator (a memory-bound pass).
The backward runs the same ring, each transfer carrying the key/value block and its
accumulated gradient (twice the forward's bytes); the step kernels are flash
attention's backward (2.5 x the forward's FLOPs).

`a2a` (Ulysses): an all-to-all turns the rank's s / c tokens of all a heads into all
s tokens of a / c heads (Q, K and V: (s / c) b (a + 2g) d e bytes per rank), one fused
attention runs over the whole sequence on a / c heads, and an all-to-all of the output
((s / c) b a d e) returns it to the sequence split; the backward does the same in
reverse (the output gradient before, the Q, K and V gradients after). The all-to-alls
block the attention (nothing beside them).

`all_gather` (what Meta ran for Llama 3 at 128K tokens; Transformer Engine's
`AttnFuncWithCPAndKVAllGather`): the keys and values of the whole sequence are
all-gathered over the c ranks (2 b s g d e bytes gathered), each rank runs one fused
attention of its s / c balanced queries against them (1 / c of the causal work), and
the backward gathers them again (they are not kept) and reduce-scatters their
gradients. The collectives block the attention.

`torch_allgather` / `torch_alltoall` (PyTorch's `context_parallel`, what torchtitan
runs, with its `--experimental.context_parallel_rotate_method` allgather / alltoall;
`torch.distributed.tensor.experimental._attention`): the sequence is cut into 2c
chunks, rank i holding chunks i and 2c-1-i (`_RoundRobinLoadBalancer`, on by default),
and each rank makes c flash-attention calls per pass: its own block causally, then
for each other rank's block either its queries against the block's first half or its
second half of queries against the whole block, non-causal; each call does
4 b a d (s / c)^2 / 2 FLOPs (the ring's). The forward merges each call's output into
an fp32 result (logsumexp rescaling, `_SDPAMerger`); the backward runs c flash
backward calls, accumulates dQ, dK, dV in fp32, and passes the key/value gradients
(fp32) to the ring neighbour after each call (all-to-all `permute_tensor`, whatever
the rotate method): c transfers, the last awaited. The keys and values travel by one
all-gather issued before the first call (`allgather`) or c - 1 neighbour transfers
(`alltoall`), again in the backward. How these run depends on torch.compile
(`elementwise_kernels`: `fused` is torchtitan's `training.compile`, `eager` not):
eager, every merge and sum is PyTorch's ops one by one, each transfer runs beside the
next call (an `AsyncCollectiveTensor` waited at first use), and the keys and values
are copied into a flat buffer before every call but the last; compiled, the ring is
traced into the block's graph, so each merge or sum is one fused pass, a collective is
awaited where it is issued (nothing beside it), and the all-gather rotation's unused
flat copies are dropped (`torch_cp_merge_passes`, `torch_cp_grad_passes`,
`torch_cp_traced`, `torch_cp_flat_copies`).
The keys and values are those the SDPA call receives: torchtitan repeats them to all a
query heads first (`torch_cp_shape`), so a heads travel, not g.

Heads here are per tensor-parallel rank (a / t, g / t); tokens b s / c. The buffers each
variant holds for a while (gathered keys and values, fp32 accumulators, ring buffers) are
priced in `paraplan.predict.cp_memory`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from paraplan.predict.work import NOT_HIDDEN

FLASH_BACKWARD_FLOPS = 2.5  # flash attention's backward runs 5 products to the forward's 2
FP32_BYTES = 4
CP_GROUP = "cp"  # the context-parallel group (a2a)
CP_RING = "cp_ring"  # one ring neighbour (p2p): the ring's hops run at once, the slowest sets the step


class PassSink(Protocol):
    """What a pass builder offers (`paraplan.predict.ops._Builder`)."""

    def attention(self, flops: float, nbytes: float, seq_length: float, backward: bool) -> int: ...

    def memory(self, nbytes: float) -> int: ...

    def comm(self, collective: str, nbytes: float, hidden_by: int = NOT_HIDDEN, group: str = "tp") -> None: ...


@dataclass(frozen=True)
class AttentionShape:
    """One rank's attention: b sequences of s tokens (the whole sequence), heads and
    key/value groups per tensor-parallel rank, head width d, e bytes per element, c
    context-parallel ranks."""

    b: float
    s: float
    heads: float
    groups: float
    d: float
    e: int
    cp: int
    compiled: bool = False  # torch_*: the block runs under torch.compile (`torch_cp_traced`)

    @property
    def local_tokens(self) -> float:
        """b s / c: the tokens this rank holds."""
        return self.b * self.s / self.cp


def causal_attention_flops(shape: AttentionShape) -> float:
    """Forward FLOPs of causal flash attention over the whole sequence on this tensor
    rank's heads (QK^T and PV, the masked half skipped)."""
    return 4.0 * shape.b * shape.heads * shape.s * shape.s * shape.d * 0.5


def ring_steps(cp: int) -> int:
    """Transfers of the ring: the c - 1 key/value blocks each rank receives."""
    return cp - 1


def ring_step_flops(shape: AttentionShape) -> float:
    """Forward FLOPs of one balanced ring step: 4 b a d (s / c)^2 / 2."""
    return causal_attention_flops(shape) / (shape.cp * shape.cp)


def ring_step_kv_bytes(shape: AttentionShape) -> float:
    """Bytes of one forward ring transfer: keys and values of s / c tokens,
    2 (s / c) b g d e."""
    return 2.0 * shape.local_tokens * shape.groups * shape.d * shape.e


def ulysses_qkv_bytes(shape: AttentionShape) -> float:
    """Per-rank bytes of the all-to-all of Q, K and V: (s / c) b (a + 2g) d e."""
    return shape.local_tokens * (shape.heads + 2 * shape.groups) * shape.d * shape.e


def ulysses_out_bytes(shape: AttentionShape) -> float:
    """Per-rank bytes of the all-to-all of the attention output: (s / c) b a d e."""
    return shape.local_tokens * shape.heads * shape.d * shape.e


def all_gather_kv_bytes(shape: AttentionShape) -> float:
    """Gathered bytes of the key/value all-gather: 2 b s g d e."""
    return 2.0 * shape.b * shape.s * shape.groups * shape.d * shape.e


def _all_gather(w: PassSink, x: AttentionShape, backward: bool) -> None:
    kv = all_gather_kv_bytes(x)
    flops = causal_attention_flops(x) / x.cp * (FLASH_BACKWARD_FLOPS if backward else 1.0)
    per_pass = 4 if backward else 2
    w.comm("all_gather", kv, -1, CP_GROUP)
    w.attention(flops, x.e * per_pass * (x.local_tokens * x.heads + x.b * x.s * x.groups) * x.d, x.s, backward)
    if backward:
        w.comm("reduce_scatter", kv, -1, CP_GROUP)  # key/value gradients back to their ranks


def _ring(w: PassSink, x: AttentionShape, backward: bool) -> None:
    flops = ring_step_flops(x) * (FLASH_BACKWARD_FLOPS if backward else 1.0)
    per_pass = 4 if backward else 2  # Q, O (and dO, dQ) over the local tokens; K, V (and dK, dV) of the block
    nbytes = x.e * x.local_tokens * per_pass * (x.heads + x.groups) * x.d
    transfer = ring_step_kv_bytes(x) * (2 if backward else 1)
    merge = (x.e + 2 * FP32_BYTES) * x.local_tokens * x.heads * x.d  # read the partial, read + write the sum
    for step in range(x.cp):
        kernel = w.attention(flops, nbytes, x.s / x.cp, backward)  # one call over s / c queries and keys
        if step < ring_steps(x.cp):
            w.comm("send_recv", transfer, kernel, CP_RING)
        if step and not backward:
            w.memory(merge)


def _ulysses(w: PassSink, x: AttentionShape, backward: bool) -> None:
    heads, groups = x.heads / x.cp, x.groups / x.cp
    tokens = x.b * x.s
    flops = causal_attention_flops(x) / x.cp * (FLASH_BACKWARD_FLOPS if backward else 1.0)
    per_pass = 4 if backward else 2
    before, after = (ulysses_out_bytes(x), ulysses_qkv_bytes(x)) if backward else \
        (ulysses_qkv_bytes(x), ulysses_out_bytes(x))
    w.comm("all_to_all", before, -1, CP_GROUP)
    w.attention(flops, x.e * tokens * per_pass * (heads + groups) * x.d, x.s, backward)
    w.comm("all_to_all", after, -1, CP_GROUP)


TORCH_ROTATE_METHODS: dict[str, str] = {"torch_allgather": "allgather", "torch_alltoall": "alltoall"}
"""PyTorch's context parallelism by its key/value rotation (`set_rotate_method`)."""


def torch_cp_kernel_shapes(cp: int, rank: int) -> list[tuple[float, float, bool]]:
    """(query, key) lengths in units of s / c and causality of the c attention calls
    rank r makes per pass under PyTorch's context parallelism with its default load
    balancing (`_templated_ring_attention`): its own block causally, then the block of
    rank r - i for i = 1 .. c - 1, non-causally: all its queries against the block's
    first half when i <= r, its second half of queries against the whole block when
    i > r. Every call covers (s / c)^2 / 2 (query, key) pairs, so every rank does the
    same work; the last rank's calls all have rows of s / 2c keys, the shortest, so it
    is the slowest (`torch_cp_slowest_rank`)."""
    return [(1.0, 1.0, True)] + [(1.0, 0.5, False) if i <= rank else (0.5, 1.0, False) for i in range(1, cp)]


def torch_cp_slowest_rank(cp: int) -> int:
    """The rank that sets the step: c - 1 (`torch_cp_kernel_shapes`)."""
    return cp - 1


def torch_cp_call_flops(shape: AttentionShape) -> float:
    """Forward FLOPs of each of the c calls: 4 b a d (s / c)^2 / 2 (the causal
    diagonal block, or s / c queries against s / 2c keys), equal to a balanced ring step."""
    return ring_step_flops(shape)


def _sizes(shape: AttentionShape) -> tuple[float, float, float]:
    """n, r, m: the rank's output (and query) elements b (s / c) a d, its softmax rows
    b (s / c) a, and the elements of its keys (or values) b (s / c) g d."""
    rows = shape.local_tokens * shape.heads
    return rows * shape.d, rows, shape.local_tokens * shape.groups * shape.d


def torch_cp_merge_passes(shape: AttentionShape, call: int) -> tuple[float, ...]:
    """Bytes of each kernel that merges call `call`'s output and logsumexp into the fp32
    result (`_SDPAMerger.step`, `convert_to_f32`), on the rank priced (whole-length
    merges). Eager, op by op: the first call's output cast to fp32, (e + 4) n; each
    later one cast, (e + 4) n, then `out - sigmoid(block_lse - lse) * (out - block_out)`
    (12 r, 8 r, 12 n, 8 n + 4 r, 12 n) and `lse - logsigmoid(lse - block_lse)` (12 r,
    8 r, 12 r). Under torch.compile the chain is one fused pass per later call: the
    result and logsumexp read and written, the call's output and logsumexp read,
    (e + 8) n + 12 r; the second call's reads the first call's output in 16 bits in
    place of the fp32 result, (2e + 4) n + 12 r, and the first call's alone costs
    nothing."""
    n, r, _ = _sizes(shape)
    e, f = shape.e, FP32_BYTES
    if shape.compiled:
        if call == 0:
            return ()
        return ((2 * e + f if call == 1 else e + 2 * f) * n + 3 * f * r,)
    if call == 0:
        return ((e + f) * n,)
    return ((e + f) * n, 3 * f * r, 2 * f * r, 3 * f * n, 2 * f * n + f * r, 3 * f * n,
            3 * f * r, 2 * f * r, 3 * f * r)


def torch_cp_grad_passes(shape: AttentionShape, first: bool) -> tuple[float, ...]:
    """Bytes of each kernel accumulating one backward call's gradients
    (`_templated_ring_attention_backward`, fp32 sums), on the rank priced (all its calls
    after the first take the block's first half of keys: i <= rank). Eager: dQ added
    in place, (8 + e) n; at the first call dK and dV added into their zeroed fp32 sums,
    (8 + e) m each; at a later one into the first half of the fp32 block received from
    the neighbour, (8 + e) m / 2 each, then each block rebuilt by `torch.cat`
    (`_partial_update`), 8 m each; then both copied into the flat fp32 buffer sent on,
    16 m. Under torch.compile each sum is one fused pass: dQ (8 + e) n ((4 + e) n at
    the first call, the zeros folded in), the flat buffer written from the received
    block and the two partial gradients, (16 + e) m ((8 + 2e) m at the first call)."""
    n, _, m = _sizes(shape)
    e, f = shape.e, FP32_BYTES
    if shape.compiled:
        return ((f + e) * n, (2 * f + 2 * e) * m) if first else ((2 * f + e) * n, (4 * f + e) * m)
    if first:
        return ((2 * f + e) * n, (2 * f + e) * m, (2 * f + e) * m, 4 * f * m)
    return ((2 * f + e) * n, (2 * f + e) * m / 2, (2 * f + e) * m / 2, 2 * f * m, 2 * f * m, 4 * f * m)


def torch_cp_enter_passes(shape: AttentionShape, backward: bool) -> tuple[float, ...]:
    """Bytes of the kernels before the first call. Eager: `key.contiguous()` and
    `value.contiguous()` copy the keys and values, which torchtitan passes as transposed
    views (`Attention.forward`: `keys.transpose(1, 2)`), 2 e m each; the backward first
    zeroes its fp32 sums of dQ, dK, dV (4 n, 4 m, 4 m). Under torch.compile nothing:
    the graph writes the repeated keys and values in the layout the call reads, and
    folds the zeros into the first sums."""
    n, _, m = _sizes(shape)
    if shape.compiled:
        return ()
    copies = (2 * shape.e * m, 2 * shape.e * m)
    return (FP32_BYTES * n, FP32_BYTES * m, FP32_BYTES * m, *copies) if backward else copies


def torch_cp_exit_passes(shape: AttentionShape, backward: bool) -> tuple[float, ...]:
    """Bytes of the kernels after the last call: the fp32 result cast back, (4 + e) n;
    backward, dQ cast back (4 + e) n and the key/value gradient sums received from the
    neighbour cast back, (4 + e) 2m (`next_buffer().to(key.dtype)`)."""
    n, _, m = _sizes(shape)
    e = shape.e
    return ((FP32_BYTES + e) * n, (FP32_BYTES + e) * 2 * m) if backward else ((FP32_BYTES + e) * n,)


def torch_cp_grad_kv_bytes(shape: AttentionShape) -> float:
    """Bytes of one backward transfer of the accumulated key/value gradients, kept in
    fp32: 2 (s / c) b g d x 4 (g = a in torchtitan, `torch_cp_shape`)."""
    return 2.0 * shape.local_tokens * shape.groups * shape.d * FP32_BYTES


def torch_cp_shape(shape: AttentionShape) -> AttentionShape:
    """The attention PyTorch's context parallelism sees in torchtitan: keys and values
    repeated to every query head before the SDPA call (`repeat_kv`, torchtitan 9dec370
    `torchtitan/models/llama/model.py`, `Attention.forward`), so a heads of keys and
    values travel and are accumulated, not g."""
    return replace(shape, groups=shape.heads)


def torch_cp_flat_copies(cp: int, rotate: str, compiled: bool) -> int:
    """How many times per pass the keys and values are copied into one flat buffer
    (`torch.cat([key.flatten(), value.flatten()])` before every call but the last, in
    `_templated_ring_attention` and its backward). Under torch.compile only the copies
    something reads are kept: with `allgather` only the first one, which the all-gather
    sends (`_AllGatherRotater.exchange_buffers` ignores its argument after the first
    call, so the later copies are dead code that the compiled graph drops); with
    `alltoall` every one travels."""
    return 1 if compiled and rotate == "allgather" else cp - 1


def torch_cp_traced(shape: AttentionShape) -> bool:
    """Whether the context-parallel collectives block the compute stream: under
    torch.compile (torchtitan `training.compile`: `torch.compile(block, fullgraph=True)`
    per TransformerBlock, 9dec370 `apply_compile`) the ring is traced into the block's
    graph, and a traced functional collective is awaited where it is issued
    (`torch.distributed._functional_collectives._maybe_wrap_tensor` returns
    `wait_tensor(...)` while tracing, an `AsyncCollectiveTensor` waited at first use
    only in eager mode); Inductor leaves the wait there unless
    `reorder_for_compute_comm_overlap` is set (False by default in late-2024 PyTorch,
    and torchtitan 9dec370 does not set it)."""
    return shape.compiled


def _torch_ring(w: PassSink, shape: AttentionShape, rotate: str, backward: bool) -> None:
    """PyTorch's context-parallel attention on its slowest rank (module doc): the calls
    of `torch_cp_kernel_shapes`, each followed by its fp32 merge or accumulation
    (`torch_cp_merge_passes`, `torch_cp_grad_passes`), the copies of the keys and
    values into the flat buffer sent on (`torch_cp_flat_copies`), the kernels before
    the first call and after the last (`torch_cp_enter_passes`, `torch_cp_exit_passes`),
    and the collectives, beside the calls in eager mode, awaited where issued under
    torch.compile (`torch_cp_traced`)."""
    x = torch_cp_shape(shape)
    tokens = x.local_tokens
    factor = FLASH_BACKWARD_FLOPS if backward else 1.0
    per_pass = 4 if backward else 2  # Q, O (and dO, dQ); K, V (and dK, dV)
    copies = torch_cp_flat_copies(x.cp, rotate, x.compiled)
    for nbytes in torch_cp_enter_passes(x, backward):
        w.memory(nbytes)
    kernels: list[int] = []
    for q, k, causal in torch_cp_kernel_shapes(x.cp, torch_cp_slowest_rank(x.cp)):
        call = len(kernels)
        if call < copies:  # keys and values copied into one flat buffer to send on
            w.memory(2 * ring_step_kv_bytes(x))
        nbytes = x.e * per_pass * tokens * (q * x.heads + k * x.groups) * x.d
        # a non-causal row of k keys does the work of a causal row of 2k (`layer_shape.kernel_seq_length`)
        seq = q * x.s / x.cp if causal else 2.0 * k * x.s / x.cp
        kernels.append(w.attention(torch_cp_call_flops(x) * factor, nbytes, seq, backward))
        for nbytes in (torch_cp_grad_passes(x, call == 0) if backward else torch_cp_merge_passes(x, call)):
            w.memory(nbytes)
    for nbytes in torch_cp_exit_passes(x, backward):
        w.memory(nbytes)
    traced = torch_cp_traced(x)
    beside = [NOT_HIDDEN] * len(kernels) if traced else kernels  # the call each collective may run beside
    if rotate == "allgather":  # one all-gather, issued before the first call and awaited after it
        w.comm("all_gather", all_gather_kv_bytes(x), beside[0], CP_GROUP)
    else:  # block i + 1 travels to the ring neighbour while call i runs
        for kernel in beside[:-1]:
            w.comm("send_recv", ring_step_kv_bytes(x), kernel, CP_RING)
    if backward:  # the gradients of block i travel on during call i + 1; the last one is awaited
        for kernel in [*beside[1:], NOT_HIDDEN]:
            w.comm("send_recv", torch_cp_grad_kv_bytes(x), kernel, CP_RING)


def cp_attention_forward(w: PassSink, x: AttentionShape, cp_comm_type: str) -> None:
    """The forward attention core under context parallelism (module doc)."""
    if cp_comm_type in TORCH_ROTATE_METHODS:
        _torch_ring(w, x, TORCH_ROTATE_METHODS[cp_comm_type], backward=False)
    elif cp_comm_type == "a2a":
        _ulysses(w, x, backward=False)
    elif cp_comm_type == "all_gather":
        _all_gather(w, x, backward=False)
    else:
        _ring(w, x, backward=False)


def cp_attention_backward(w: PassSink, x: AttentionShape, cp_comm_type: str) -> None:
    """The backward attention core under context parallelism (module doc)."""
    if cp_comm_type in TORCH_ROTATE_METHODS:
        _torch_ring(w, x, TORCH_ROTATE_METHODS[cp_comm_type], backward=True)
    elif cp_comm_type == "a2a":
        _ulysses(w, x, backward=True)
    elif cp_comm_type == "all_gather":
        _all_gather(w, x, backward=True)
    else:
        _ring(w, x, backward=True)
