"""Where ranks live and how many nodes a group spans: the placement part of the
engine's builders.

Two ways to name devices meet here: a layer profile's strategy lists (or packs) the
device ids of each pipeline stage (`layout`), and a transformer run places ranks in
Megatron-Core's order tp-cp-dp-pp, so each of its groups is every `stride`-th rank
(`strided_group_nodes`). A group's node span picks the link tier of its collectives."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from paraplan.core.cluster import Cluster
from paraplan.core.comm import Group
from paraplan.core.errors import StrategyError
from paraplan.core.layer_split import even_layer_ranges
from paraplan.core.strategy import Strategy


@dataclass(frozen=True)
class StageLayout:
    """Where each pipeline device's replicas live and which layers it owns."""

    devices: tuple[tuple[int, ...], ...]  # per pipeline stage: r_s x T ids, replica-major
    layer_ranges: tuple[tuple[int, int], ...]  # per virtual stage: [start, stop)


def strided_group_nodes(size: int, stride: int, devices_per_node: int) -> int:
    """Nodes spanned by ranks 0, stride, ..., (size - 1) x stride when each node holds
    `devices_per_node` consecutive ranks (a group of Megatron's rank order: the tensor-
    parallel group has stride 1, the data-parallel group stride t, ...)."""
    return len({(stride * j) // devices_per_node for j in range(size)})


def stage_devices(strategy: Strategy, cluster: Cluster) -> tuple[tuple[int, ...], ...]:
    """Device ids of each pipeline stage: the strategy's placement (checked), else
    node-major packing stage by stage."""
    p, t = strategy.pipeline_model_parallel_size, strategy.tensor_model_parallel_size
    reps = strategy.replicas_per_stage
    need = sum(reps) * t
    if need > cluster.num_devices:
        raise StrategyError(
            f"strategy needs {need} devices (replicas {list(reps)} x T={t}), "
            f"cluster '{cluster.name}' has {cluster.num_devices}"
        )
    if not strategy.placement:
        offsets = np.cumsum([0, *[r * t for r in reps]])
        return tuple(tuple(range(int(offsets[s]), int(offsets[s + 1]))) for s in range(p))
    devices = tuple(tuple(int(d) for d in ids) for ids in strategy.placement)
    for s, ids in enumerate(devices):
        if len(ids) != reps[s] * t:
            raise StrategyError(f"placement of stage {s} lists {len(ids)} devices, needs {reps[s] * t}")
    flat = [d for ids in devices for d in ids]
    if len(set(flat)) != len(flat) or min(flat) < 0 or max(flat) >= cluster.num_devices:
        raise StrategyError(
            f"placement must use distinct device ids in 0..{cluster.num_devices - 1}, got {devices}"
        )
    return devices


def virtual_stage_layer_ranges(strategy: Strategy, num_layers: int) -> list[tuple[int, int]]:
    """[start, stop) layers of each virtual stage: the strategy's stages (even or at its
    boundaries), or with v chunks per device an even split over the P x v virtual stages."""
    p, v = strategy.pipeline_model_parallel_size, strategy.virtual_pipeline_model_parallel_size
    if v == 1:
        return strategy.stage_layer_ranges(num_layers)
    if strategy.stage_boundaries:
        raise StrategyError("interleaved stages split the layers evenly; drop stage_boundaries")
    if p * v > num_layers:
        raise StrategyError(f"{p} stages x {v} chunks need at least {p * v} layers, the model has {num_layers}")
    return even_layer_ranges(num_layers, p * v)


def layout(strategy: Strategy, cluster: Cluster, num_layers: int) -> StageLayout:
    """Stage placement (given, or node-major packing stage by stage) and layer ranges."""
    devices = stage_devices(strategy, cluster)
    return StageLayout(devices, tuple(virtual_stage_layer_ranges(strategy, num_layers)))


def tensor_group(cluster: Cluster, devices: Sequence[int], t: int) -> Group:
    """The tensor-parallel group of a stage's first replica (the first t of its ids)."""
    return Group(t, cluster.nodes_spanned(devices[:t]))


def replica_group(cluster: Cluster, devices: Sequence[int], t: int) -> Group:
    """The data-parallel group of a stage (tensor rank 0 of each of its replicas)."""
    return Group(len(devices) // t, cluster.nodes_spanned(devices[0::t]))


def stages_cross_node(cluster: Cluster, a: Sequence[int], b: Sequence[int], t: int) -> bool:
    """Whether any replica of stage a talks to its partner in stage b across nodes."""
    ra, rb = len(a) // t, len(b) // t
    for i in range(max(ra, rb)):
        for j in range(t):
            if cluster.node_of(a[(i % ra) * t + j]) != cluster.node_of(b[(i % rb) * t + j]):
                return True
    return False
