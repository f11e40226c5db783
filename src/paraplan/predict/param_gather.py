"""The sharded optimizer's weight all-gather overlapped with the forward
(`overlap_param_gather`): which part of it runs beside compute, and what that costs.

Without `overlap_param_gather` the all-gather follows the optimizer step in full
(`rank_state.after_sync_comm_s`). With it, Megatron-Core launches the all-gather of the
bucket the forward needs first before the forward (exposed on the first pipeline rank,
`megatron_ddp.first_gather_params`) and each later bucket's beside the forward of the
layers before it; other sharded optimizers (`zero_stage` 1-2) prefetch the whole gather
beside the forward likewise. That hidden part runs beside the first pipeline rank's
forward of its first micro-batch, and is priced as every
overlapped collective is (`paraplan.sim.overlap_cost.pair_added_s`): what the
forward cannot hide plus the sharding group's occupancy share
(`paraplan.predict.overlap_share`) x the overlap. On later pipeline
ranks the gather runs while the rank waits for the pipeline to fill (no compute beside
it), as `megatron_ddp` leaves it.

The interleaved schedule launches the gathers chunk by chunk from the schedule instead
(`align_param_gather`, Megatron-Core's default there): `chunk_gather_s` gives each
chunk's gather and the engine places them on its run (`paraplan.sim.param_gather_run`),
idle time included; the rule above then does not apply (docs/fsdp.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from paraplan.core.comm import CommModel
from paraplan.core.run_settings import RunSettings
from paraplan.core.sharding import gathers_once_per_iteration
from paraplan.predict.fsdp_ops import ShardGroups
from paraplan.predict.megatron_ddp import first_gather_params, megatron_bucket_params, uses_megatron_buckets
from paraplan.predict.placement import Precision
from paraplan.sim.overlap_cost import pair_added_s

if TYPE_CHECKING:
    from paraplan.predict.rank_state import RankParams


def _overlapped(settings: RunSettings) -> bool:
    """The sharded state's weight all-gather runs beside the forward (`overlap_param_gather`,
    or ZeRO-3 gathering once per iteration, which paraplan prices alike)."""
    sharded = settings.use_distributed_optimizer or settings.zero_stage >= 1
    zero3 = settings.zero_stage == 3 and not gathers_once_per_iteration(settings)
    return settings.overlap_param_gather and sharded and not zero3


def aligned_chunk_gathers(settings: RunSettings) -> bool:
    """Whether the gathers are launched chunk by chunk from the interleaved schedule
    (Megatron-Core's `align_param_gather`, on by default with virtual pipeline stages and
    forced off without them, `megatron/training/arguments.py`)."""
    return (_overlapped(settings) and settings.pipeline_schedule == "interleaved_1f1b"
            and settings.virtual_pipeline_model_parallel_size > 1)


def chunk_gather_s(settings: RunSettings, comm: CommModel, params: RankParams, prec: Precision,
                   sharding: ShardGroups) -> np.ndarray | None:
    """Per pipeline rank and model chunk ([rank, chunk]): the weight all-gather of the chunk
    (the dense weights over the sharding group, the experts' over theirs), which
    `paraplan.sim.param_gather_run` places; None unless `aligned_chunk_gathers`."""
    if not aligned_chunk_gathers(settings):
        return None
    v, p = params.chunk_layers.shape
    out = np.zeros((p, v))
    for r in range(p):
        for c in range(v):
            if sharding.shard.size > 1:
                dense = params.chunk_params(c, r) * prec.weight_bytes
                out[r, c] += float(comm.time_s("all_gather", dense, sharding.shard)) if dense > 0 else 0.0
            experts = float(params.chunk_expert_params[c, r]) * prec.weight_bytes
            if params.moe and sharding.expert.size > 1 and experts > 0:
                out[r, c] += float(comm.time_s("all_gather", experts, sharding.expert))
    return out if out.any() else None


def hidden_param_gather_s(settings: RunSettings, comm: CommModel, stage0_params: float,
                          stage0_expert_params: float, first_chunk_params: float, embedding_params: float,
                          moe: bool, prec: Precision, sharding: ShardGroups) -> np.ndarray:
    """Per pipeline rank: the time of the weight all-gathers that run beside its forward
    (module doc): on the first rank, its whole gather (dense over the sharding group, the
    experts' over theirs) less the first bucket's exposed one; 0 elsewhere."""
    p = settings.pipeline_model_parallel_size
    out = np.zeros(p)
    if not _overlapped(settings) or aligned_chunk_gathers(settings):  # q9: interleaved: `chunk_gather_s`
        return out
    if sharding.shard.size > 1:
        out[0] += float(comm.time_s("all_gather", stage0_params * prec.weight_bytes, sharding.shard))
        if uses_megatron_buckets(settings):  # the first bucket's gather is exposed (`after_sync_comm_s`)
            first = first_gather_params(first_chunk_params, embedding_params, megatron_bucket_params(settings))
            out[0] -= float(comm.time_s("all_gather", first * prec.weight_bytes, sharding.shard))
    if moe and sharding.expert.size > 1 and stage0_expert_params > 0:
        out[0] += float(comm.time_s("all_gather", stage0_expert_params * prec.weight_bytes, sharding.expert))
    return np.maximum(out, 0.0)


def param_gather_added_s(hidden_s: np.ndarray, fwd_s: np.ndarray, contention: float) -> np.ndarray:
    """Per pipeline rank: what its hidden all-gathers (`hidden_param_gather_s`) add beside
    the forward of its first micro-batch, `fwd_s` per virtual stage (chunk c of rank r is
    virtual stage c p + r)."""
    p = hidden_s.shape[0]
    beside = np.asarray(fwd_s, dtype=float).reshape(-1, p).sum(axis=0)
    return np.where(hidden_s > 0, pair_added_s(hidden_s, beside, contention), 0.0)
