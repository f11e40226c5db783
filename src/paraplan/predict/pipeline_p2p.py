"""Pipeline transfers as Megatron-LM runs them: what each costs, and whether it blocks.

Each virtual-stage boundary moves one micro-batch's activation b s h / (t c) per rank
(Megatron scatters it over the tensor-parallel ranks), point to point, across nodes
where the two pipeline ranks sit on different nodes (Megatron's rank order tp-cp-dp-pp
puts pipeline neighbours t c d ranks apart: with t c d below a node's GPUs only some
boundaries cross; `pipeline_send_s`).

Without `overlap_p2p_comm` (Megatron-LM before May 2023, and every non-interleaved
schedule since: Megatron turns it off there) each exchange between neighbouring
stages is one `batch_isend_irecv` whose requests the rank waits on (2021-2022 and
Megatron-Core's `batch_p2p_sync` add a `torch.cuda.synchronize()`): the sender's
compute stream stops until its send has arrived. DeepSpeed's pipeline engine
(Megatron-DeepSpeed, vTrain's runs) sends with blocking `dist.send` / `dist.recv` too.
How the engine (`paraplan.sim.engine`, transfers on their own stream) is given that:

- 1F1B (and the other one-chunk schedules): a stage sends after each forward (its
  activation on, `send_forward_recv_backward`) and after each backward (the gradient
  back, `send_backward_recv_forward`); the forward op of every virtual stage but the
  last and the backward op of every one but the first take the transfer longer, and the
  transfer itself costs the receiver nothing more. In the steady state the two
  neighbours' exchange starts when both have finished their op, so this is exact there.
- interleaved without overlap: Megatron's steady state runs a forward and a backward,
  then one exchange that sends both outputs and receives both inputs
  (`send_forward_backward_recv_forward_backward`, the two directions on separate links
  at once), and the drain one exchange per backward: every backward op takes the longer
  of the two transfers longer; the activation still reaches the next stage no earlier
  than a transfer after its forward (a delay on its own stream, as before). The warm-up's
  exchange after each forward is not on the forward ops (about (v + 1) p of the M v
  forwards of the first rank).
- with overlap (interleaved only): the transfers run beside the next op, as the engine
  runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.core.comm import CommModel, Group
from paraplan.core.run_settings import DTYPE_BYTES, RunSettings
from paraplan.core.transformer import TransformerModel


def boundary_crosses_nodes(settings: RunSettings, devices_per_node: int) -> np.ndarray:
    """Per virtual-stage boundary vs -> vs + 1: whether any of its t c d rank pairs
    (pipeline ranks vs % p and (vs + 1) % p, t c d ranks apart) spans two nodes."""
    p, v = settings.pipeline_model_parallel_size, settings.virtual_pipeline_model_parallel_size
    stride = settings.tensor_model_parallel_size * settings.context_parallel_size * settings.data_parallel_size
    src = np.arange(max(p * v - 1, 0)) % p
    dst = (src + 1) % p
    if stride >= devices_per_node:
        return np.ones(src.shape[0], dtype=bool)
    offsets = np.arange(stride)[:, None]
    return ((src * stride + offsets) // devices_per_node != (dst * stride + offsets) // devices_per_node).any(axis=0)


def pipeline_send_s(model: TransformerModel, settings: RunSettings, comm: CommModel,
                    devices_per_node: int) -> np.ndarray:
    """Each virtual-stage boundary's transfer (module doc), inside a node or across two."""
    t, p = settings.tensor_model_parallel_size, settings.pipeline_model_parallel_size
    c, v = settings.context_parallel_size, settings.virtual_pipeline_model_parallel_size
    e = 2 if settings.dtype == "fp8" else DTYPE_BYTES[settings.dtype]
    boundary_bytes = settings.micro_batch_size * model.seq_length * model.hidden_size * e / (t * c)
    send = np.zeros(max(p * v - 1, 0))
    if p > 1:
        cross = boundary_crosses_nodes(settings, devices_per_node)
        inside, across = (float(comm.time_s("send_recv", boundary_bytes, Group(2, n))) for n in (1, 2))
        send[:] = np.where(cross, across, inside)
    return send


def exchange_s(send_s: np.ndarray, p: int) -> np.ndarray:
    """Per virtual stage: one exchange of a pipeline rank with both its neighbours at once,
    the slower of its sends to the next rank and to the previous one."""
    nv = send_s.shape[0] + 1
    to_next = np.zeros(p)
    to_next[:min(p, nv - 1)] = send_s[:p]  # boundary j joins ranks j and j + 1 (mod p) for j < p
    rank = np.maximum(to_next, np.roll(to_next, 1))
    return rank[np.arange(nv) % p]


@dataclass(frozen=True, eq=False)
class P2PCharges:
    """What the pipeline transfers add: per virtual stage on its forward and backward op
    (blocking exchanges, on the compute stream), and per boundary as delays on their own
    stream (`PipelineCosts.send_fwd_s` / `send_bwd_s`)."""

    fwd_s: np.ndarray  # (V,)
    bwd_s: np.ndarray  # (V,)
    send_fwd_s: np.ndarray  # (V - 1,)
    send_bwd_s: np.ndarray  # (V - 1,)

    @property
    def blocking(self) -> bool:
        return bool(self.fwd_s.any() or self.bwd_s.any())


def p2p_charges(settings: RunSettings, send_s: np.ndarray) -> P2PCharges:
    """The transfers' costs as the engine takes them (module doc); `send_s[i]` is one
    transfer across the boundary between virtual stages i and i + 1, either way."""
    nv = send_s.shape[0] + 1
    zeros = np.zeros(nv)
    if nv == 1 or settings.p2p_overlapped:
        return P2PCharges(zeros, zeros.copy(), send_s.copy(), send_s.copy())
    if settings.virtual_pipeline_model_parallel_size > 1:  # both directions at once after each backward
        exchange = exchange_s(send_s, settings.pipeline_model_parallel_size)
        return P2PCharges(zeros, exchange, send_s.copy(), np.zeros_like(send_s))
    fwd, bwd = zeros.copy(), zeros.copy()
    fwd[:-1] = send_s  # the activation on to vs + 1
    bwd[1:] = send_s  # the gradient back to vs - 1
    return P2PCharges(fwd, bwd, np.zeros_like(send_s), np.zeros_like(send_s))


def blocking_per_microbatch_s(v: np.ndarray, overlapped: np.ndarray, send_s: np.ndarray) -> np.ndarray:
    """The planner's closed form (vectorised over candidates): what blocking transfers add
    to a middle rank per micro-batch: 2 transfers with one chunk, v exchanges with v
    chunks, nothing when overlapped."""
    return np.where(overlapped, 0.0, np.where(v > 1, v * send_s, 2.0 * send_s))
