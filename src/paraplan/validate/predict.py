"""The simulator's prediction of the strategies the validate stage runs.

Each strategy becomes a `Strategy` on the 2 devices of the cluster and goes through
`paraplan.sim.simulate` with the profile and the fitted communication model, with
the layout the real run uses (pipeline cut, micro-batches, one gradient bucket per
layer for the overlapped all-reduce, the model's tensor-parallel all-reduces).

One documented correction is applied on top of the simulator, because it is a
fact of the real run the simulator cannot know:
- `tp2`: when the model's first layer starts a Linear pair, the pair's input is
  the data, which needs no gradient, so its backward all-reduce never runs
  (Megatron's "f" operator is a no-op there); the simulator charges one all-reduce
  per pair in both directions, so one all-reduce of the pair's input is removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from paraplan.core import Cluster, CommModel, Group, ModelProfile, Strategy, StrategyError
from paraplan.validate.strategies import PIPELINE_SCHEDULES, STRATEGIES, WORLD_SIZE

# Each layer's gradients form their own bucket: the real overlapped run starts one
# all-reduce per parameter as soon as backward has produced it.
PER_LAYER_BUCKET_BYTES = 1.0


@dataclass(frozen=True)
class PredictionSetup:
    """What the real run does, as far as the prediction needs it."""

    batch_size: int
    microbatches: int
    pipeline_boundary: int  # first layer of pipeline stage 1
    tp_allreduces: tuple[float, ...]  # per layer, see tensor_parallel.tp_allreduce_counts
    first_pair_input_needs_grad: bool = False


def strategy_for(name: str, setup: PredictionSetup) -> Strategy:
    """The `Strategy` the simulator runs for strategy `name`."""
    if name == "dp":
        return Strategy(data_degree=WORLD_SIZE)
    if name == "dp_overlap":
        return Strategy(data_degree=WORLD_SIZE, overlap_grad_allreduce=True)
    if name == "tp2":
        return Strategy(tensor_degree=WORLD_SIZE)
    if name in PIPELINE_SCHEDULES:
        return Strategy(
            pipeline_degree=WORLD_SIZE, microbatches=setup.microbatches,
            schedule=PIPELINE_SCHEDULES[name], stage_boundaries=(setup.pipeline_boundary,),
        )
    raise StrategyError(f"unknown strategy '{name}'; known: {', '.join(STRATEGIES)}")


def tp_unused_backward_allreduce_s(profile: ModelProfile, comm: CommModel, setup: PredictionSetup) -> float:
    """The backward all-reduce the simulator charges for the first Linear pair when
    the real run skips it (its input is the data); 0 otherwise."""
    counts = setup.tp_allreduces
    starts_with_pair = len(counts) > 1 and counts[0] == 0 and counts[1] == 1
    if not starts_with_pair or setup.first_pair_input_needs_grad:
        return 0.0
    nbytes = float(profile.activation_bytes_at(setup.batch_size)[1])
    return float(comm.time_s("all_reduce", nbytes, Group(WORLD_SIZE, 1)))


def predict_step_times(
    profile: ModelProfile,
    cluster: Cluster,
    comm: CommModel,
    strategies: Sequence[str],
    setup: PredictionSetup,
) -> dict[str, float]:
    """Predicted step time (s) of each strategy at `setup.batch_size` samples."""
    from paraplan.sim import simulate

    if cluster.num_devices < WORLD_SIZE:
        raise StrategyError(f"cluster '{cluster.name}' has {cluster.num_devices} devices, need {WORLD_SIZE}")
    out: dict[str, float] = {}
    for name in strategies:
        timeline = simulate(
            profile, cluster, comm, strategy_for(name, setup), setup.batch_size,
            grad_bucket_bytes=PER_LAYER_BUCKET_BYTES, tp_allreduces=list(setup.tp_allreduces),
        )
        step_s = timeline.step_time_s
        if name == "tp2":
            step_s -= tp_unused_backward_allreduce_s(profile, comm, setup)
        out[name] = float(step_s)
    return out
