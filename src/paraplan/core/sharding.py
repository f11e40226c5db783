"""How a run shards its weight state over the data-parallel ranks: ZeRO stages, fully
sharded data parallelism (PyTorch FSDP2, Megatron-FSDP) and hybrid sharding (HSDP), in
the names of the frameworks that have them.

The d x c ranks that hold the same weights (Megatron's dp-cp group) split into R
replicas of a sharding group of d c / R ranks: the sharded state (optimizer state from
ZeRO-1, gradients from ZeRO-2, weights from ZeRO-3) is split over the sharding group
and each shard is kept R times. R comes from whichever of these the run names (they
must agree where several are given):

- torchtitan's `data_parallel_replicate_degree` R, or `data_parallel_shard_degree` S
  (then R = d / S; torchtitan folds the context-parallel ranks into the shard group, so
  it has S x c ranks);
- Megatron-LM's `num_distributed_optimizer_instances` (with its distributed
  optimizer: partial ZeRO-1 sharding, one optimizer instance per replica).

Megatron-FSDP's `data_parallel_sharding_strategy` names the ZeRO stage
(`SHARDING_STRATEGY_STAGE`). `check_sharding` holds every rule between these settings.

A mixture-of-experts model's routed experts are held by the expert-data-parallel group
(EDP = t c d / (EP ETP) ranks). With R replicas its sharded state is split the same way:
over EDP / R ranks, each shard kept R times (Megatron-Core's intra- and inter-partial
expert-data-parallel groups, `parallel_state`: "Expert data parallel size should be
divisible by partial DistOpt shard factor"; torchtitan shards the experts over the
data-parallel shard ranks that expert parallelism leaves, `dp_shard_mod_ep`, and
replicates them over `dp_replicate`). R must divide EDP.

With sharded gradients (ZeRO-2 and 3) and several micro-batches per iteration, the
gradients are reduce-scattered at one of two moments (`sharded_grad_reduce`):

- `every_microbatch`: each micro-batch's backward reduce-scatters its gradients, layer
  by layer, into the fp32 gradient shard (Megatron-FSDP `optim_grads` and
  `optim_grads_params`: "for grads shard mode there will actually always be gradient
  sync happening", its `no_sync`; DeepSpeed ZeRO-2). Only the shard stays.
- `last_microbatch`: the micro-batches accumulate unsharded gradients (in the reduce
  dtype, fp32) and the last backward reduce-scatters them once (PyTorch's pipeline
  stages with FSDP2, as torchtitan runs them: `set_requires_gradient_sync(False)` on
  every backward but the last; Meta's Llama 3 405B: FP32 gradient accumulation over
  micro-batches, then an FP32 reduce-scatter, Dubey et al. 2024, Section 3.3.2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from paraplan.core.errors import StrategyError

if TYPE_CHECKING:
    from paraplan.core.run_settings import RunSettings
    from paraplan.core.transformer import TransformerModel

ReshardAfterForward = Literal["default", "always", "never"]
RESHARD_AFTER_FORWARD: tuple[str, ...] = ("default", "always", "never")
"""torchtitan's `fsdp_reshard_after_forward`: `always` frees each FSDP unit's gathered
weights after its forward (gathered again for the backward), `never` keeps them until
the backward, `default`: `always` without pipeline parallelism, `never` with it."""
GradReduce = Literal["default", "every_microbatch", "last_microbatch"]
GRAD_REDUCE: tuple[str, ...] = ("default", "every_microbatch", "last_microbatch")
"""When sharded gradients are reduce-scattered (module doc); `default`: every micro-batch
with zero_stage 2 (Megatron-FSDP `optim_grads`, DeepSpeed ZeRO-2), after the last with
zero_stage 3 (FSDP2 under PyTorch's pipeline schedules)."""
SHARDING_STRATEGY_STAGE: dict[str, int] = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
"""Megatron-FSDP's `data_parallel_sharding_strategy` -> the ZeRO stage it is."""


def replicate_degree(settings: RunSettings) -> int:
    """R: copies of each shard of the sharded state (1: sharded over all d x c ranks)."""
    if settings.data_parallel_replicate_degree:
        return settings.data_parallel_replicate_degree
    if settings.data_parallel_shard_degree:
        return max(settings.data_parallel_size // settings.data_parallel_shard_degree, 1)
    return settings.num_distributed_optimizer_instances


def sharding_group_size(settings: RunSettings) -> int:
    """d c / R: the ranks one copy of the sharded state is split over."""
    return max(settings.data_context_parallel_size // replicate_degree(settings), 1)


def expert_sharding_group_size(settings: RunSettings) -> int:
    """EDP / R: the ranks one copy of the routed experts' sharded state is split over."""
    return max(settings.expert_data_parallel_size // replicate_degree(settings), 1)


def reshards_after_forward(settings: RunSettings) -> bool:
    """Whether ZeRO-3 gathers each unit's weights again for its backward."""
    choice = settings.fsdp_reshard_after_forward
    if choice == "default":
        return settings.pipeline_model_parallel_size == 1
    return choice == "always"


def reduces_every_microbatch(settings: RunSettings) -> bool:
    """Whether sharded gradients are reduce-scattered after every micro-batch's backward
    (`GRAD_REDUCE`); False without sharded gradients."""
    if settings.zero_stage < 2:
        return False
    choice = settings.sharded_grad_reduce
    if choice == "default":
        return settings.zero_stage == 2
    return choice == "every_microbatch"


def gathers_once_per_iteration(settings: RunSettings) -> bool:
    """Whether ZeRO-3 gathers each model chunk's weights once per iteration rather than
    per micro-batch: under pipeline parallelism, keeping the weights after the forward,
    PyTorch's pipeline stages also keep them after every backward but the last
    (`set_reshard_after_backward(False)` beside `set_requires_gradient_sync(False)`), so
    the first micro-batch's gather serves them all. Reducing every micro-batch's
    gradients (the stage resharding after each backward) gathers every micro-batch."""
    return (settings.zero_stage == 3 and settings.pipeline_model_parallel_size > 1
            and not reshards_after_forward(settings) and not reduces_every_microbatch(settings))


def _count(key: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        zero = " (0: not set)" if low == 0 else ""
        raise StrategyError(f"{key} must be an integer >= {max(low, 1)}{zero}, got {value!r}")
    return value


def check_sharding(settings: RunSettings, model: TransformerModel) -> None:
    """Raise `StrategyError` for sharding settings that contradict each other or the
    layout (module doc)."""
    d, dc = settings.data_parallel_size, settings.data_context_parallel_size
    shard = _count("data_parallel_shard_degree", settings.data_parallel_shard_degree, 0)
    replicate = _count("data_parallel_replicate_degree", settings.data_parallel_replicate_degree, 0)
    instances = _count("num_distributed_optimizer_instances", settings.num_distributed_optimizer_instances, 1)
    if settings.fsdp_reshard_after_forward not in RESHARD_AFTER_FORWARD:
        raise StrategyError(f"fsdp_reshard_after_forward '{settings.fsdp_reshard_after_forward}' is not one of "
                            f"{', '.join(RESHARD_AFTER_FORWARD)}")
    if shard and replicate and shard * replicate != d:
        raise StrategyError(f"data_parallel_shard_degree x data_parallel_replicate_degree = {shard} x {replicate} "
                            f"is not data_parallel_size {d}")
    for key, value in (("data_parallel_shard_degree", shard), ("data_parallel_replicate_degree", replicate)):
        if value and d % value:
            raise StrategyError(f"{key} {value} does not divide data_parallel_size {d}")
    if instances > 1:
        if not settings.use_distributed_optimizer:
            raise StrategyError("num_distributed_optimizer_instances > 1 needs use_distributed_optimizer (Megatron-LM "
                                "shards one optimizer instance per replica)")
        if d % instances:
            raise StrategyError(f"num_distributed_optimizer_instances {instances} does not divide "
                                f"data_parallel_size {d}")
        named = replicate or (d // shard if shard else 0)
        if named and named != instances:
            raise StrategyError(f"num_distributed_optimizer_instances {instances} and the data-parallel replicate "
                                f"degree {named} (data_parallel_shard/replicate_degree) disagree")
    sharded = settings.zero_stage >= 1 or settings.use_distributed_optimizer
    r = replicate_degree(settings)
    if (shard > 1 or r > 1) and not sharded:
        raise StrategyError(f"data_parallel_shard_degree / data_parallel_replicate_degree {shard or d // r} / {r} "
                            "need sharded state: a zero_stage (torchtitan's FSDP is zero_stage 3) or "
                            "use_distributed_optimizer")
    if settings.fsdp_reshard_after_forward != "default" and settings.zero_stage != 3:
        raise StrategyError(f"fsdp_reshard_after_forward {settings.fsdp_reshard_after_forward} needs zero_stage 3 "
                            f"(sharded weights), got zero_stage {settings.zero_stage}")
    if settings.sharded_grad_reduce not in GRAD_REDUCE:
        raise StrategyError(f"sharded_grad_reduce '{settings.sharded_grad_reduce}' is not one of "
                            f"{', '.join(GRAD_REDUCE)}")
    if settings.sharded_grad_reduce != "default" and settings.zero_stage < 2:
        raise StrategyError(f"sharded_grad_reduce {settings.sharded_grad_reduce} needs sharded gradients "
                            f"(zero_stage 2 or 3), got zero_stage {settings.zero_stage}")
    if reduces_every_microbatch(settings) and (r > 1 or model.is_moe):
        raise StrategyError("sharded_grad_reduce every_microbatch with hybrid sharding or mixture-of-experts layers "
                            "is not modelled (use sharded_grad_reduce last_microbatch)")
    edp = settings.expert_data_parallel_size
    if r > 1 and model.is_moe and edp % r:
        raise StrategyError(f"the replicate degree {r} does not divide the expert-data-parallel size {edp} "
                            f"(t c d / (EP ETP)): each replica must hold whole expert shards")
    if dc % r:
        raise StrategyError(f"the replicate degree {r} does not divide the data x context parallel ranks {dc}")


def stage_of_sharding_strategy(strategy: str, zero_stage: int | None) -> int:
    """The ZeRO stage Megatron-FSDP's `data_parallel_sharding_strategy` names; a
    `zero_stage` given beside it must be the same. Raises ValueError saying what was
    expected."""
    if strategy not in SHARDING_STRATEGY_STAGE:
        raise ValueError(f"expected one of {', '.join(SHARDING_STRATEGY_STAGE)}, got '{strategy}'")
    stage = SHARDING_STRATEGY_STAGE[strategy]
    if zero_stage is not None and zero_stage != stage:
        raise ValueError(f"data_parallel_sharding_strategy {strategy} is zero_stage {stage}, but zero_stage is "
                         f"{zero_stage}")
    return stage
