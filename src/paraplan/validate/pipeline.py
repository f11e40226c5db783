"""Pipeline parallelism for real: one stage per rank, micro-batches, activations
sent forward and their gradients sent back with point-to-point messages.

A schedule is, per stage, the ordered list of its operations (`("F", m)` forward
of micro-batch m, `("B", m)` its backward), the same orders the simulator uses.
Sends are asynchronous (kept until the step ends); receives block, so a stage
waits exactly when its input is not there yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from paraplan.core import StrategyError

Op = tuple[str, int]


def schedule_ops(schedule: str, stage: int, num_stages: int, microbatches: int) -> list[Op]:
    """Stage `stage`'s operations in order for `gpipe` (all forwards, then all
    backwards) or `1f1b` (min(p - s - 1, M) warm-up forwards, then one forward and one
    backward alternately, then the remaining backwards)."""
    m_count, p = microbatches, num_stages
    if schedule == "gpipe":
        return [("F", m) for m in range(m_count)] + [("B", m) for m in range(m_count)]
    if schedule == "1f1b":
        warmup = min(p - stage - 1, m_count)
        ops: list[Op] = [("F", m) for m in range(warmup)]
        for m in range(m_count - warmup):
            ops += [("F", m + warmup), ("B", m)]
        ops += [("B", m) for m in range(m_count - warmup, m_count)]
        return ops
    raise StrategyError(f"the validate stage runs pipeline schedules gpipe and 1f1b, not '{schedule}'")


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

    def run(self, ops: Sequence[Op], inputs: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]) -> float:
        """One step: `inputs`/`targets` hold every micro-batch (only the first stage
        reads inputs, only the last reads targets). Returns the summed loss on the
        last stage (0 elsewhere); gradients accumulate in the parameters and equal
        those of the whole batch (each micro-batch's loss is divided by M)."""
        m_count = len(inputs)
        stage_in: dict[int, torch.Tensor] = {}
        stage_out: dict[int, torch.Tensor] = {}
        pending: list = []
        total = 0.0
        for kind, m in ops:
            if kind == "F":
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
                    pending.append((dist.isend(g, dst=self.stage - 1), g))
        for work, _ in pending:
            work.wait()
        return total
