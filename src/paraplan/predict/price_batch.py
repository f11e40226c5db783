"""A calibration's evaluation of many plain runs at once: `price` and the iteration
time of each run, with the numbers of all runs of one pipeline depth as rows of 2-D
arrays.

A plain run is one the fit meets most: dense layers all alike, no ZeRO-3, a flushed
schedule with one model chunk per rank (1F1B, GPipe), blocking pipeline transfers,
gradients reduced after the compute, no collective overlapped with a kernel (nor the
weight all-gathers with the forward) and no host wait inside a pass. For those, `price`
(`paraplan.predict.build`) is a few elementwise operations per virtual stage; `PlainRuns`
does the same operations, in the same order on the same numbers, on all rows at once
(elementwise IEEE operations do not depend on the array's shape), and runs the engine per pipeline shape
(`paraplan.sim.engine_batch`), so each time is byte-identical to `price` and
`iteration_time_s` run by run (tests/unit/test_calibrate_speed.py). Every other run,
and every run of an evaluation with measured layer factors, is priced run by run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from paraplan.predict.build import OPTIMIZER_KERNELS, RunStructure, price
from paraplan.predict.device_model import DeviceEfficiency, host_bound_s
from paraplan.predict.fsdp2_passes import optimizer_kernels, optimizer_step_bytes
from paraplan.predict.kernel_batch import PassSums
from paraplan.predict.pass_times import PASSES, Pass
from paraplan.sim.engine_batch import execute_batch_arrays
from paraplan.sim.execution import RECURRENCE_MIN_OPS, iteration_times_s
from paraplan.sim.schedules import cached_orders

PLAIN_SCHEDULES = ("1f1b", "gpipe")


def is_plain(st: RunStructure) -> bool:
    """Whether `PlainRuns` prices the run (see the module doc)."""
    s = st.settings
    p, m = s.pipeline_model_parallel_size, s.num_microbatches
    return (len(st.passes) == len(PASSES) and st.fsdp is None and st.attention_mix is None
            and st.moe_layers_per_vstage is None and st.expert_rank_params is None and st.paired_moe_passes is None
            and s.pipeline_schedule in PLAIN_SCHEDULES and s.virtual_pipeline_model_parallel_size == 1
            and not s.p2p_overlapped and not (s.overlap_grad_reduce or s.zero_stage >= 2 or s.DDP_impl == "torch")
            and not (p > 1 and 2 * p * m >= RECURRENCE_MIN_OPS)
            and all(c.hidden_by.size == 0 and not c.host_syncs for c in st.passes)
            and st.hidden_gather_s is None  # z12: overlap_param_gather beside the forward (`param_gather`)
            and st.partial_recompute is None)  # recompute_method: not every layer recomputed alike


@dataclass(frozen=True, eq=False)
class _Depth:
    """The plain runs of one pipeline depth p (rows), what of them no fit changes."""

    members: np.ndarray  # the runs' positions in the evaluation
    dense: np.ndarray  # (R, p) layers per stage
    blocking_s: np.ndarray  # (passes, R) each pass's blocking collectives
    kernels: np.ndarray  # (passes, R) kernels per pass
    collectives: np.ndarray  # (passes, R)
    transfer_s: np.ndarray  # (R, p - 1) send + the receiver's all-gather
    synchronizes: np.ndarray  # (R,) batch_p2p_sync: each blocking exchange costs host_kernel_s
    optimizer_bytes: np.ndarray  # (R, p)
    optimizer_kernels: np.ndarray  # (R, p)
    bandwidth_Bps: np.ndarray  # (R, 1)
    after_comm_s: np.ndarray  # (R, p)
    bucket_end_s: np.ndarray  # (R, p) the bucket reduction's cumulative time (0: no buckets)
    has_buckets: np.ndarray  # (R, p)

    @staticmethod
    def of(members: list[int], runs: Sequence[RunStructure]) -> _Depth:
        sts = [runs[i] for i in members]
        p = sts[0].settings.pipeline_model_parallel_size
        params = [st.optimizer_params() for st in sts]
        return _Depth(
            np.array(members), np.stack([st.layers_per_vstage.astype(float) for st in sts]),
            np.array([[st.passes[j].blocking_comm_s for st in sts] for j in range(len(PASSES))]),
            np.array([[len(st.passes[j].kernels) for st in sts] for j in range(len(PASSES))]),
            np.array([[st.passes[j].num_collectives for st in sts] for j in range(len(PASSES))]),
            np.stack([st.send_s + st.p2p_gather_s for st in sts]).reshape(len(sts), p - 1),
            np.array([st.settings.batch_p2p_sync for st in sts]),
            np.stack([n * optimizer_step_bytes(st.settings, st.precision.optimizer_step_bytes)
                      for st, n in zip(sts, params, strict=True)]),
            np.array([[optimizer_kernels(st.settings, x, OPTIMIZER_KERNELS) for x in n]
                      for st, n in zip(sts, params, strict=True)]),
            np.array([[st.speed.mem_bandwidth_Bps] for st in sts]),
            np.stack([st.after_sync_comm_s for st in sts]),
            np.array([[np.cumsum(g.bucket_s)[-1] if g.bucket_s.size else 0.0 for g in st.grad_sync] for st in sts]),
            np.array([[g.bucket_s.size > 0 for g in st.grad_sync] for st in sts]),
        )

    def costs(self, sums: Sequence[PassSums], eff: DeviceEfficiency) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row, `build.pipeline_costs`' forward and backward op times and
        `build.after_sync_s`, as `price` computes them."""
        total = np.array([[sums[i].kernel_s[j] for i in self.members.tolist()] for j in range(len(PASSES))])
        dev = total + self.blocking_s + 0.0  # PassCost.device_s: kernels, collectives, no host waits
        host = self.kernels * eff.host_kernel_s + self.collectives * eff.host_collective_s
        dense = self.dense
        fwd_dev = dense * dev[Pass.LAYER_FWD][:, None]
        bwd_dev = dense * (dev[Pass.LAYER_RECOMPUTE] + dev[Pass.LAYER_BWD])[:, None]
        fwd_host = dense * host[Pass.LAYER_FWD][:, None] + eff.host_microbatch_s
        bwd_host = dense * (host[Pass.LAYER_RECOMPUTE] + host[Pass.LAYER_BWD])[:, None] + eff.host_microbatch_s
        for ops, times in ((fwd_dev, dev), (fwd_host, host)):
            ops[:, 0] += times[Pass.EMBEDDING_FWD]
            ops[:, -1] += times[Pass.HEAD_FWD]
        for ops, times in ((bwd_dev, dev), (bwd_host, host)):
            ops[:, 0] += times[Pass.EMBEDDING_BWD]
            ops[:, -1] += times[Pass.HEAD_BWD]
        fwd = host_bound_s(fwd_dev, fwd_host, eff)
        bwd = host_bound_s(bwd_dev, bwd_host, eff)
        fwd_p2p = np.zeros_like(fwd)  # pipeline_p2p.p2p_charges: blocking, one chunk per rank
        bwd_p2p = np.zeros_like(bwd)
        fwd_p2p[:, :-1] = self.transfer_s
        bwd_p2p[:, 1:] = self.transfer_s
        fwd = fwd + fwd_p2p
        bwd = bwd + bwd_p2p
        if dense.shape[1] > 1:  # and each exchange's host synchronisation
            sync = np.where(self.synchronizes, eff.host_kernel_s, 0.0)[:, None]
            gets = np.arange(dense.shape[1])
            fwd = fwd + (gets < dense.shape[1] - 1) * sync
            bwd = bwd + (gets > 0) * sync
        step = self.optimizer_bytes / (self.bandwidth_Bps * eff.memory_efficiency) \
            + self.optimizer_kernels * eff.kernel_latency_s
        return fwd, bwd, self.after_comm_s + step


