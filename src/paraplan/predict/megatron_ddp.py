"""What Megatron-Core's DistributedDataParallel and distributed optimizer do with a rank's
gradient and weight buffers that costs time: how the gradients are cut into buckets when
their reduction overlaps the backward (`overlap_grad_reduce`, and which buckets become
ready only at the end of a chunk's last backward), which weight all-gather the forward
waits for (`overlap_param_gather`), and the zeroing of the whole gradient buffer at the
start of every iteration.

What Megatron-Core does (`megatron/core/distributed/distributed_data_parallel.py` and
`param_and_grad_buffer.py`, read at core_r0.8.0, the release of the Megatron-Core H100
weak-scaling table, and unchanged in this respect on main in 2026):

- the bucket size is `max(40_000_000, 1_000_000 x data-parallel size)` parameters
  (`--ddp-bucket-size` unset), "to ensure that chunks used in NCCL ring-reduce
  implementations are large enough to remain bandwidth-bound";
- parameters are walked last to first and a bucket closes once it holds the bucket size
  or more: a parameter is never split, so a large one (the word embeddings, the last
  to receive its gradient) makes one large bucket;
- pipeline ranks after the first, and model chunks after the first of the interleaved
  schedule (`disable_bucketing=(model_chunk_idx > 0)` in `megatron/training/training.py`),
  have no bucketing: the chunk's gradients are one bucket, reduced once its last backward
  has ended ("data-parallel communication on these stages is not on the critical path").

- every iteration starts by zeroing the rank's whole gradient buffer, sharded optimizer or
  not (`train_step`: `model_chunk.zero_grad_buffer()` -> `grad_data.zero_()`), one
  memory-bound pass over all of the rank's gradients, not only its optimizer shard.

So the first pipeline rank's first chunk keeps ceil(rest / size) buckets through its
backward (as `grad_buckets.equal_buckets` spreads them), then the embedding's bucket at
its end; every other chunk is one bucket at its end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.core.run_settings import RunSettings
from paraplan.sim.builder.grad_buckets import equal_buckets

MIN_BUCKET_PARAMS = 40_000_000
"""Megatron-Core's smallest default bucket (parameters)."""
BUCKET_PARAMS_PER_DP_RANK = 1_000_000
"""Megatron-Core's default bucket grows by this many parameters per data-parallel rank."""


def bucket_params_for(data_context_ranks: float) -> float:
    """Megatron-Core's default bucket size in parameters for a data x context-parallel
    group of this many ranks (the group the gradients are reduced over)."""
    return float(max(MIN_BUCKET_PARAMS, BUCKET_PARAMS_PER_DP_RANK * data_context_ranks))


def megatron_bucket_params(settings: RunSettings) -> float:
    """`bucket_params_for` this run's data x context-parallel group."""
    return bucket_params_for(settings.data_context_parallel_size)


def uses_megatron_buckets(settings: RunSettings) -> bool:
    """Megatron-Core's own DDP overlapping its reduction: not torch DDP, not ZeRO-3 or
    FSDP2 (each its own units), not without `overlap_grad_reduce` (one bucket after the
    backward, as before)."""
    return (settings.overlap_grad_reduce and settings.DDP_impl == "local" and settings.zero_stage < 3
            and not settings.use_torch_fsdp2)


@dataclass(frozen=True)
class ChunkBuckets:
    """One chunk's buckets in the order they become ready: parameters each and when in
    the chunk's last backward op each is ready (0: its start, 1: its end)."""

    params: tuple[float, ...]
    ready_fraction: tuple[float, ...]


def chunk_buckets(total_params: float, embedding_params: float, first_bucketed: bool,
                  bucket_params: float) -> ChunkBuckets:
    """The buckets of one chunk holding `total_params` gradients, of which
    `embedding_params` are the word (and position) embeddings, reduced last.
    `first_bucketed`: the first pipeline rank's first chunk, the only one Megatron-Core
    cuts into buckets; every other chunk is one bucket at the end of its backward."""
    if total_params <= 0:
        return ChunkBuckets((), ())
    if not first_bucketed:
        return ChunkBuckets((float(total_params),), (1.0,))
    embedding = min(max(float(embedding_params), 0.0), float(total_params))
    rest = float(total_params) - embedding
    if rest <= 0:
        return ChunkBuckets((embedding,), (1.0,))
    split = equal_buckets(rest, bucket_params)
    sizes = [split.each] * split.count
    fractions = split.ready_fractions
    if embedding > 0:  # the embedding's gradient comes last and is never split
        sizes.append(embedding)
        fractions.append(1.0)
    return ChunkBuckets(tuple(sizes), tuple(fractions))


def first_gather_params(total_params: float, embedding_params: float, bucket_params: float) -> float:
    """With `overlap_param_gather`, the parameters of the sharded optimizer's first
    all-gather of an iteration on the first pipeline rank: the bucket its forward needs
    first, the one holding the embeddings (the last of `chunk_buckets`). Megatron-Core
    launches it before the forward (core_r0.8.0 `DistributedOptimizer.zero_grad`: "launch
    all-gather for first accessed bucket here before forward compute is initiated") and
    the embedding's forward pre-hook waits for it; each later bucket's all-gather is
    launched only when the one before it is waited for, beside the forward of that
    bucket's layers, so only this first one is exposed."""
    layout = chunk_buckets(total_params, embedding_params, True, bucket_params)
    return layout.params[-1] if layout.params else 0.0


def zeroes_whole_grad_buffer(settings: RunSettings) -> bool:
    """Megatron-Core's distributed optimizer over its own DDP buffers (not ZeRO, FSDP or
    torch DDP): the step shards the optimizer, the zeroing covers the whole buffer."""
    return (settings.use_distributed_optimizer and settings.zero_stage == 0 and settings.DDP_impl == "local"
            and not settings.use_torch_fsdp2)


def unsharded_zeroing_bytes(settings: RunSettings, rank_params: np.ndarray, optimizer_params: np.ndarray,
                            grad_bytes: int) -> np.ndarray:
    """Per pipeline stage: the bytes the zeroing of the whole gradient buffer writes beyond
    the optimizer shard that the step's traffic already zeroes
    (`placement.Precision.optimizer_step_bytes`); zeros where the two are the same."""
    if not zeroes_whole_grad_buffer(settings):
        return np.zeros_like(np.asarray(rank_params, dtype=float))
    rest = np.asarray(rank_params, dtype=float) - np.asarray(optimizer_params, dtype=float)
    return np.maximum(rest, 0.0) * grad_bytes
