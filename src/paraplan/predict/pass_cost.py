"""A pass's cost before the device is priced (`PassCost`): its kernels, its collectives
priced with the communication model over their groups, and each overlapped
collective's kernel. Which part of the communication each group's collectives are
(`PART_OF_GROUP`: tensor-, context- or expert-parallel) lets `predict --explain` split
them (`paraplan.predict.explain`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from paraplan.core.comm import CommModel, Group
from paraplan.predict.cp_ops import CP_GROUP, CP_RING
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.moe_deepep import DeepEpTransfer, NvlinkNode
from paraplan.predict.overlap_share import collective_share
from paraplan.predict.work import NOT_HIDDEN, Kernels, PassWork

PART_OF_GROUP: dict[str, str] = {"tp": "tp", CP_GROUP: "cp", CP_RING: "cp", "ep": "ep", "etp": "ep",
                                 "tp_cp": "ep", "tp_dp_cp": "ep"}  # v6-router: the router's, with the MoE's
"""Which part of a pass's communication (`PassCost.comm_s`) each group's collectives are."""


@dataclass(frozen=True, eq=False)
class PassCost:
    """A pass's cost before the device is priced: its kernels, the time of its blocking
    collectives, and each overlapped collective's time with the kernel it runs beside."""

    kernels: Kernels
    blocking_comm_s: float
    hidden_comm_s: np.ndarray
    hidden_by: np.ndarray
    num_collectives: int
    other_blocking_s: tuple[tuple[str, float], ...] = ()  # per part but tp (cp, ep): its share of blocking_comm_s
    hidden_part: np.ndarray | None = None  # per overlapped collective: its part (None: all tp)
    hidden_span: np.ndarray | None = None  # per overlapped collective: kernels beside it (None: one each)
    host_syncs: tuple[tuple[int, int], ...] = ()  # host waits for the device (`PassWork.host_syncs`)
    hidden_share: np.ndarray | None = None  # z14: per overlapped collective, its occupancy share (NaN: calibrated)

    @staticmethod
    def of(work: PassWork, comm: CommModel, group: Group, others: Mapping[str, Group] | None = None,
           node: NvlinkNode | None = None) -> PassCost:
        """`group` prices the tensor-parallel collectives, `others` those of other groups
        (`Collective.group`: the context-parallel and the expert ones); `node` (the
        cluster's GPU and NVLink) DeepEP's kernels inside one node."""
        blocking = 0.0
        other: dict[str, float] = {}
        hidden_s, hidden_by, hidden_part, hidden_span, hidden_share = [], [], [], [], []
        units = node.compute_units if node is not None else 0  # z14: the device's SMs (0: no occupancy share)
        for c in work.collectives:
            g = group if c.group == "tp" else (others or {})[c.group]
            part = PART_OF_GROUP[c.group]
            if isinstance(c, DeepEpTransfer):  # DeepEP's or HybridEP's kernels, at their published bandwidths
                cost = c.time_s(g, node)
            else:
                cost = float(comm.time_s(c.collective, c.nbytes, g)) if g.size > 1 else 0.0
            if c.hidden_by != NOT_HIDDEN:
                hidden_s.append(cost)
                hidden_by.append(c.hidden_by)
                hidden_part.append(part)
                hidden_span.append(c.hidden_span)
                hidden_share.append(collective_share(c.group, g, units,
                                                    c.sms(g) if isinstance(c, DeepEpTransfer) else 0))
            else:
                blocking += cost
                if part != "tp":
                    other[part] = other.get(part, 0.0) + cost
        return PassCost(work.kernels, blocking, np.array(hidden_s, dtype=float),
                        np.array(hidden_by, dtype=np.int64), len(work.collectives), tuple(other.items()),
                        np.array(hidden_part) if any(p != "tp" for p in hidden_part) else None,
                        np.array(hidden_span, dtype=np.int64) if any(n != 1 for n in hidden_span) else None,
                        work.host_syncs,
                        None if np.isnan(hidden_share).all() else np.array(hidden_share))

    def comm_s(self, kernel_s: np.ndarray, eff: DeviceEfficiency, part: str = "all") -> float:
        """What the pass's collectives add to its kernels: the blocking ones in full; an
        overlapped collective of time c beside a kernel (or a run of kernels) of time g adds
        max(c - g, 0) + share x min(c, g), i.e. the pair takes max(c, g) + share x min(c, g):
        the calibration's `comm_overlap_contention` for tensor-parallel collectives, the
        occupancy share of the device for the others (`hidden_share`,
        `paraplan.predict.overlap_share`).
        `part`: `all`, or only the tensor-parallel (`tp`), context-parallel (`cp`) or
        expert-parallel (`ep`: all-to-alls and expert-tensor-parallel) ones."""
        if part == "all":
            if not self.hidden_by.size:  # the common case, as below without the hidden ones
                return self.blocking_comm_s
            added = self.blocking_comm_s
        elif part == "tp":
            added = self.blocking_comm_s - sum(dict(self.other_blocking_s).values())
        else:
            added = dict(self.other_blocking_s).get(part, 0.0)
        if self.hidden_by.size:
            if self.hidden_span is None:
                beside = kernel_s[self.hidden_by]
            else:  # the kernels [hidden_by, hidden_by + span) together
                ends = np.concatenate(([0.0], np.cumsum(kernel_s)))
                beside = ends[self.hidden_by + self.hidden_span] - ends[self.hidden_by]
            c = self.hidden_comm_s
            share = (eff.comm_overlap_contention if self.hidden_share is None  # z14: per collective
                     else np.where(np.isnan(self.hidden_share), eff.comm_overlap_contention, self.hidden_share))
            each = np.maximum(c - beside, 0.0) + share * np.minimum(c, beside)
            if part != "all":
                labels = self.hidden_part if self.hidden_part is not None else np.full(c.shape, "tp")
                each = each[labels == part]
            added += float(each.sum())
        return added

    def device_s(self, kernel_s: np.ndarray, eff: DeviceEfficiency, kernel_total_s: float | None = None) -> float:
        """Device time of the pass on one rank, given its kernels' times (and their sum,
        when already summed): kernels plus what its collectives add (`comm_s`) and its
        host waits (`sync_idle_s`)."""
        total = float(kernel_s.sum()) if kernel_total_s is None else kernel_total_s
        return total + self.comm_s(kernel_s, eff) + self.sync_idle_s(kernel_s, eff)

    def sync_idle_s(self, kernel_s: np.ndarray, eff: DeviceEfficiency) -> float:
        """What the pass's host waits add to its device time: after each, the device idles
        while the host issues its next kernel, one `host_kernel_s` (as `pipeline_p2p.sync_s`
        prices `batch_p2p_sync`), less the device time of the kernels still queued when the
        wait ends (`paraplan.predict.moe_host`)."""
        if not self.host_syncs:
            return 0.0
        return sum(max(eff.host_kernel_s - float(kernel_s[first:end].sum()), 0.0) for first, end in self.host_syncs)

    def host_s(self, eff: DeviceEfficiency) -> float:
        """Host time to issue the pass."""
        return len(self.kernels) * eff.host_kernel_s + self.num_collectives * eff.host_collective_s

    def weight_grad_s(self, kernel_s: np.ndarray) -> float:
        return float(kernel_s[self.kernels.weight_grad].sum()) if len(self.kernels) else 0.0
