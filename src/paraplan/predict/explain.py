"""Where a predicted iteration's time goes (`paraplan predict --explain`).

The iteration ends when its latest pipeline rank ends (flushed schedules); that
rank's time is split into parts that sum to the iteration time exactly:

- its compute ops (M micro-batches x the forward and backward of each of its model
  chunks), each op's device time split by kernel kind as the device model priced it:
  `gemm`, `attention` (fused flash attention) as one average GPU runs them, `straggler`
  (what the job's slowest GPU adds to them, `paraplan.predict.variability`), `memory`
  (memory-bound kernels), the
  tensor-parallel collectives it pays for (`tp_comm`: blocking ones, overlapped ones
  where they outlast their kernel plus their contention, `PassCost.comm_s`), the
  context-parallel ones likewise (`cp_comm`: ring transfers, Ulysses all-to-alls), the
  expert-parallel ones (`ep_comm`: the MoE token all-to-alls and the
  expert-tensor-parallel gathers) and what ZeRO-3's weight gathers add beside the layers
  and before each chunk's first one (`dp_comm`, `fsdp_ops`); `host` is what the host's issue time
  adds on top of the device time (the smooth maximum of `device_model.host_bound_s`);
  a layer-time factor scales its layer's parts alike;
- the blocking pipeline transfers its own ops wait for, and what overlapped ones take
  from the ops beside them (`pp_comm`, `pipeline_p2p`);
- its idle time on the compute stream: the pipeline transfers on the fill and drain
  path (`pp_comm`: 2 (p v - 1) point-to-point transfers, at most the idle time: the
  first micro-batch's forward and the last one's backward cross every virtual-stage
  boundary, docs/pipeline-schedules.md#where-the-interleaved-bubble-goes), then the
  `imbalance`: how much longer the busiest rank's ops run than its own (its compute and
  the transfers and host time on its stream; 0 on the busiest rank, at most the idle time
  left), the time it waits while ranks with more work compute, and the rest, the
  `bubble`: the schedule's fill and drain;
- DualPipe: the rank's two stages (r and p - 1 - r), M/2 micro-batches each, without
  blocking transfers; what its pairs hide of the all-to-alls comes off `ep_comm`;
- the data-parallel gradient reduction past its compute, with what its buckets take
  from the compute beside them (`dp_comm`, `sim.overlap_cost`), then what
  follows it: the weight all-gather of a sharded optimizer, or what it adds beside the
  forward under `overlap_param_gather` (`dp_comm`, `param_gather`), the
  tied-embedding gradient all-reduce between the first and last stage (`pp_comm`)
  and the optimizer step (`optimizer`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import (
    StageLayers,
    kernel_times_by_pass,
    param_gather_contention_s,
    price,
    run_structure,
)
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.fsdp_ops import layer_device_s
from paraplan.predict.ops import ATTENTION, FP8_GEMM, GEMM, MEMORY
from paraplan.predict.overlap_share import share_or_calibrated
from paraplan.predict.pass_times import LAYER_PASSES, MOE_LAYER_PASSES
from paraplan.predict.pipeline_p2p import p2p_charges
from paraplan.predict.variability import no_straggling_speed
from paraplan.sim.execution import rank_ends

PARTS: tuple[str, ...] = ("gemm", "attention", "straggler", "memory", "tp_comm", "cp_comm", "ep_comm", "dp_comm",
                          "pp_comm", "bubble", "imbalance", "optimizer", "host")
EXPLAIN_COLUMNS: tuple[str, ...] = tuple(f"explain_{p}_s" for p in PARTS)
_DEVICE = 7  # gemm, attention, memory, tp_comm, cp_comm, ep_comm, dp_comm: the parts an op's device time has
_DP = 6


@dataclass(frozen=True)
class TimeBreakdown:
    """Seconds of the iteration per part (`PARTS`), on the rank that ends last."""

    seconds: dict[str, float]
    rank: int  # the pipeline rank whose end is the iteration's end
    iteration_s: float

    @property
    def total_s(self) -> float:
        return float(sum(self.seconds.values()))


def _pass_parts(structure, kernel_s: list[np.ndarray], eff: DeviceEfficiency) -> np.ndarray:
    """(passes, 7): each pass's device time by part, layer-time factor applied."""
    out = np.zeros((len(structure.passes), _DEVICE))
    factor = eff.layer_time_factors.factor(structure.layer_key)
    for j, (cost, k) in enumerate(zip(structure.passes, kernel_s, strict=True)):
        kind = cost.kernels.kind
        out[j, :6] = (k[(kind == GEMM) | (kind == FP8_GEMM)].sum(), k[kind == ATTENTION].sum(), k[kind == MEMORY].sum(),
                      cost.comm_s(k, eff, "tp"), cost.comm_s(k, eff, "cp"), cost.comm_s(k, eff, "ep"))
        if j in LAYER_PASSES + MOE_LAYER_PASSES:
            out[j] *= factor
    return out


