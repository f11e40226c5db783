"""A parallelisation strategy: degrees, micro-batches, schedule and layout, in the
vocabulary of `paraplan.core.glossary` (Megatron-LM's names)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from paraplan.core.errors import StrategyError
from paraplan.core.glossary import GRADIENT_SYNCS, SCHEDULES, GradientSync, ScheduleName
from paraplan.core.layer_split import even_layer_ranges

__all__ = ["GRADIENT_SYNCS", "SCHEDULES", "Strategy"]


def _whole(value: object) -> bool:
    """An integer (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class Strategy:
    """D x T x P over `num_devices` devices: what the simulator runs for one step."""

    data_parallel_size: int = 1
    """d: replicas of every pipeline stage (unless `stage_replicas` says otherwise)."""
    tensor_model_parallel_size: int = 1
    """t: ranks that split every layer (Megatron's column/row split)."""
    pipeline_model_parallel_size: int = 1
    """p: pipeline stages."""
    num_microbatches: int = 1
    """M: micro-batches per iteration; each stage splits one over its replicas (DAPPLE)."""
    schedule: ScheduleName = "1f1b"
    """The pipeline schedule."""
    stage_boundaries: tuple[int, ...] = ()
    """First layer of stages 1..p-1 (empty: an even split)."""
    stage_replicas: tuple[int, ...] = ()
    """Data-parallel width of each stage (DAPPLE's uneven "15:1"); empty: d for every stage."""
    placement: tuple[tuple[int, ...], ...] = ()
    """Device ids of each stage, r_s x t per stage, replica-major (the tensor ranks of one
    replica adjacent); empty: node-major packing, stage by stage."""
    virtual_pipeline_model_parallel_size: int = 1
    """v: model chunks per device; only `interleaved_1f1b` takes v > 1."""
    gradient_sync: GradientSync = "end"
    """How replicas reduce gradients: `end` (one all-reduce after the last backward),
    `overlap` (buckets during the last backward, DDP / Megatron's overlap_grad_reduce) or
    `p3` (per-layer all-reduces, lowest layer first, overlapping the last backward and
    the next iteration's forward; pure data parallelism only)."""
    iterations: int = 1
    """Iterations a timeline shows (the step time is per iteration)."""

    def __post_init__(self) -> None:
        for key in ("data_parallel_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                    "num_microbatches", "virtual_pipeline_model_parallel_size", "iterations"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StrategyError(f"{key} must be an integer >= 1, got {value!r}")
        if self.schedule not in SCHEDULES:
            raise StrategyError(
                f"unknown schedule '{self.schedule}'; known: {', '.join(SCHEDULES)}"
            )
        if self.gradient_sync not in GRADIENT_SYNCS:
            raise StrategyError(
                f"unknown gradient_sync '{self.gradient_sync}'; known: {', '.join(GRADIENT_SYNCS)}"
            )
        p, v = self.pipeline_model_parallel_size, self.virtual_pipeline_model_parallel_size
        if self.gradient_sync == "p3" and (p > 1 or v > 1):
            raise StrategyError(
                "gradient_sync 'p3' is a data-parallel gradient schedule; needs pipeline_model_parallel_size 1 "
                f"and virtual_pipeline_model_parallel_size 1, got {p} and {v}"
            )
        if self.stage_boundaries and len(self.stage_boundaries) != p - 1:
            raise StrategyError(
                f"stage_boundaries needs {p - 1} entries for {p} stages, got {len(self.stage_boundaries)}"
            )
        if not all(_whole(b) and b >= 1 for b in self.stage_boundaries):
            raise StrategyError(f"stage_boundaries must be layer indices >= 1: {self.stage_boundaries}")
        if list(self.stage_boundaries) != sorted(set(self.stage_boundaries)):
            raise StrategyError(f"stage_boundaries must increase strictly: {self.stage_boundaries}")
        if self.stage_replicas and len(self.stage_replicas) != p:
            raise StrategyError(
                f"stage_replicas needs {p} entries for {p} stages, got {len(self.stage_replicas)}"
            )
        if not all(_whole(r) and r >= 1 for r in self.stage_replicas):
            raise StrategyError(f"stage_replicas must be >= 1: {self.stage_replicas}")
        if self.placement and len(self.placement) != p:
            raise StrategyError(f"placement needs one device list per stage ({p}), got {len(self.placement)}")
        if not all(_whole(d) and d >= 0 for ids in self.placement for d in ids):
            raise StrategyError(f"placement must list device ids (integers >= 0): {self.placement}")

    @property
    def replicas_per_stage(self) -> tuple[int, ...]:
        return self.stage_replicas or (self.data_parallel_size,) * self.pipeline_model_parallel_size

    @property
    def num_devices(self) -> int:
        return sum(self.replicas_per_stage) * self.tensor_model_parallel_size

    def stage_layer_ranges(self, num_layers: int) -> list[tuple[int, int]]:
        """[start, stop) layer range per stage; an even split gives the first stages
        one layer more when the layers do not divide."""
        p = self.pipeline_model_parallel_size
        if p > num_layers:
            raise StrategyError(f"{p} pipeline stages need at least {p} layers, the model has {num_layers}")
        if not self.stage_boundaries:
            return even_layer_ranges(num_layers, p)
        starts = [0, *self.stage_boundaries]
        if starts[-1] >= num_layers:
            raise StrategyError(f"stage boundary {starts[-1]} is past the last layer ({num_layers - 1})")
        return list(zip(starts, [*starts[1:], num_layers], strict=True))
