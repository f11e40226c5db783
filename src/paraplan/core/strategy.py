"""A parallelisation strategy: degrees, micro-batches, schedule and layout."""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.core.errors import StrategyError

SCHEDULES: tuple[str, ...] = (
    "gpipe",
    "1f1b",
    "2bw",
    "eager_1f1b",
    "eager_1f1b_noflush",
    "interleaved_1f1b",
    "zb_h1",
    "distir_greedy",
)
GRAD_SYNCS: tuple[str, ...] = ("end", "overlap", "p3")


@dataclass(frozen=True)
class Strategy:
    """D x T x P over `num_devices` devices.

    - `stage_boundaries`: first layer of stages 1..P-1 (empty: even split).
    - `stage_replicas`: data-parallel width of each stage (DAPPLE's uneven "15:1");
      empty: `data_degree` for every stage.
    - `placement`: device ids of each stage (empty: node-major packing, stage by stage),
      r_s x T ids per stage, replica-major (tensor ranks of one replica adjacent).
    - `virtual_stages`: model chunks per device (v); only `interleaved_1f1b` takes v > 1.
    - `grad_sync`: how gradients are all-reduced over data-parallel replicas:
      `end` (one all-reduce after the last backward), `overlap` (buckets during the
      last backward, DDP / Horovod) or `p3` (priority-based parameter propagation:
      per-layer all-reduces, lowest layer first, overlapping the last backward and the
      next iteration's forward; pure data parallelism only, pipeline_degree 1).
    - `overlap_grad_allreduce`: the older spelling of `grad_sync="overlap"` (True turns
      the default `end` into `overlap`); `gradient_sync` is the mode in effect.
    - `iterations`: iterations a timeline shows (the step time is per iteration).
    """

    data_degree: int = 1
    tensor_degree: int = 1
    pipeline_degree: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    stage_boundaries: tuple[int, ...] = ()
    stage_replicas: tuple[int, ...] = ()
    placement: tuple[tuple[int, ...], ...] = ()
    virtual_stages: int = 1
    overlap_grad_allreduce: bool = False
    iterations: int = 1
    grad_sync: str = "end"

    def __post_init__(self) -> None:
        for key in ("data_degree", "tensor_degree", "pipeline_degree", "microbatches",
                    "virtual_stages", "iterations"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise StrategyError(f"{key} must be an integer >= 1, got {value!r}")
        if self.schedule not in SCHEDULES:
            raise StrategyError(
                f"unknown schedule '{self.schedule}'; known: {', '.join(SCHEDULES)}"
            )
        if self.grad_sync not in GRAD_SYNCS:
            raise StrategyError(f"unknown grad_sync '{self.grad_sync}'; known: {', '.join(GRAD_SYNCS)}")
        p = self.pipeline_degree
        if self.grad_sync == "p3" and (p > 1 or self.virtual_stages > 1):
            raise StrategyError(
                f"grad_sync 'p3' is a data-parallel gradient schedule; needs pipeline_degree 1 and "
                f"virtual_stages 1, got {p} and {self.virtual_stages}"
            )
        if self.stage_boundaries and len(self.stage_boundaries) != p - 1:
            raise StrategyError(
                f"stage_boundaries needs {p - 1} entries for {p} stages, got {len(self.stage_boundaries)}"
            )
        if list(self.stage_boundaries) != sorted(set(self.stage_boundaries)):
            raise StrategyError(f"stage_boundaries must increase strictly: {self.stage_boundaries}")
        if self.stage_replicas and len(self.stage_replicas) != p:
            raise StrategyError(
                f"stage_replicas needs {p} entries for {p} stages, got {len(self.stage_replicas)}"
            )
        if any(r < 1 for r in self.stage_replicas):
            raise StrategyError(f"stage_replicas must be >= 1: {self.stage_replicas}")
        if self.placement and len(self.placement) != p:
            raise StrategyError(f"placement needs one device list per stage ({p}), got {len(self.placement)}")

    @property
    def gradient_sync(self) -> str:
        """The gradient synchronisation in effect (`grad_sync`, with `overlap_grad_allreduce`
        turning `end` into `overlap`)."""
        if self.grad_sync == "end" and self.overlap_grad_allreduce:
            return "overlap"
        return self.grad_sync

    @property
    def replicas_per_stage(self) -> tuple[int, ...]:
        return self.stage_replicas or (self.data_degree,) * self.pipeline_degree

    @property
    def num_devices(self) -> int:
        return sum(self.replicas_per_stage) * self.tensor_degree

    def stage_layer_ranges(self, num_layers: int) -> list[tuple[int, int]]:
        """[start, stop) layer range per stage; an even split gives the first stages
        one layer more when the layers do not divide."""
        p = self.pipeline_degree
        if p > num_layers:
            raise StrategyError(f"{p} pipeline stages need at least {p} layers, the model has {num_layers}")
        if self.stage_boundaries:
            starts = [0, *self.stage_boundaries]
            if starts[-1] >= num_layers:
                raise StrategyError(
                    f"stage boundary {starts[-1]} is past the last layer ({num_layers - 1})"
                )
        else:
            base, extra = divmod(num_layers, p)
            starts = [s * base + min(s, extra) for s in range(p)]
        stops = [*starts[1:], num_layers]
        return list(zip(starts, stops, strict=True))
