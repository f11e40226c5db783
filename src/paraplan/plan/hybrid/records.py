"""Typed results of the planner: stages, plans (pipelines and pure data parallelism,
with their gradient synchronisation), data-parallel baselines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from paraplan.core import Strategy


@dataclass(frozen=True)
class StageSlot:
    """One stage inside a pipeline copy while searching: layers [first, stop) on
    `width` devices starting at device `offset` of the copy."""

    first: int
    stop: int
    width: int
    offset: int


@dataclass(frozen=True)
class PlannedStage:
    """A stage of a plan as people read it: layers first_layer..last_layer (inclusive,
    0-based) replicated on `devices` (all copies together); derived from the plan's
    `Strategy` (`HybridPlan.stages`)."""

    first_layer: int
    last_layer: int
    devices: tuple[int, ...]

    @property
    def replicas(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class HybridPlan:
    """`copies` identical pipelines of `pipeline_devices` devices each; every copy runs
    its share of the global batch as `num_microbatches` micro-batches with 1F1B. One
    stage is pure data parallelism (the micro-batches are gradient accumulation steps).

    `strategy` is the plan itself: one pipeline whose stage s (layers from
    `stage_boundaries`) is replicated on the devices `placement` lists (all copies
    together), with its `gradient_sync` (`end` for pipelines; pure data parallelism also
    `overlap` or `p3`), the `Strategy` the simulator runs."""

    strategy: Strategy
    num_layers: int  # of the planned model
    copies: int
    pipeline_devices: int
    micro_batch_size: float  # samples per micro-batch of one copy
    latency_s: float  # the planner's estimate (HPGO form)
    speedup: float  # single-device time / latency_s

    @property
    def num_microbatches(self) -> int:
        return self.strategy.num_microbatches

    @property
    def num_stages(self) -> int:
        return self.strategy.pipeline_model_parallel_size

    @property
    def gradient_sync(self) -> str:
        return self.strategy.gradient_sync

    @property
    def stages(self) -> tuple[PlannedStage, ...]:
        ranges = self.strategy.stage_layer_ranges(self.num_layers)
        return tuple(PlannedStage(start, stop - 1, devices)
                     for (start, stop), devices in zip(ranges, self.strategy.placement, strict=True))

    def describe(self) -> str:
        return format_stages(self.stages, self.strategy.gradient_sync)


def format_stages(stages: Sequence[PlannedStage], gradient_sync: str = "end") -> str:
    """`[0-96]x15 | [97-175]x1`: inclusive layer ranges and replicas; a gradient
    synchronisation other than `end` follows, e.g. `[0-175]x16 sync=p3` (data
    parallelism on 16 devices with P3)."""
    text = " | ".join(f"[{s.first_layer}-{s.last_layer}]x{s.replicas}" for s in stages)
    return text if gradient_sync == "end" else f"{text} sync={gradient_sync}"


@dataclass(frozen=True)
class DataParallelEstimate:
    """The three data-parallel baselines at one batch size (planner estimates)."""

    accumulation_steps: int  # micro-steps per iteration that memory requires
    no_overlap_s: float
    overlap_s: float
    p3_s: float
    single_device_s: float

    def speedup(self, latency_s: float) -> float:
        return self.single_device_s / latency_s
