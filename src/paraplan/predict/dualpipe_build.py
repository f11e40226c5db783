"""A DualPipe run's execution model (`schedule dualpipe`, `paraplan.sim.dualpipe`): the
p-stage structure priced as for 1F1B, then each rank given its two chunks.

- Op costs per pipeline stage: the forward, the whole backward and its
  weight-gradient kernels as paraplan prices them for any schedule; a pair's two passes
  priced with the MoE layers' token dispatch and combine beside the other pass's
  modules (`moe_ops.a2a_overlap`, the rule every overlapped collective follows:
  max(c, g) + share x min(c, g), the share of each collective, `overlap_share`),
  which is DeepSeek-V3's Figure 4 (attention, dispatch, MLP, combine of a forward and a
  backward interleaved). A dense model, or EP 1, has nothing to hide there: a pair is its
  two passes back to back. Unpaired ops (warm-up, cool-down) keep their all-to-alls in
  series.
- Pipeline transfers: the stage boundaries' sends (`pipeline_p2p.pipeline_send_s`), on
  their own stream: a transfer delays its consumer, never its sender (the repository
  posts them with the next op's receives; DeepSeek-V3 runs them beside the pair); each
  send's NCCL kernel takes the occupancy share of min(transfer, op) from the op that
  sent it (`pipeline_p2p.sender_contention_s`), as interleaved transfers do.
- Rank r holds stage r of pipeline 0 and stage p - 1 - r of pipeline 1: the weights and
  gradients of both (2x a 1F1B rank's), the activations of both chunks, each chunk's
  gradient buckets. The two copies of a stage are one model: their gradients are reduced
  together and, with a sharded optimizer, the state sharded over both copies' 2d ranks,
  so a rank holds half of each chunk's 1F1B share and steps half of it. Assumed:
  DeepSeek-V3's report does not say how the copies are reduced; each chunk's buckets are
  priced over its d data-parallel ranks (a ring over 2d ranks moves (2d - 1)/2d of
  the bytes instead of (d - 1)/d: under 1% apart at d >= 64).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from paraplan.core.comm import CommModel
from paraplan.core.errors import StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.device_model import DeviceEfficiency, host_bound_s, kernel_times_s
from paraplan.predict.fp8_ops import scaled_passes
from paraplan.predict.moe_deepep import NvlinkNode
from paraplan.predict.moe_ops import moe_layer_work
from paraplan.predict.overlap_share import share_or_calibrated
from paraplan.predict.pass_cost import PassCost
from paraplan.predict.pass_times import Pass, PassTimes
from paraplan.predict.pipeline_p2p import sender_contention_s
from paraplan.predict.placement import RunGroups
from paraplan.sim.dualpipe import DualPipeCosts
from paraplan.sim.execution import ExecutionModel, GradSync, RankMemory

if TYPE_CHECKING:
    from paraplan.predict.build import RunStructure


def paired_moe_passes(model: TransformerModel, settings: RunSettings, comm: CommModel,
                      groups: RunGroups, node: NvlinkNode | None = None) -> tuple[PassCost, PassCost] | None:
    """A MoE layer's forward and backward as a DualPipe pair runs them, each all-to-all
    beside a module of the other pass (`moe_ops.a2a_overlap`); None: nothing to pair (a
    dense model, or EP 1)."""
    if not model.num_moe_layers or settings.expert_model_parallel_size < 2:
        return None
    work = moe_layer_work(model, replace(settings, overlap_moe_expert_parallel_comm=True))
    fwd, bwd = scaled_passes([work.forward, work.backward], ("moe_layer_fwd", "moe_layer_bwd"), settings)
    return (PassCost.of(fwd, comm, groups.tp, groups.by_name, node),  # z14: node, the device's SMs
            PassCost.of(bwd, comm, groups.tp, groups.by_name, node))


def _paired_times(st: RunStructure, times: PassTimes, eff: DeviceEfficiency) -> PassTimes:
    """The pass times with the MoE layer's forward and backward as a pair runs them."""
    if st.paired_moe_passes is None:
        return times
    factor = eff.layer_time_factors.factor(st.layer_key)
    dev = list(times.device_s)
    for j, cost in zip((Pass.MOE_LAYER_FWD, Pass.MOE_LAYER_BWD), st.paired_moe_passes, strict=True):
        dev[j] = factor * cost.device_s(kernel_times_s(cost.kernels, st.speed, eff), eff)
    return replace(times, device_s=dev)


