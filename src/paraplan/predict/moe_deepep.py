"""Megatron-Core's flex token dispatcher with its DeepEP backend
(`moe_token_dispatcher_type flex`, `moe_flex_dispatcher_backend deepep`): the token
dispatch and combine are DeepEP's fused kernels, priced with DeepEP's own published
kernel bandwidths, not with NCCL's all-to-all.

DeepEP's normal (V1) kernels send each token once per destination node over RDMA and
forward it inside the node over NVLink, so a token routed to k experts on d distinct
nodes crosses the network d times, not k. DeepEP measures its kernels as a logical
bandwidth (its tests/legacy/test_internode.py): RDMA bytes = tokens x distinct nodes
per token (the local node included) x hidden x bytes, over the kernel's time. The
published figures (docs/legacy.md, "Normal kernels with NVLink and RDMA forwarding";
`data/published/deepep/deepep_v1_normal_h800.csv`, `DEEPEP_INTERNODE_GBps` here) were
measured on H800 with one CX7 400 Gb/s InfiniBand NIC per GPU, the network H100 nodes
(DGX H100) have too: across nodes the NIC is the bottleneck, so they price any EP group
of 16, 32 or 64 ranks over 8-GPU nodes with such NICs. A transfer of T tokens of h
values of e bytes (times the load factor) over an EP group on N nodes takes

    T x load x h x e x nodes_hit / bandwidth(EP),
    nodes_hit = N (1 - C(E - E/N, k) / C(E, k)),

the expected number of distinct nodes among a token's k experts when the router picks
them evenly among E experts (E/N on each node; forced-balanced routing as the
published test sets state). Dispatch uses the dispatch bandwidth, combine the combine
bandwidth; in the backward each runs as the other's kernel.

Not priced: DeepEP's layout and notify kernels and its host wait for the received
counts (latency-bound); the routing weights and indices sent with the tokens (a few
bytes per token); an EP group inside one node (DeepEP's intranode figures were measured
on H800's 160 GB/s NVLink only: an error); EP sizes other than 16, 32 and 64 (an error:
not measured); group-limited routing (DeepSeek-V3's `topk_group`), which caps the nodes
a token reaches below `nodes_hit` and which the model description does not carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

from paraplan.core.comm import Group
from paraplan.core.errors import StrategyError
from paraplan.predict.work import Collective

DEEPEP_INTERNODE_GBps: dict[int, tuple[float, float]] = {16: (43.0, 43.0), 32: (58.0, 57.0), 64: (51.0, 50.0)}
"""EP size: (dispatch, combine) bottleneck bandwidth in GB/s over RDMA, DeepEP V1 normal
kernels on H800 + CX7 400 Gb/s (deepseek-ai/DeepEP docs/legacy.md, commit dd758ca;
`data/published/deepep/deepep_v1_normal_h800.csv`)."""
DEEPEP_DISPATCH, DEEPEP_COMBINE = "deepep_dispatch", "deepep_combine"


def nodes_hit(experts: int, topk: int, nodes: int) -> float:
    """Expected distinct nodes among a token's `topk` experts, picked evenly among
    `experts` spread evenly over `nodes` (see the module doc)."""
    per_node = experts // nodes
    return nodes * (1.0 - comb(experts - per_node, topk) / comb(experts, topk))


@dataclass(frozen=True)
class DeepEpTransfer(Collective):
    """A DeepEP dispatch or combine: `nbytes` = the tokens' bytes once (T x load x h x e);
    the routing (`experts`, `topk`) sets how many nodes each token reaches."""

    experts: int = 0
    topk: int = 0

    def time_s(self, group: Group) -> float:
        """Its time over the EP group `group` (see the module doc)."""
        if group.size < 2:
            return 0.0
        if group.nodes < 2:
            raise StrategyError(
                f"moe_token_dispatcher_type flex (DeepEP) with an expert-parallel group of {group.size} ranks inside "
                "one node: DeepEP's intranode kernels are published for H800's NVLink only, not priced here")
        bandwidth = DEEPEP_INTERNODE_GBps.get(group.size)
        if bandwidth is None:
            raise StrategyError(
                f"moe_token_dispatcher_type flex (DeepEP) with expert_model_parallel_size {group.size}: DeepEP's "
                f"internode bandwidth is published for EP {', '.join(map(str, DEEPEP_INTERNODE_GBps))} only")
        if group.size % group.nodes or self.experts % group.nodes:
            raise StrategyError(f"DeepEP: {self.experts} experts on {group.size} ranks do not spread evenly over "
                                f"{group.nodes} nodes")
        gbps = bandwidth[0] if self.collective == DEEPEP_DISPATCH else bandwidth[1]
        return self.nbytes * nodes_hit(self.experts, self.topk, group.nodes) / (gbps * 1e9)


def ranks_hit(experts: int, topk: int, ranks: int) -> float:
    """Expected distinct EP ranks among a token's experts: the copies DeepEP delivers
    (one per destination rank), so each rank receives T x this from the group."""
    return nodes_hit(experts, topk, ranks)