@dataclass(frozen=True, eq=False)
class PlainRuns:
    """Some structures' plain runs, grouped by pipeline depth; the rest apart."""

    structures: tuple[RunStructure, ...]
    depths: tuple[_Depth, ...]
    others: tuple[int, ...]

    @staticmethod
    def of(structures: Sequence[RunStructure]) -> PlainRuns:
        by_depth: dict[int, list[int]] = {}
        others = []
        for i, st in enumerate(structures):
            if is_plain(st):
                by_depth.setdefault(st.settings.pipeline_model_parallel_size, []).append(i)
            else:
                others.append(i)
        return PlainRuns(tuple(structures), tuple(_Depth.of(m, structures) for m in by_depth.values()),
                         tuple(others))

    def iteration_s(self, eff: DeviceEfficiency, kernel_s: list[list[np.ndarray]],
                    sums: Sequence[PassSums]) -> np.ndarray:
        """Each structure's predicted iteration time, byte-identical to
        `iteration_time_s(price(...))` run by run."""
        out = np.empty(len(self.structures))
        if len(eff.layer_time_factors):  # measured factors: run by run
            others: Sequence[int] = range(len(self.structures))
        else:
            others = self.others
            for depth in self.depths:
                self._plain(depth, eff, sums, out)
        sts = self.structures
        out[list(others)] = iteration_times_s([price(sts[i], kernel_s[i], eff, sums[i]) for i in others])
        return out

    def _plain(self, depth: _Depth, eff: DeviceEfficiency, sums: Sequence[PassSums], out: np.ndarray) -> None:
        fwd, bwd, after = depth.costs(sums, eff)
        by_shape: dict[tuple[str, int], list[int]] = {}
        for row, i in enumerate(depth.members.tolist()):
            s = self.structures[i].settings
            by_shape.setdefault((s.pipeline_schedule, s.num_microbatches), []).append(row)
        p = depth.dense.shape[1]
        no_send = np.zeros((len(depth.members), p - 1))
        for (schedule, m), rows in by_shape.items():
            idx = np.array(rows)
            device, ends = execute_batch_arrays(cached_orders(schedule, p, m, 1, 1), fwd[idx], bwd[idx],
                                                np.zeros((idx.size, p)), no_send[idx], no_send[idx], m)
            compute_end = np.zeros((idx.size, p))
            for d in range(p):  # execution._tail: np.maximum.at from zeros
                compute_end[:, d] = np.maximum(ends[device == d].max(axis=0), 0.0)
            sync_end = np.where(depth.has_buckets[idx], compute_end + depth.bucket_end_s[idx], compute_end)
            out[depth.members[idx]] = (sync_end + after[idx]).max(axis=1)
