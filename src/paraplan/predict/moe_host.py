"""What the host does in the alltoall token dispatcher's preprocessing, before the
tokens move: the small kernels that count tokens per expert and rank, the copies of
those counts to the host, and the host's wait for them.

Source: Megatron-Core `megatron/core/transformer/moe/token_dispatcher.py`,
`MoEAlltoAllTokenDispatcher` (`preprocess`, `dispatch_preprocess`, `token_dispatch`,
`_maybe_dtoh_and_synchronize`) at commit 0d8e0714cd29c01e164fe6de9f532182bdffa942
(core_r0.15.0 line, the Megatron-LM submodule of Megatron-Bridge v0.2.0, the 25.11
container). Its `tp_size` is the expert-tensor-parallel size (`pg_collection.expt_tp`).

Per MoE layer forward and micro-batch, with the dispatcher's inputs not padded to
capacity (`moe_pad_expert_input_to_capacity` false; padding makes every count a
host-side constant: no kernel, no copy, no wait):

- kernels: `routing_map.sum(dim=0).long()` (a reduction and a cast); with a capacity
  factor (dropped tokens) `num_local_tokens_per_expert.sum()` (the output size); with
  EP > 1 or ETP > 1 the split sizes: `input_splits` (a sum), the local experts' slice
  of the gathered counts made contiguous (a copy), `num_global_tokens_per_rank` (a sum),
  `output_splits_tp` (a sum) and `num_tokens_per_local_expert` (a sum); the gather of
  the counts itself is the all-gather `moe_ops` prices;
- device-to-host copies at the `cuda_dtoh_point` (before permutation 1), one
  `non_blocking` copy each, on a side stream that first waits for the compute stream:
  the tokens per local expert, and with EP > 1 or ETP > 1 `input_splits`,
  `output_splits`, `output_splits_tp`; with a capacity factor the output size;
- one host synchronisation (`d2h_event.synchronize()`) at the `cuda_sync_point`: before
  permutation 1 with a capacity factor (the output buffer's size), else before the EP
  all-to-all with EP > 1 or ETP > 1 (its split sizes), else before the experts (their
  `tokens_per_expert`). The host waits there until the compute stream has run
  everything issued before the copies; what it issued between the copies and the wait
  (permutation 1 before the all-to-all; also the ETP gather and `sort_chunks` before the
  experts) is still queued on the device when the wait ends.

The fused permutation (Transformer Engine `pytorch/permutation.py` and
`pytorch/triton/permutation.py` at v2.9, the 25.11 container's) launches its Triton
kernels from Python, one framework call each: permutation 1's forward builds a row map
in three passes (`make_row_id_map`) before the permute kernel, and each
`sort_chunks_by_idxs` forward builds its map (`make_chunk_sort_map`) before the sort
kernel; their backward kernels reuse the maps (one launch each, as the forward's data
movement). paraplan prices the fused permutation (`moe_permute_fusion`, every Megatron-Bridge MoE
recipe): `sort_chunks_by_idxs` reads the counts on the device, no further copy (unfused,
the counts per local expert are copied too and split on the host). The backward issues none of these: its
all-to-alls and grouped GEMMs reuse the split sizes already on the host.

Pricing, as for every other kernel: each kernel and copy is one row of its pass (one
framework call, one `host_kernel_s` of host time, one `kernel_latency_s` of device
time, its bytes at the memory bandwidth); each synchronisation costs the device one
calibrated `host_kernel_s`, the time the host takes to issue the first kernel after it,
as `pipeline_p2p.sync_s` prices `batch_p2p_sync`, less the device time of the kernels
still queued (`PassCost.sync_idle_s`): the device idles only if its queue runs dry first.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.core.run_settings import RunSettings
from paraplan.predict.work import _Builder

COUNT_BYTES = 8  # a token count (int64)
ROUTING_MAP_BYTES = 1  # the routing map's entries (bool)
ROW_MAP_BYTES = 4  # a row map's entries (int32)
ROW_ID_MAP_PASSES = 3  # `make_row_id_map`'s Triton kernels


@dataclass(frozen=True)
class DispatchHostWork:
    """The dispatcher preprocessing's host-visible work per MoE layer forward (module doc)."""

    kernels: int  # count reductions, casts and copies on the device
    copies: int  # device-to-host copies of counts
    syncs: int  # host waits for the device
    sync_point: str  # Megatron-Core's `cuda_sync_point`

    @property
    def launches(self) -> int:
        """Framework calls that launch device work (each a row of the pass)."""
        return self.kernels + self.copies


def dispatch_host_work(settings: RunSettings) -> DispatchHostWork:
    """What `MoEAlltoAllTokenDispatcher.preprocess` and `_maybe_dtoh_and_synchronize`
    issue per forward (module doc; the sync point's priority order is the source's:
    before_permutation_1 < before_ep_alltoall < before_permutation_2 < before_finish)."""
    if settings.moe_pad_expert_input_to_capacity:
        return DispatchHostWork(0, 0, 0, "no_sync")
    capacity = bool(settings.moe_expert_capacity_factor)
    split = settings.expert_model_parallel_size > 1 or settings.expert_tensor_parallel > 1
    kernels = 2 + (1 if capacity else 0) + (5 if split else 0)
    copies = 1 + (3 if split else 0) + (1 if capacity else 0)
    if capacity:
        point = "before_permutation_1"
    elif split:
        point = "before_ep_alltoall"
    else:
        point = "before_finish"
    return DispatchHostWork(kernels, copies, 1, point)


@dataclass(frozen=True)
class CountsOnHost:
    """Where a pass being built copied the counts to the host, and where it waits for them."""

    work: DispatchHostWork
    copied_at: int  # the pass's kernel count at the copies (Megatron-Core's `cuda_dtoh_point`)

    def wait(self, w: _Builder, point: str) -> None:
        """The host's wait, if `point` is the dispatcher's `cuda_sync_point`: the kernels
        issued since the copies are still queued on the device when it ends."""
        if self.work.syncs and point == self.work.sync_point:
            w.host_syncs.append((self.copied_at, len(w.rows)))


def dispatch_preprocess(w: _Builder, settings: RunSettings, routed_tokens: float, experts: int) -> CountsOnHost:
    """Append the preprocessing's kernels and copies to the pass being built (the
    kernels read the (T x E) routing map or the counts); the caller marks the wait at
    its point (`CountsOnHost.wait`)."""
    work = dispatch_host_work(settings)
    if work.kernels:
        w.memory(routed_tokens * experts * ROUTING_MAP_BYTES + 2 * experts * COUNT_BYTES)  # the reduction
        for _ in range(work.kernels - 1):  # the cast and the split sizes: a few counts each
            w.memory(2 * experts * COUNT_BYTES)
    for _ in range(work.copies):
        w.memory(experts * COUNT_BYTES)
    return CountsOnHost(work, len(w.rows))


def permute_row_map(w: _Builder, routed_tokens: float, experts: int) -> None:
    """Permutation 1's row map, three Triton passes before the permute kernel (module
    doc): each reads the (T x E) routing map or the map and writes its part of the
    T x (2 E + 1) int32 row map (priced as one full write per pass, a few microseconds)."""
    for _ in range(ROW_ID_MAP_PASSES):
        w.memory(routed_tokens * (experts * ROUTING_MAP_BYTES + (2 * experts + 1) * ROW_MAP_BYTES))


def chunk_sort_map(w: _Builder, tokens: float) -> None:
    """A `sort_chunks_by_idxs` forward's row map: one int32 per received token (module doc)."""
    w.memory(tokens * ROW_MAP_BYTES)
