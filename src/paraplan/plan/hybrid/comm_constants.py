"""DAPPLE's communication constants (HPGO), as a `CommModel`.

They are not the ring formulas of `ConstantBandwidthModel`: inside a machine HPGO
divides the ring all-reduce time by floor(n / 2) (NVLink rings in parallel), and a
point-to-point activation transfer costs bytes / link bandwidth with no latency.
Written `dapple_constants` in plan outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from paraplan.core import Group, ring_time_s

NVLINK_BANDWIDTH_Bps = 25e9  # point-to-point inside a machine
NCCL_ETHERNET_BANDWIDTH_Bps = 3e9  # NCCL all-reduce across machines


@dataclass(frozen=True)
class DappleConstantsModel:
    """- all_reduce inside one machine: 2(n-1)/n x bytes / intra / floor(n/2);
    - all_reduce across machines: 2(n-1)/n x bytes / inter;
    - send_recv: bytes / (intra or inter) (a stage boundary moves activations forward
      and gradients back, so the planner charges it twice);
    - other collectives: the ring formulas at the tier's bandwidth.
    `nbytes` may be a numpy array (the planner evaluates whole rows at once)."""

    intra_bandwidth_Bps: float = NVLINK_BANDWIDTH_Bps
    inter_bandwidth_Bps: float = NCCL_ETHERNET_BANDWIDTH_Bps

    def _bandwidth(self, group: Group) -> float:
        return self.intra_bandwidth_Bps if group.tier == "intra" else self.inter_bandwidth_Bps

    def time_s(self, collective: str, nbytes, group: Group):
        n = group.size
        if collective == "send_recv":
            return nbytes / self._bandwidth(group)
        if n <= 1:
            return nbytes * 0.0
        if collective == "all_reduce":
            ring = 2.0 * (n - 1) / n * nbytes
            if group.tier == "intra":
                return ring / self.intra_bandwidth_Bps / max(1, math.floor(n / 2))
            return ring / self.inter_bandwidth_Bps
        return ring_time_s(collective, nbytes, n, 0.0, self._bandwidth(group))
