"""The occupancy model (`paraplan.predict.overlap_contention`) checked against
Korthikanti et al. 2022, Table 4, beside the single fitted share (`contention_fit`).

Each backward pass of the 22B layer overlaps its tensor-parallel collective with the
weight-gradient GEMM beside it (`PassCost.hidden_by`). The occupancy model prices each
pair from the GEMM's tiles, the SMs the collective's CTAs hold and the HBM its traffic
takes; the rest of the backward is the model's with a free overlap (B0). The HBM fraction
is bounded above by a ring all-reduce's traffic over the full activation (s x b x h
elements of 2 bytes): each byte on the wire is read from HBM by its sender and written by
its receiver, and each of the n - 1 reduction steps reads the local operand, 5 (n - 1) / n
bytes per activation byte, over the collective's time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import CommModel
from paraplan.predict.build import kernel_times_by_pass, run_structure
from paraplan.predict.contention_fit import MODEL_22B, SETTINGS_22B, LayerTimes, layer_times, read_table4
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.overlap_contention import (
    CollectiveFootprint,
    equivalent_share,
    gemm_slowdown,
    gemm_tiles,
    overlapped_pair_s,
)
from paraplan.predict.pass_times import LAYER_PASSES

ALL_REDUCE_HBM_BYTES_PER_BYTE = 5.0  # times (n - 1) / n: module doc


@dataclass(frozen=True)
class OccupancyBackward:
    """Per Table 4 row: the occupancy model's backward and its pairs' equivalent share."""

    layer: LayerTimes
    backward_s: np.ndarray
    share: np.ndarray  # mean over the row's overlapped pairs of `equivalent_share`
    hbm_fraction: np.ndarray  # the bound on the collective's share of HBM bandwidth (largest pair)


def occupancy_backward(cluster: Cluster, comm: CommModel, eff: DeviceEfficiency, ctas: int) -> OccupancyBackward:
    rows = read_table4()
    layer = layer_times(cluster, comm, eff, rows)
    settings = [replace(SETTINGS_22B, sequence_parallel=r["sequence_parallel"] == "true",
                        recompute_granularity=r["recompute_granularity"]) for r in rows]  # type: ignore[arg-type]
    structures = [run_structure(MODEL_22B, s, cluster, comm) for s in settings]
    kernel_s = kernel_times_by_pass(structures, eff)
    bandwidth_Bps = cluster.device.mem_bandwidth_Bps
    units = cluster.device.compute_units
    ranks = SETTINGS_22B.tensor_model_parallel_size
    activation_bytes = MODEL_22B.seq_length * SETTINGS_22B.micro_batch_size * MODEL_22B.hidden_size * 2.0
    added, shares, fractions = [], [], []
    for st, ks in zip(structures, kernel_s, strict=True):
        extra, row_shares, row_f = 0.0, [], [0.0]
        for j in LAYER_PASSES[1:]:
            pc, times = st.passes[j], ks[j]
            span = np.ones_like(pc.hidden_by) if pc.hidden_span is None else pc.hidden_span
            for c, first, n in zip(pc.hidden_comm_s, pc.hidden_by, span, strict=True):
                idx = np.arange(first, first + n)
                g = times[idx]
                f = ALL_REDUCE_HBM_BYTES_PER_BYTE * (ranks - 1) / ranks * activation_bytes / c / bandwidth_Bps
                memory_s = pc.kernels.bytes[idx] / (bandwidth_Bps * eff.memory_efficiency)
                s_each = gemm_slowdown(gemm_tiles(pc.kernels.m[idx], pc.kernels.n[idx], pc.kernels.batch[idx]),
                                       g, memory_s, units, CollectiveFootprint(ctas, min(f, 0.99)))
                g_sum = float(g.sum())
                s = float((g * s_each).sum()) / g_sum  # a run of kernels: time-weighted
                extra += float(overlapped_pair_s(c, g_sum, s)) - max(c, g_sum)
                row_shares.append(float(equivalent_share(c, g_sum, s)))
                row_f.append(f)
        added.append(extra)
        shares.append(np.mean(row_shares) if row_shares else 0.0)
        fractions.append(max(row_f))
    return OccupancyBackward(layer, layer.backward_free_s + np.array(added), np.array(shares), np.array(fractions))


def ratio_errors(layer: LayerTimes, backward_s: np.ndarray) -> np.ndarray:
    """Relative error of the model's backward / forward against the published one (the
    quantity `contention_fit` fits, free of the device's absolute speed)."""
    return (backward_s / layer.forward_s) / (layer.measured_backward_s / layer.measured_forward_s) - 1.0


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x))))