def _stage_ops_s(st: RunStructure, times: PassTimes, eff: DeviceEfficiency) -> tuple[np.ndarray, np.ndarray]:
    from paraplan.predict.build import StageLayers, op_device_s, op_host_s

    layers = StageLayers.of(st)
    fwd_dev, bwd_dev = op_device_s(st, times, layers, eff)
    fwd_host, bwd_host = op_host_s(times, layers, eff)
    return host_bound_s(fwd_dev, fwd_host, eff), host_bound_s(bwd_dev, bwd_host, eff)


def dualpipe_costs(st: RunStructure, times: PassTimes, eff: DeviceEfficiency) -> DualPipeCosts:
    """Per stage: forward, whole backward, weight gradient, and a pair's two passes."""
    from paraplan.predict.build import StageLayers, weight_grad_s

    fwd, bwd = _stage_ops_s(st, times, eff)
    pair_fwd, pair_bwd = _stage_ops_s(st, _paired_times(st, times, eff), eff)
    wgt = np.minimum(weight_grad_s(st.settings, times, StageLayers.of(st)), bwd)
    send = np.asarray(st.send_s, dtype=float)
    contended = None
    share = share_or_calibrated(st.overlap_shares.p2p, eff)  # z14: the transfers' occupancy share
    if share > 0.0 and send.shape[0]:  # z12: each send's kernel beside the op that sent it
        added_fwd, added_bwd = sender_contention_s(send, fwd, bwd, share)
        pair_added_fwd, pair_added_bwd = sender_contention_s(send, pair_fwd, pair_bwd, share)
        fwd, bwd = fwd + added_fwd, bwd + added_bwd
        pair_fwd, pair_bwd = pair_fwd + pair_added_fwd, pair_bwd + pair_added_bwd
        contended = added_fwd + added_bwd
    return DualPipeCosts(fwd, bwd, wgt, pair_fwd, pair_bwd, send, contended)


def _two_chunks(memory: tuple[RankMemory, ...], sharded: bool) -> tuple[RankMemory, ...]:
    p = len(memory)
    out = []
    for r in range(p):
        a, b = memory[r], memory[p - 1 - r]
        if a.lazy_gradient_bytes_per_chunk is not None or b.lazy_gradient_bytes_per_chunk is not None:
            raise StrategyError("schedule dualpipe with lazily allocated gradients (FSDP) is not modelled")
        share = 0.5 if sharded else 1.0
        out.append(RankMemory(
            a.weights_bytes + b.weights_bytes, a.gradients_bytes + b.gradients_bytes,
            share * (a.optimizer_bytes + b.optimizer_bytes),
            np.array([a.activation_bytes_per_chunk[0], b.activation_bytes_per_chunk[0]], dtype=float),
            max(a.working_bytes, b.working_bytes)))
    return tuple(out)


def _two_syncs(syncs: tuple[GradSync, ...]) -> tuple[GradSync, ...]:
    p = len(syncs)
    return tuple(GradSync(np.concatenate([syncs[r].bucket_s, syncs[p - 1 - r].bucket_s]),
                          np.concatenate([np.zeros_like(syncs[r].chunk), np.ones_like(syncs[p - 1 - r].chunk)]),
                          np.concatenate([syncs[r].ready_fraction, syncs[p - 1 - r].ready_fraction]))
                 for r in range(p))


def dualpipe_model(st: RunStructure, times: PassTimes, eff: DeviceEfficiency,
                   one_chunk: ExecutionModel) -> ExecutionModel:
    """The DualPipe execution model of a p-stage structure (module doc); `one_chunk` is
    the structure priced as one chunk per rank (its memory, buckets and tail)."""
    settings = st.settings
    sharded = settings.optimizer_shards > 1
    comm = np.asarray(st.after_sync_comm_s, dtype=float)
    step = one_chunk.after_sync_s - comm
    after = comm + comm[::-1] + (0.5 if sharded else 1.0) * (step + step[::-1])
    return replace(one_chunk, schedule="dualpipe", grad_sync=_two_syncs(one_chunk.grad_sync), after_sync_s=after,
                   memory=_two_chunks(one_chunk.memory, sharded), dualpipe=dualpipe_costs(st, times, eff))
