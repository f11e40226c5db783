"""Typed results of the planner: stages, hybrid plans, data-parallel baselines."""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.core import ScheduleName, Strategy


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
    """A stage of a plan: layers first_layer..last_layer (inclusive, 0-based) replicated on
    `devices` (all copies together)."""

    first_layer: int
    last_layer: int
    devices: tuple[int, ...]

    @property
    def replicas(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class HybridPlan:
    """`copies` identical pipelines of `pipeline_devices` devices each; every copy runs
    its share of the global batch as `num_microbatches` micro-batches with 1F1B."""

    stages: tuple[PlannedStage, ...]
    num_microbatches: int
    copies: int
    pipeline_devices: int
    micro_batch_size: float  # samples per micro-batch of one copy
    latency_s: float  # the planner's estimate (HPGO form)
    speedup: float  # single-device time / latency_s
    schedule: ScheduleName = "1f1b"

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def devices_used(self) -> int:
        return sum(s.replicas for s in self.stages)

    def describe(self) -> str:
        return format_stages(self.stages)

    def to_strategy(self) -> Strategy:
        """The simulator's view: one pipeline whose stage s is replicated on its devices."""
        return Strategy(
            data_parallel_size=1,
            pipeline_model_parallel_size=self.num_stages,
            num_microbatches=self.num_microbatches,
            schedule=self.schedule,
            stage_boundaries=tuple(s.first_layer for s in self.stages[1:]),
            stage_replicas=tuple(s.replicas for s in self.stages),
            placement=tuple(s.devices for s in self.stages),
        )


def format_stages(stages) -> str:
    """`[0-96]x15 | [97-175]x1`: inclusive layer ranges and replicas."""
    return " | ".join(f"[{s.first_layer}-{s.last_layer}]x{s.replicas}" for s in stages)


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
