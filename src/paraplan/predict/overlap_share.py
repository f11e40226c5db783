"""Which contention share prices which overlapped collective (issue 22, item 1;
docs/execution-model.md, "Which share applies where").

An overlapped pair of a collective (c alone) and compute (g alone) takes
max(c, g) + share x min(c, g). Two shares have evidence behind them:

- the tensor-parallel collectives beside their GEMMs keep the calibration's
  `comm_overlap_contention` (0.850), fitted on exactly that situation (Korthikanti et al.
  2022, Table 4: an NVLink all-reduce / reduce-scatter beside the backward GEMMs);
- every other overlapped collective (the data-parallel gradient buckets,
  `overlap_param_gather`'s all-gathers, overlapped pipeline transfers, ZeRO-3 / FSDP's
  per-layer weight gathers and gradient reduce-scatters, the context-parallel rings, the
  expert-parallel all-to-alls and DeepEP's kernels) takes the
  occupancy share of the device (`paraplan.predict.overlap_contention`): its NCCL CTAs
  hold that many of the device's SMs for the collective's life, so a GEMM of many waves
  beside it slows by units / (units - ctas), a share of 1 - 1/s = ctas / units. No
  parameter is fitted: the CTA counts are NCCL's (`data/published/overlap/collective_ctas.csv`),
  the SM count the cluster file's `compute_units`.

A device whose cluster file states no SM count (or fewer SMs than the collective's CTAs)
has no occupancy share: its overlaps keep the calibration's share, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from paraplan.core.comm import Group
from paraplan.predict.device_model import DeviceEfficiency

NCCL_INTRA_NODE_CTAS = 24
"""CTAs (SMs) an NCCL collective holds inside one NVSwitch node: 24 ring channels on
A100 and H100, derived from NCCL's topology search and observed on H100 (an
ncclAllGather beside a GEMM, 24 blocks); `collective_ctas.csv`, rows 1-3."""
NCCL_INTER_NODE_CTAS = 32
"""CTAs an NCCL collective or point-to-point transfer holds across nodes: 32 channels
(NCCL 2.18 on H800 nodes, stated by an NCCL maintainer, NVIDIA/nccl issue 1316; later
releases use fewer, so this is the upper end); `collective_ctas.csv`, row 4."""
DEEPEP_SMS = 20
"""SMs DeepEP's normal kernels hold (its default, Megatron-Core's `moe_deepep_num_sms`;
the SM count of the H100 bandwidths `moe_deepep` prices them with); `collective_ctas.csv`, row 5."""
TENSOR_PARALLEL_GROUPS = frozenset({"tp", "etp"})
"""`Collective.group`s whose overlaps keep the calibration's Table-4 share (tensor and
expert-tensor parallelism: the collectives that share was fitted on)."""


def nccl_ctas(group: Group) -> int:
    """The CTAs an NCCL collective over `group` holds (one node or across nodes)."""
    return NCCL_INTRA_NODE_CTAS if group.tier == "intra" else NCCL_INTER_NODE_CTAS


def occupancy_share(compute_units: int, ctas: int) -> float | None:
    """The share ctas / units of a many-wave GEMM beside a collective of `ctas` CTAs
    (1 - 1/s, s = units / (units - ctas), `overlap_contention.many_wave_slowdown`);
    None where the device states no SM count or has no more SMs than the CTAs."""
    if compute_units <= ctas:
        return None
    return ctas / compute_units


@dataclass(frozen=True)
class OverlapShares:
    """The occupancy share of each overlapped collective outside tensor parallelism, from
    the device's SM count and the collective's CTAs (None: the calibration's share)."""

    grad_reduce: float | None = None
    """The data-parallel gradient buckets (and a no-flush schedule's reduction) beside compute."""
    param_gather: float | None = None
    """`overlap_param_gather`'s weight all-gathers beside the forward."""
    p2p: float | None = None
    """Overlapped pipeline transfers (interleaved `overlap_p2p_comm`, DualPipe's sends)."""
    fsdp: float | None = None
    """ZeRO-3 / FSDP's weight gathers and gradient reduce-scatters beside each layer (`fsdp_ops`)."""

    @staticmethod
    def of(compute_units: int, dp: Group, shard: Group, p2p_crosses_nodes: bool) -> OverlapShares:
        """The shares on a device of `compute_units` SMs: gradient buckets over the
        data-parallel group `dp`, weight gathers (and ZeRO-3's per-layer collectives)
        over the sharding group `shard`, pipeline transfers inside a node or across nodes."""
        p2p = Group(2, 2 if p2p_crosses_nodes else 1)
        sharded = occupancy_share(compute_units, nccl_ctas(shard))
        return OverlapShares(occupancy_share(compute_units, nccl_ctas(dp)), sharded,
                             occupancy_share(compute_units, nccl_ctas(p2p)), sharded)


def share_or_calibrated(share: float | None, eff: DeviceEfficiency) -> float:
    """`share`, or the calibration's `comm_overlap_contention` where the occupancy model
    has none (module doc)."""
    return eff.comm_overlap_contention if share is None else share


def collective_share(group_name: str, group: Group, compute_units: int, kernel_sms: int = 0) -> float:
    """The share of one overlapped collective of a pass (`PassCost`): NaN (the
    calibration's) for the tensor-parallel groups, else the occupancy share of its NCCL
    CTAs over `group`, or of the `kernel_sms` SMs the flex dispatcher's kernels hold
    (DeepEP, HybridEP; 0: an NCCL collective); NaN where the device has no occupancy share."""
    if group_name in TENSOR_PARALLEL_GROUPS:
        return float("nan")
    share = occupancy_share(compute_units, kernel_sms if kernel_sms else nccl_ctas(group))
    return float("nan") if share is None else share


def occupancy_shares(compute_units: int, group_nodes: npt.ArrayLike, calibrated: float) -> np.ndarray:
    """`occupancy_share` of collectives over groups spanning `group_nodes` nodes (the
    planner's candidates, vectorised), `calibrated` where the device has none."""
    nodes = np.asarray(group_nodes)
    ctas = np.where(nodes > 1, NCCL_INTER_NODE_CTAS, NCCL_INTRA_NODE_CTAS)
    return np.where(compute_units > ctas, ctas / max(compute_units, 1), calibrated)


CALIBRATED_SHARES = OverlapShares()
"""No occupancy share: every overlap takes the calibration's (a structure built without a device)."""