def _layer_parts(structure, parts: np.ndarray, fsdp, eff: DeviceEfficiency,
                 recomputed: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One dense and one MoE layer's forward and backward by part (the backward with its
    recomputed forward, or without: `recompute_method block`'s kept layers), with what
    ZeRO-3's gathers beside them add under `_DP`."""
    layer_fwd, layer_bwd = parts[0].copy(), parts[2] + (parts[1] if recomputed else 0.0)
    moe_fwd, moe_bwd = ((parts[7].copy(), parts[9] + (parts[8] if recomputed else 0.0)) if len(parts) > 7
                        else (np.zeros(_DEVICE), np.zeros(_DEVICE)))
    if fsdp is not None:  # ZeRO-3: what the gathers beside each layer add (`fsdp_ops`)
        layers = (layer_fwd, layer_bwd, moe_fwd, moe_bwd)
        sums = [float(part.sum()) for part in layers]
        priced = layer_device_s(fsdp, (sums[0], sums[1]), (sums[2], sums[3]),
                                share_or_calibrated(structure.overlap_shares.fsdp, eff))  # z14
        for part, total, own in zip(layers, priced, sums, strict=True):
            part[_DP] += total - own
    return layer_fwd, layer_bwd, moe_fwd, moe_bwd


def _stage_parts(structure, parts: np.ndarray, eff: DeviceEfficiency) -> tuple[np.ndarray, np.ndarray]:
    """(virtual stages, parts): one micro-batch's forward and backward device time of each
    virtual stage by part, as `price` sums them (ZeRO-3's gathers under `_DP`)."""

    fsdp = structure.fsdp.priced(structure.speed, eff) if structure.fsdp is not None else None  # FSDP2 copy-ins
    layer_fwd, layer_bwd, moe_fwd, moe_bwd = _layer_parts(structure, parts, fsdp, eff, recomputed=True)
    moe = structure.moe_counts[:, None]
    counts = structure.layers_per_vstage.astype(float)[:, None] - moe
    fwd, bwd = counts * layer_fwd, counts * layer_bwd  # (virtual stages, parts)
    if len(parts) > 7:  # a mixture-of-experts model's MoE layers
        fwd += moe * moe_fwd
        bwd += moe * moe_bwd
    layers = StageLayers.of(structure)
    if layers.dense_kept is not None:  # recompute_method block: these layers' backward recomputes nothing
        _, kept_bwd, _, kept_moe_bwd = _layer_parts(structure, parts, fsdp, eff, recomputed=False)
        bwd += layers.dense_kept[:, None] * (kept_bwd - layer_bwd)
        if layers.moe_kept is not None:
            bwd += layers.moe_kept[:, None] * (kept_moe_bwd - moe_bwd)
    if fsdp is not None:  # the first gathers of each chunk, which no compute hides
        exposed_fwd, exposed_bwd = fsdp.exposed_s(counts[:, 0], structure.moe_counts)
        copies_fwd, copies_bwd = fsdp.fsdp2_stage_s(counts[:, 0], structure.moe_counts, structure.speed, eff)
        fwd[:, _DP] += exposed_fwd
        bwd[:, _DP] += exposed_bwd
        fwd[:, 2] += copies_fwd  # FSDP2's copies: memory-bound kernels
        bwd[:, 2] += copies_bwd
    if structure.attention_mix is not None:  # windowed layers' attention cores, unlike layer 0's
        factor = eff.layer_time_factors.factor(structure.layer_key)
        added_fwd, added_bwd = structure.attention_mix.added_s(structure.speed, eff)
        fwd[:, 1] += factor * added_fwd
        bwd[:, 1] += factor * added_bwd
    fwd[0] += parts[3]
    bwd[0] += parts[4]
    fwd[-1] += parts[5]
    bwd[-1] += parts[6]
    return fwd, bwd


def _average_gpu_compute_s(structure, eff: DeviceEfficiency, mine: np.ndarray, m: int) -> np.ndarray:
    """The rank's GEMM and attention seconds (as `explain_run` sums them) without the
    slowest-GPU factor; the rest of that time is the `straggler` part."""
    average = replace(structure, speed=no_straggling_speed(structure.speed))
    kernel_s = kernel_times_by_pass([average], eff)[0]
    fwd, bwd = _stage_parts(average, _pass_parts(average, kernel_s, eff), eff)
    return m * (fwd[mine] + bwd[mine]).sum(axis=0)[:2]


def idle_split(idle_s: float, path_transfers_s: float, busy_s: np.ndarray, rank: int) -> tuple[float, float, float]:
    """A rank's idle time on its compute stream (`idle_s`: its compute end less its busy
    time) as (transfers, imbalance, bubble), which sum to `idle_s` exactly: first the
    pipeline transfers on the fill and drain path (`path_transfers_s`, at most the idle
    time), then how much longer the busiest rank is busy than this one (`busy_s`: per
    pipeline rank, the engine's op time), at most the idle time left (q7-imbalance), and
    the rest, the schedule's fill and drain. A rank lighter by d per micro-batch than the
    others waits M d for them: with equal stages the imbalance is 0 and the bubble the
    textbook (p - 1)(t_f + t_b) (`tests/unit/test_predict_explain.py`)."""
    idle = max(idle_s, 0.0)
    transfers = min(idle, path_transfers_s)
    imbalance = min(max(float(busy_s.max() - busy_s[rank]), 0.0), idle - transfers)
    return transfers, imbalance, idle_s - transfers - imbalance


def explain_run(model: TransformerModel, settings: RunSettings, cluster: Cluster, comm: CommModel,
                eff: DeviceEfficiency) -> TimeBreakdown:
    """The breakdown of one run's predicted iteration (module doc)."""
    structure = run_structure(model, settings, cluster, comm)
    kernel_s = kernel_times_by_pass([structure], eff)[0]
    execution = price(structure, kernel_s, eff)
    parts = _pass_parts(structure, kernel_s, eff)
    p, v, m = settings.pipeline_model_parallel_size, settings.virtual_pipeline_model_parallel_size, \
        settings.num_microbatches
    fwd, bwd = _stage_parts(structure, parts, eff)
    costs = execution.costs
    p2p = p2p_charges(settings, structure.send_s, structure.p2p_gather_s)  # blocking transfers inside the ops
    op_s = costs.fwd_s + costs.bwd_s + costs.wgt_s  # one micro-batch's ops per virtual stage
    contended = np.zeros_like(op_s)  # z12: what overlapped transfers take from the ops beside them
    for part in (costs.contended_fwd_s, costs.contended_bwd_s):
        if part is not None:
            contended = contended + part
    host = op_s - fwd.sum(axis=1) - bwd.sum(axis=1) - p2p.fwd_s - p2p.bwd_s - contended

    ends = rank_ends(execution)
    rank = int(np.argmax(ends.end_s))
    mine = np.arange(v) * p + rank  # this rank's virtual stages
    dualpipe = execution.dualpipe  # v5-dualpipe: stages r and p - 1 - r, M / 2 micro-batches each, no blocking
    if dualpipe is not None:
        mine, m = np.array([rank, p - 1 - rank]), m // 2
        contended = dualpipe.contended_s if dualpipe.contended_s is not None else np.zeros_like(dualpipe.fwd_s)
        host = dualpipe.fwd_s + dualpipe.bwd_s - fwd.sum(axis=1) - bwd.sum(axis=1) - contended
        p2p = replace(p2p, fwd_s=np.zeros_like(p2p.fwd_s), bwd_s=np.zeros_like(p2p.bwd_s))
    device = m * (fwd[mine] + bwd[mine]).sum(axis=0)
    average = (device[:2] if structure.speed.compute_time_factor == 1.0  # gemm, attention as one average GPU runs them
               else _average_gpu_compute_s(structure, eff, mine, m))
    host_s = m * float(host[mine].sum())
    blocked = m * float((p2p.fwd_s[mine] + p2p.bwd_s[mine] + contended[mine]).sum())
    busy = float(device.sum()) + host_s + blocked
    if dualpipe is not None:  # what the pairs hide of the all-to-alls: the ops alone minus what the rank ran
        device[5] -= busy - float(ends.busy_s[rank])
        busy = float(ends.busy_s[rank])
    # q3-bubble: the fill and drain path crosses every virtual-stage boundary, both ways
    transfers, imbalance, bubble = idle_split(float(ends.compute_end_s[rank]) - busy, 2 * float(structure.send_s.sum()),
                                              ends.busy_s, rank)
    exchange = structure.embedding_exchange_s if rank in (0, p - 1) and p > 1 else 0.0
    after_comm = float(structure.after_sync_comm_s[rank] + param_gather_contention_s(structure, costs, eff)[rank])
    optimizer = float(execution.after_sync_s[rank]) - after_comm
    gathers = float(ends.param_gather_s[rank]) if ends.param_gather_s is not None else 0.0  # q9: interleaved chunks
    seconds = {
        "gemm": float(average[0]), "attention": float(average[1]),
        "straggler": float(device[0] + device[1] - average.sum()), "memory": float(device[2]),
        "tp_comm": float(device[3]), "cp_comm": float(device[4]), "ep_comm": float(device[5]),
        "dp_comm": (float(device[_DP]) + float(ends.sync_end_s[rank] - ends.compute_end_s[rank]) + after_comm
                    + gathers - exchange),
        "pp_comm": transfers + blocked + exchange,
        "bubble": bubble,
        "imbalance": imbalance,
        "optimizer": optimizer,
        "host": host_s,
    }
    return TimeBreakdown(seconds, rank, float(ends.end_s.max()))
