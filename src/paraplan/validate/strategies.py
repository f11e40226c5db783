"""The strategies the validate stage runs for real and predicts.

Every strategy uses 2 ranks:
- `dp`: data parallel, gradients all-reduced after the whole backward pass.
- `dp_overlap`: data parallel, each gradient all-reduced asynchronously as soon as
  backward has produced it (overlapped with the rest of backward).
- `pp_1f1b`, `pp_gpipe`: 2 pipeline stages, micro-batches, activations and their
  gradients sent between the ranks; schedules 1F1B (PipeDream-Flush) and GPipe.
- `tp2`: Megatron-style tensor parallelism of degree 2 (column- then row-parallel
  linear pairs; one activation all-reduce in forward and one in backward per pair).
"""

from __future__ import annotations

from paraplan.core import Strategy, StrategyError
from paraplan.core.glossary import ScheduleName

STRATEGIES: tuple[str, ...] = ("dp", "dp_overlap", "pp_1f1b", "pp_gpipe", "tp2")
WORLD_SIZE = 2

PIPELINE_SCHEDULES: dict[str, ScheduleName] = {"pp_1f1b": "1f1b", "pp_gpipe": "gpipe"}


def strategy_for(name: str, num_microbatches: int, pipeline_boundary: int) -> Strategy:
    """The `Strategy` of strategy `name` on the 2 ranks: what the real run executes (its
    pipelines run this strategy's schedule, micro-batches and cut) and what the
    simulator predicts."""
    if name == "dp":
        return Strategy(data_parallel_size=WORLD_SIZE)
    if name == "dp_overlap":
        return Strategy(data_parallel_size=WORLD_SIZE, gradient_sync="overlap")
    if name == "tp2":
        return Strategy(tensor_model_parallel_size=WORLD_SIZE)
    if name in PIPELINE_SCHEDULES:
        return Strategy(
            pipeline_model_parallel_size=WORLD_SIZE, num_microbatches=num_microbatches,
            schedule=PIPELINE_SCHEDULES[name], stage_boundaries=(pipeline_boundary,),
        )
    raise StrategyError(f"unknown strategy '{name}'; known: {', '.join(STRATEGIES)}")


def round_order(names: tuple[str, ...], round_index: int) -> tuple[str, ...]:
    """The strategies in the order round `round_index` times them: rotated by one each
    round (round-robin), so over the rounds each holds every place once in turn (first
    after the calibration, last before the next round) and no strategy owns a place
    whose load differs."""
    k = round_index % len(names) if names else 0
    return names[k:] + names[:k]
