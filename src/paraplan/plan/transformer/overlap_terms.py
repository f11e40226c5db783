"""What the transformer planner's estimate (`estimate.py`) charges for the collectives the
engine runs beside compute between the layers, vectorised over the candidates (the layers'
own overlaps are in the layer table and `estimate._layer_times`, the gradient buckets' in
`grad_sync.py`):

- overlapped pipeline transfers (the interleaved schedule's `overlap_p2p_comm`): each
  forward op that sends its activation on and each backward op that sends its gradient
  back gains share x min(transfer, op) (`paraplan.predict.pipeline_p2p.overlap_contention_s`);
- `overlap_param_gather`'s weight all-gathers (`paraplan.predict.param_gather`): on the
  first pipeline rank the gather of the bucket its forward needs first is exposed
  (Megatron-Core's buckets, `megatron_ddp.first_gather_params`: the embedding's), the rest
  of the stage's gather (its experts' over the expert-data-parallel group too) runs beside
  the forward of its first micro-batch and adds what that forward cannot hide plus the
  share x the overlap (`paraplan.sim.overlap_cost.pair_added_s`); under the interleaved
  schedule chunk by chunk (`_chunk_gathers_s`: chunk 0's waited for, each later chunk's
  beside the forwards of the chunk before it, `paraplan.sim.param_gather_run`); a sharded
  optimizer whose dense state has one rank (d x c = 1) gathers its experts after the step,
  exposed (`rank_state.after_sync_comm_s`);
- what no compute hides inside each pipeline op of per-layer sharding (`fsdp_ops.FsdpCosts.exposed_s`,
  `sharded_unit_exposed_s`): ZeRO-3 without pipelines gathers each op's first layer and its
  root unit (the embedding and the head) before any compute, in the forward and again in
  the backward (resharded after the forward); ZeRO-2's gradients, reduce-scattered after
  every micro-batch, leave each op's last layer's and root unit's reduce-scatter after its
  backward. Every (virtual) stage pays it once per micro-batch in each op.

The shares are the engine's (`paraplan.predict.overlap_share.occupancy_shares`: a
point-to-point transfer's inside a node or across two, the sharding group's for the
gathers, the calibration's where the device states no SM count).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.core.comm import CommModel, Group
from paraplan.plan.transformer.columns import CandidateColumns, StageParams
from paraplan.predict.build import Precision
from paraplan.predict.fsdp_ops import paired_s
from paraplan.predict.overlap_share import occupancy_shares


def comm_s(comm: CommModel, collective: str, nbytes: np.ndarray, size: np.ndarray, nodes: np.ndarray,
           where: np.ndarray) -> np.ndarray:
    """Per candidate: `collective` of `nbytes` over a group of `size` ranks on `nodes` nodes
    where `where` (0 elsewhere), the model asked once per distinct (bytes, size, nodes)."""
    out = np.zeros(where.shape[0])
    idx = np.flatnonzero(where)
    if idx.size == 0:
        return out
    b = np.broadcast_to(nbytes, where.shape)[idx]
    size_i = np.broadcast_to(size, where.shape)[idx].astype(np.int64)
    nodes_i = np.broadcast_to(nodes, where.shape)[idx].astype(np.int64)
    # one integer key per (bytes, size, nodes): np.unique over rows (axis=0) sorts far slower
    code_b = np.unique(b, return_inverse=True)[1].ravel()
    key = (code_b * (int(size_i.max()) + 1) + size_i) * (int(nodes_i.max()) + 1) + nodes_i
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    seconds = np.array([float(comm.time_s(collective, float(b[j]), Group(int(size_i[j]), int(nodes_i[j]))))
                        for j in first.tolist()])
    out[idx] = seconds[inverse.ravel()]
    return out


def p2p_crosses_nodes(cols: CandidateColumns, devices_per_node: int) -> np.ndarray:
    """Per candidate: whether any pipeline boundary's rank pairs span two nodes (the
    engine's `pipeline_p2p.boundary_crosses_nodes(...).any()`): neighbours t c d ranks
    apart, so some pair crosses once they are a node apart or the p stages fill more
    than one node."""
    stride = cols.t * cols.c * cols.d
    return (cols.p > 1) & ((stride >= devices_per_node) | (stride * cols.p > devices_per_node))


def p2p_share(cols: CandidateColumns, overlapped: np.ndarray, compute_units: int, devices_per_node: int,
              calibrated: float) -> np.ndarray:
    """Per candidate: the share of an overlapped pipeline transfer beside an op (the
    engine's `OverlapShares.p2p`), 0 where the transfers block (`overlapped` false)."""
    nodes = np.where(p2p_crosses_nodes(cols, devices_per_node), 2, 1)
    return np.where(overlapped, occupancy_shares(compute_units, nodes, calibrated), 0.0)


def sender_contention_s(send_s: np.ndarray, op_s: np.ndarray, share: np.ndarray) -> np.ndarray:
    """What an overlapped transfer of `send_s` takes from the op of `op_s` beside it:
    share x min(transfer, op) (`pipeline_p2p.sender_contention_s`, vectorised)."""
    return share * np.minimum(send_s, op_s)


def param_gather_s(cols: CandidateColumns, params: StageParams, embedding_params: np.ndarray, comm: CommModel,
                   prec: Precision, megatron: np.ndarray, share: np.ndarray, forward_s: np.ndarray,
                   timed: np.ndarray) -> np.ndarray:
    """Per candidate: what the sharded state's weight all-gathers add to the first rank's
    end (module doc). `megatron`: Megatron-Core's buckets (the embedding's gathered first,
    exposed); `share`: the sharding group's occupancy share; `forward_s`: the first rank's
    forwards of one micro-batch over its chunks, with what the transfers add to them."""
    wb = prec.weight_bytes
    zero = cols.cand.zero
    # `space.Candidates.settings`: overlap_param_gather with sharded state over more than one rank
    overlapped = (cols.dc > 1) & ((zero == 1) | (zero == 2) | cols.zero3_once) & timed
    aligned = overlapped & (cols.v > 1) & (cols.schedule == "interleaved_1f1b")  # q9: chunk by chunk
    chunked = _chunk_gathers_s(cols, params, embedding_params, comm, prec, share, forward_s, aligned)
    overlapped = overlapped & ~aligned
    dense = comm_s(comm, "all_gather", params.first * wb, cols.dc, cols.dp_nodes, overlapped)
    bucketed = overlapped & megatron
    first = comm_s(comm, "all_gather", np.minimum(embedding_params, params.first) * wb, cols.dc, cols.dp_nodes,
                   bucketed)  # `megatron_ddp.first_gather_params`: the embedding's bucket
    # the experts' gather: beside the forward with overlap_param_gather, else after the step
    experts_on = cols.sharded & ~(cols.zero3 & cols.single) & (cols.edp > 1) & (params.first_experts > 0) & timed
    experts = comm_s(comm, "all_gather", params.first_experts * wb, cols.edp, cols.edp_nodes, experts_on)
    hidden = np.where(overlapped, np.maximum(dense - first + experts, 0.0), 0.0)
    added = np.where(hidden > 0, paired_s(hidden, forward_s, share) - forward_s, 0.0)  # `overlap_cost.pair_added_s`
    return added + first + np.where(overlapped | aligned, 0.0, experts) + chunked


def _chunk_gathers_s(cols: CandidateColumns, params: StageParams, embedding_params: np.ndarray, comm: CommModel,
                     prec: Precision, share: np.ndarray, forward_s: np.ndarray, aligned: np.ndarray) -> np.ndarray:
    """The interleaved schedule's gathers on the first rank (`paraplan.sim.param_gather_run`):
    chunk 0's (the embedding and its share of the layers) waited for before the first
    forward; each later chunk's beside the min(p, M) forwards of the chunk before it (f),
    which it delays by what they cannot hide, plus share x the overlap: max(g - f, 0) +
    share x min(g, f). The engine's run also lets a gather use the rank's idle wait before
    its chunk (for micro-batch 0 to come round), so this is an upper bound where g > f. The
    rank's layers and experts are spread evenly over its v chunks."""
    wb, v = prec.weight_bytes, cols.v
    layers = np.maximum(params.first - embedding_params, 0.0) / v
    experts_on = aligned & (cols.edp > 1) & (params.first_experts > 0)
    experts = comm_s(comm, "all_gather", params.first_experts / v * wb, cols.edp, cols.edp_nodes, experts_on)
    first = comm_s(comm, "all_gather", (embedding_params + layers) * wb, cols.dc, cols.dp_nodes, aligned) + experts
    later = comm_s(comm, "all_gather", layers * wb, cols.dc, cols.dp_nodes, aligned & (layers > 0)) + experts
    beside = np.minimum(cols.p, cols.m) * forward_s / v
    added = paired_s(later, beside, share) - beside  # `overlap_cost.pair_added_s`
    return np.where(aligned, first + (v - 1) * added, 0.0)


@dataclass(frozen=True, eq=False)
class ExposedUnits:
    """Per candidate, device seconds no compute hides in one micro-batch's op of a
    (virtual) stage under per-layer sharding (module doc): `layer_*` in every op that holds
    a layer, `first_*` in virtual stage 0's (the embedding's root unit; with one stage the
    head's too), `last_*` in the last virtual stage's (the head's); 0 for the other runs."""

    layer_fwd: np.ndarray
    layer_bwd: np.ndarray
    first_fwd: np.ndarray
    first_bwd: np.ndarray
    last_fwd: np.ndarray
    last_bwd: np.ndarray


def sharded_unit_exposed_s(cols: CandidateColumns, layer_params: np.ndarray, embedding_params: np.ndarray,
                           head_params: np.ndarray, comm: CommModel, prec: Precision,
                           timed: np.ndarray) -> ExposedUnits:
    """`ExposedUnits` of every candidate (the engine's `FsdpCosts.exposed_s` with
    `fsdp_costs`' gathers and reduce-scatters over the sharding group, d x c ranks): ZeRO-3
    without pipelines (each unit gathered per micro-batch, resharded after the forward) and
    ZeRO-2 (reduce-scattered after every micro-batch). Per-layer sharding runs dense
    models only (`space.enumerate_candidates`), whose every op starts and ends with a layer
    unit."""
    size, nodes = cols.dc, cols.dp_nodes
    on = (cols.dc > 1) & timed
    gathered = on & cols.zero3 & cols.single  # `core.sharding.gathers_once_per_iteration` false, resharded
    every = on & (cols.cand.zero == 2)  # `core.sharding.reduces_every_microbatch`
    root_first = embedding_params + np.where(cols.single, head_params, 0.0)  # `RankParams.root_unit_params`
    root_last = np.where(cols.single, 0.0, head_params)
    wb, gb = prec.weight_bytes, prec.grad_bytes
    layer_gather = comm_s(comm, "all_gather", layer_params * wb, size, nodes, gathered)
    first_gather = comm_s(comm, "all_gather", root_first * wb, size, nodes, gathered)
    last_gather = comm_s(comm, "all_gather", root_last * wb, size, nodes, gathered & (root_last > 0))
    layer_scatter = comm_s(comm, "reduce_scatter", layer_params * gb, size, nodes, every)
    first_scatter = comm_s(comm, "reduce_scatter", root_first * gb, size, nodes, every)
    last_scatter = comm_s(comm, "reduce_scatter", root_last * gb, size, nodes, every & (root_last > 0))
    return ExposedUnits(layer_gather, layer_gather + layer_scatter, first_gather, first_gather + first_scatter,
                        last_gather, last_gather + last_scatter)
