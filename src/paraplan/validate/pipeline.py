"""Pipeline parallelism for real: one stage per rank, micro-batches, activations
sent forward and their gradients sent back with point-to-point messages.

A stage runs the op order of the simulator's own schedule object
(`paraplan.sim.schedules`): the same `OpOrder` the engine executes, so a schedule
is written once. Any schedule whose orders hold only whole forwards and backwards of
one model chunk per rank runs here (gpipe, 1f1b, eager_1f1b, distir_greedy, and
2bw / eager_1f1b_noflush within one step); split-backward (zb_h1) and interleaved
(v > 1) orders are refused. Sends are asynchronous (kept until the step ends);
receives block, so a stage waits exactly when its input is not there yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from paraplan.core import StrategyError
from paraplan.core.glossary import ScheduleName
from paraplan.sim.schedules import FWD, WGT, OpOrder, get_schedule


def stage_order(schedule: ScheduleName, stage: int, num_stages: int, num_microbatches: int) -> OpOrder:
    """Stage `stage`'s op order for one step of `schedule`, as the simulator runs it."""
    sched = get_schedule(schedule)
    orders = sched.orders(num_stages, num_microbatches)
    order = orders[stage]
    if sched.split_backward or (order.kind == WGT).any() or (order.chunk != 0).any():
        raise StrategyError(
            f"the validate stage runs whole forwards and backwards of one model chunk per rank; "
            f"schedule '{schedule}' splits the backward or interleaves chunks"
        )
    return order


def balanced_boundary(stage_costs_s: Sequence[float]) -> int:
    """First layer of stage 1 for 2 stages: the cut that minimises the slower stage
    (ties: the earlier cut). Both the real run and the prediction use it."""
    costs = list(stage_costs_s)
    if len(costs) < 2:
        raise StrategyError(f"2 pipeline stages need at least 2 layers, the model has {len(costs)}")
    total = sum(costs)
    best, best_cut, prefix = float("inf"), 1, 0.0
    for cut in range(1, len(costs)):
        prefix += costs[cut - 1]
        slower = max(prefix, total - prefix)
        if slower < best - 1e-15:
            best, best_cut = slower, cut
    return best_cut


class PipelineStage:
    """Stage `stage` of `num_stages` on rank `ranks[stage]` of the default group."""

    def __init__(
        self,
        module: nn.Module,
        stage: int,
        num_stages: int,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        input_shape: torch.Size,
        input_dtype: torch.dtype,
        output_shape: torch.Size,
        device: torch.device,
    ):
        self.module = module
        self.stage = stage
        self.num_stages = num_stages
        self.loss = loss
        self.input_shape = input_shape
        self.input_dtype = input_dtype
        self.output_shape = output_shape
        self.device = device

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    def run(self, order: OpOrder, inputs: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]) -> float:
        """One step in `order` (`stage_order`): `inputs`/`targets` hold every micro-batch
        (only the first stage reads inputs, only the last reads targets). Returns the
        summed loss on the last stage (0 elsewhere); gradients accumulate in the
        parameters and equal those of the whole batch (each micro-batch's loss is
        divided by M)."""
        m_count = len(inputs)
        stage_in: dict[int, torch.Tensor] = {}
        stage_out: dict[int, torch.Tensor] = {}
        pending: list = []
        total = 0.0
        for kind, m in zip(order.kind.tolist(), order.microbatch.tolist(), strict=True):
            if kind == FWD:
                if self.is_first:
                    x = inputs[m]
                else:
                    x = torch.empty(self.input_shape, dtype=self.input_dtype, device=self.device)
                    dist.recv(x, src=self.stage - 1)
                    x.requires_grad_(True)
                stage_in[m] = x
                y = self.module(x)
                if self.is_last:
                    y = self.loss(y, targets[m]) / m_count
                    total += float(y.detach())
                else:
                    out = y.detach()
                    pending.append((dist.isend(out, dst=self.stage + 1), out))
                stage_out[m] = y
            else:
                y = stage_out.pop(m)
                if self.is_last:
                    y.backward()
                else:
                    grad = torch.empty(self.output_shape, dtype=y.dtype, device=self.device)
                    dist.recv(grad, src=self.stage + 1)
                    y.backward(grad)
                x = stage_in.pop(m)
                if not self.is_first:
                    g = x.grad
                    assert g is not None  # x requires grad and the backward just ran through it
                    pending.append((dist.isend(g, dst=self.stage - 1), g))
        for work, _ in pending:
            work.wait()
        return total
