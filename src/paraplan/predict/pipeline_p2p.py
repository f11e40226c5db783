"""Pipeline transfers as Megatron-LM runs them: what each costs, and whether it blocks.

Each virtual-stage boundary moves one micro-batch's activation, b s h / c elements per
rank, point to point, split over the tensor-parallel ranks (b s h / (t c) each) with
sequence parallelism (already split along the sequence) or, without it, with
`scatter_gather_tensors_in_pipeline` (Megatron-LM from February 2021 until Megatron-Core
took over the transfers in January 2023, and DeepSpeed's pipeline engine): each rank
sends a 1-D chunk and the receiver re-assembles the activation with an all-gather over
the tensor-parallel group on its compute stream (`pipeline_gather_s`: right after the
exchange, on the op that received it). Megatron-Core without sequence parallelism sends
the whole activation from every rank. A transfer crosses nodes where the two pipeline
ranks sit on different nodes (Megatron's rank order tp-cp-dp-pp
puts pipeline neighbours t c d ranks apart: with t c d below a node's GPUs only some
boundaries cross; `pipeline_send_s`).

Without `overlap_p2p_comm` (Megatron-LM before May 2023, and every non-interleaved
schedule since: Megatron turns it off there) each exchange between neighbouring
stages is one `batch_isend_irecv` whose requests the rank waits on: the sender's
compute stream stops until its send has arrived. DeepSpeed's pipeline engine
(Megatron-DeepSpeed, vTrain's runs) sends with blocking `dist.send` / `dist.recv` too.
Megatron-LM (since January 2021) and Megatron-Core (`batch_p2p_sync`, default true)
then call `torch.cuda.synchronize()`: the host waits for the GPU, and the GPU then waits
for the host to issue the next kernel. `sync_s` prices that gap at one calibrated
`host_kernel_s` per blocking exchange (the host's time to issue one kernel, fitted on
vTrain's runs) and assumes the host gets ahead again after that first kernel (the op's
own host-bound time is `host_bound_s`'s as before); DeepSpeed does not synchronise.
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
  runs them. NCCL's send/recv are CUDA kernels on the SMs like its collectives (no
  copy engine unless NCCL's opt-in zero-CTA path over registered buffers), so each
  exchange takes from the op beside it what every overlapped collective takes
  (`overlap_contention_s`): the rank's batched send and receive after each op, as long
  as the transfer out of that op, priced beside the op of the same kind.
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
    whole_bytes = settings.micro_batch_size * model.seq_length * model.hidden_size * e / c
    boundary_bytes = whole_bytes / (t if transfers_split(settings) else 1)
    send = np.zeros(max(p * v - 1, 0))
    if p > 1:
        cross = boundary_crosses_nodes(settings, devices_per_node)
        inside, across = (float(comm.time_s("send_recv", boundary_bytes, Group(2, n))) for n in (1, 2))
        send[:] = np.where(cross, across, inside)
    return send


def transfers_split(settings: RunSettings) -> bool:
    """Each tensor-parallel rank sends 1/t of a transfer: sequence parallelism, or
    `scatter_gather_tensors_in_pipeline` (module doc)."""
    return settings.sequence_parallel or settings.scatter_gather_tensors_in_pipeline


def gathers_transfers(settings: RunSettings) -> bool:
    """The receiver all-gathers each received transfer over its tensor-parallel group:
    scattered without sequence parallelism, t > 1 and more than one stage."""
    return (settings.scatter_gather_tensors_in_pipeline and not settings.sequence_parallel
            and settings.tensor_model_parallel_size > 1
            and settings.pipeline_model_parallel_size * settings.virtual_pipeline_model_parallel_size > 1)


def pipeline_gather_s(model: TransformerModel, settings: RunSettings, comm: CommModel, tp_nodes: int) -> float:
    """One received transfer's re-assembly: an all-gather of the b s h / c elements over
    the tensor-parallel group (0 where none, `gathers_transfers`)."""
    if not gathers_transfers(settings):
        return 0.0
    e = 2 if settings.dtype == "fp8" else DTYPE_BYTES[settings.dtype]
    whole_bytes = settings.micro_batch_size * model.seq_length * model.hidden_size * e / settings.context_parallel_size
    return float(comm.time_s("all_gather", whole_bytes, Group(settings.tensor_model_parallel_size, tp_nodes)))


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
    (blocking exchanges and the receiver's all-gathers, on the compute stream; the host
    synchronisations after the exchanges apart, as the GPU's idle time), and per boundary
    as delays on their own stream (`PipelineCosts.send_fwd_s` / `send_bwd_s`)."""

    fwd_s: np.ndarray  # (V,)
    bwd_s: np.ndarray  # (V,)
    send_fwd_s: np.ndarray  # (V - 1,)
    send_bwd_s: np.ndarray  # (V - 1,)
    sync_fwd_s: np.ndarray | None = None  # (V,) None: no synchronisation
    sync_bwd_s: np.ndarray | None = None  # (V,)

    def on_ops(self, fwd_s: np.ndarray, bwd_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward op times with everything the transfers add to them."""
        fwd, bwd = fwd_s + self.fwd_s, bwd_s + self.bwd_s
        if self.sync_fwd_s is not None and self.sync_bwd_s is not None:
            fwd, bwd = fwd + self.sync_fwd_s, bwd + self.sync_bwd_s
        return fwd, bwd

    @property
    def blocking(self) -> bool:
        return bool(self.fwd_s.any() or self.bwd_s.any())


def sync_s(settings: RunSettings, host_kernel_s: float) -> float:
    """What one `batch_p2p_sync` costs the GPU (module doc): it idles while the host
    issues the first kernel after the exchange, one calibrated `host_kernel_s`; 0 without
    the sync or with overlapped transfers (which Megatron never batches)."""
    return host_kernel_s if settings.batch_p2p_sync and not settings.p2p_overlapped else 0.0


def p2p_charges(settings: RunSettings, send_s: np.ndarray, gather_s: float = 0.0,
                synchronize_s: float = 0.0) -> P2PCharges:
    """The transfers' costs as the engine takes them (module doc); `send_s[i]` is one
    transfer across the boundary between virtual stages i and i + 1, either way;
    `gather_s` the receiver's all-gather of each transfer it receives (`pipeline_gather_s`),
    on the op after whose exchange it arrives; `synchronize_s` each blocking exchange's
    host synchronisation (`sync_s`)."""
    nv = send_s.shape[0] + 1
    zeros = np.zeros(nv)
    if nv == 1:
        return P2PCharges(zeros, zeros.copy(), send_s.copy(), send_s.copy())
    gets_activation, gets_gradient = np.arange(nv) > 0, np.arange(nv) < nv - 1
    if settings.p2p_overlapped:  # each received before the op that consumes it
        return P2PCharges(gets_activation * gather_s, gets_gradient * gather_s, send_s.copy(), send_s.copy())
    if settings.virtual_pipeline_model_parallel_size > 1:  # both directions at once after each backward
        exchange = exchange_s(send_s, settings.pipeline_model_parallel_size)
        gathers = (gets_activation.astype(float) + gets_gradient) * gather_s
        return P2PCharges(zeros, exchange + gathers, send_s.copy(), np.zeros_like(send_s),
                          zeros.copy(), np.full(nv, synchronize_s))
    fwd, bwd = zeros.copy(), zeros.copy()
    fwd[:-1] = send_s + gather_s  # the activation on to vs + 1, the next gradient back from it
    bwd[1:] = send_s + gather_s  # the gradient back to vs - 1, the next activation from it
    none = np.zeros_like(send_s)
    return P2PCharges(fwd, bwd, none, none.copy(), gets_gradient * synchronize_s, gets_activation * synchronize_s)


def overlap_contention_s(settings: RunSettings, send_s: np.ndarray, fwd_s: np.ndarray, bwd_s: np.ndarray,
                         contention: float) -> tuple[np.ndarray, np.ndarray] | None:
    """With overlapped transfers, what each one's kernel takes from the op beside it
    (module doc): per virtual stage, a forward op that sends its activation on and a
    backward op that sends its gradient back gain `contention` x min(transfer, op)
    (`paraplan.sim.overlap_cost`, the pair rule less the op's own time); None
    without overlapped transfers or contention."""
    if not settings.p2p_overlapped or contention <= 0.0 or send_s.shape[0] == 0:
        return None
    return sender_contention_s(send_s, fwd_s, bwd_s, contention)


def sender_contention_s(send_s: np.ndarray, fwd_s: np.ndarray, bwd_s: np.ndarray,
                        contention: float) -> tuple[np.ndarray, np.ndarray]:
    """Per stage: `contention` x min(transfer, op) on each forward that sends its
    activation on (all but the last stage's) and each backward that sends its gradient
    back (all but the first's); `send_s[i]` crosses the boundary i -> i + 1."""
    n = send_s.shape[0] + 1
    fwd, bwd = np.zeros(n), np.zeros(n)
    fwd[:-1] = contention * np.minimum(send_s, fwd_s[:-1])
    bwd[1:] = contention * np.minimum(send_s, bwd_s[1:])
    return fwd, bwd


def blocking_per_microbatch_s(v: np.ndarray, overlapped: np.ndarray, send_s: np.ndarray,
                              gather_s: np.ndarray | float = 0.0, synchronize_s: float = 0.0) -> np.ndarray:
    """The planner's closed form (vectorised over candidates): what blocking transfers add
    to a middle rank per micro-batch: 2 transfers (and host synchronisations) with one
    chunk, v exchanges with v chunks, nothing when overlapped; and the receiver's
    all-gathers, 2 per chunk."""
    per_exchange = send_s + synchronize_s
    return np.where(overlapped, 0.0, np.where(v > 1, v * per_exchange, 2.0 * per_exchange)) + 2.0 * v * gather_s
