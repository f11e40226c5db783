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

Group-limited routing (`moe_router_num_groups` G, `moe_router_group_topk` g; DeepSeek-V3:
8 and 4) caps the nodes a token reaches. Megatron-Core's `group_limited_topk`
(moe_utils.py) scores each group of E/G consecutive experts by the sum of its top k/g
experts' scores, keeps the g best groups and takes the token's k experts among theirs;
with i.i.d. scores (forced balancing draws random logits) the k/g experts that made a
group win are, almost always, the ones picked there. So a token's experts are priced as
k/g experts drawn evenly inside each of g groups drawn evenly among G: node n, holding
c_j experts of group j (experts and groups both consecutive), is missed with probability

    sum_a C(G - |J|, g - a) / C(G, g) x e_a(q_j, j in J),  q_j = C(E/G - c_j, k/g) / C(E/G, k/g),

J the groups touching n and e_a the elementary symmetric polynomial of degree a. With
G = g = 1 this is the formula above. A simulation of that routing rule (Gaussian logits,
sigmoid scores, 20,000 tokens, E 256, k 8, G 8, g 4) hits 3.13, 3.97, 5.73, 6.85, 7.49
distinct nodes on 4, 8, 16, 32, 64 nodes; this closed form gives 3.14, 4.00, 6.06, 7.10,
7.61, and the ungrouped one 3.61, 5.29, 6.52, 7.27, 7.68.

An EP group inside one node runs DeepEP's intranode kernels: each token goes once to
every rank holding one of its experts, over NVLink, and the published bandwidth is the
receiving rank's (tests/legacy/test_intranode.py: received tokens x h x bytes over the
time of the whole `dispatch` call), so a transfer takes

    T x load x h x e x ranks_hit / bandwidth(node),

ranks_hit the `nodes_hit` formula with one rank per "node" (each rank receives T x
ranks_hit tokens from the group). The copies run on the kernel's SMs, so the bandwidth
depends on the GPU and its NVLink, measured on two (`NvlinkNode`, keyed by the device's
SM count and the cluster's intra-node bus bandwidth, `links.intra` in its file):

- H800 (132 SMs, NVLink 400 GB/s: 160 in paraplan's files), EP 8: 153 / 158 GB/s
  (DeepEP docs/legacy.md, 24 SMs, FP8 dispatch, NVLink-bound: the H100 figure below moves
  twice that on 20 SMs, so Megatron-Core's 20 SMs and BF16 tokens reach the same NVLink
  limit);
- H100 SXM (132 SMs, NVLink 900 GB/s: 360), EP 8: 328.97 / 287.14 GB/s, DeepEP's own
  kernels at its and Megatron-Core's default of 20 SMs with BF16 tokens, 4,096 tokens of
  hidden 7,168, 32 experts, top-8 (tile-ai/tilescale examples/distributed/deepseek_deepep/
  deepep.md; `data/published/deepep/deepep_v1_intranode_h100_tilescale.csv`). Its
  received bytes match 5.63 ranks per token; the formula gives 5.636.

Both were measured at hidden 7,168: a model with smaller tokens is priced at the same
bandwidth (not measured; nor is the internode one). Other GPUs, NVLink speeds and
intranode EP sizes are errors.

Not priced: DeepEP's layout and notify kernels and its host wait for the received
counts (latency-bound; the intranode figures include them at their token count); the
routing weights and indices sent with the tokens (a few bytes per token); EP sizes
other than 16, 32 and 64 across nodes (an error: not measured).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import comb

from paraplan.core.cluster import Cluster
from paraplan.core.comm import Group
from paraplan.core.errors import StrategyError
from paraplan.predict.work import Collective, _Builder

DEEPEP_INTERNODE_GBps: dict[int, tuple[float, float]] = {16: (43.0, 43.0), 32: (58.0, 57.0), 64: (51.0, 50.0)}
"""EP size: (dispatch, combine) bottleneck bandwidth in GB/s over RDMA, DeepEP V1 normal
kernels on H800 + CX7 400 Gb/s (deepseek-ai/DeepEP docs/legacy.md, commit dd758ca;
`data/published/deepep/deepep_v1_normal_h800.csv`)."""
DEEPEP_DISPATCH, DEEPEP_COMBINE = "deepep_dispatch", "deepep_combine"


@dataclass(frozen=True)
class NvlinkNode:
    """What DeepEP's intranode kernels' speed depends on: the GPU's SM count (the copies
    run on the kernel's SMs) and the node's NVLink, as paraplan's cluster files give it
    (the intra-node bus bandwidth, `links.intra`, GB/s)."""

    compute_units: int
    nvlink_GBps: float

    @staticmethod
    def of(cluster: Cluster) -> NvlinkNode:
        return NvlinkNode(cluster.device.compute_units, round(cluster.intra.bandwidth_Bps / 1e9, 6))

    def describe(self) -> str:
        return f"{self.compute_units} SMs, {self.nvlink_GBps:g} GB/s NVLink"


H800_NODE, H100_NODE = NvlinkNode(132, 160.0), NvlinkNode(132, 360.0)
"""The H800 SXM5 and H100 SXM5 nodes (config/clusters/dgx-h800.yaml, dgx-h100.yaml)."""
DEEPEP_INTRANODE_GBps: dict[tuple[NvlinkNode, int], tuple[float, float]] = {
    (H800_NODE, 8): (153.0, 158.0), (H100_NODE, 8): (328.97, 287.14)}
"""(node, EP size): (dispatch, combine) bandwidth in GB/s received (dispatch) or sent
(combine) per rank over NVLink, DeepEP V1 intranode kernels: H800 from deepseek-ai/DeepEP
docs/legacy.md (commit dd758ca; `deepep_v1_normal_h800.csv`), H100 from tile-ai/tilescale
examples/distributed/deepseek_deepep/deepep.md (commit eccbd61c;
`deepep_v1_intranode_h100_tilescale.csv`); see the module doc."""


@lru_cache(maxsize=1024)
def nodes_hit(experts: int, topk: int, nodes: int, groups: int = 1, group_topk: int = 1) -> float:
    """Expected distinct nodes among a token's `topk` experts, `experts` spread evenly
    over `nodes`, routed in `group_topk` of `groups` groups (1 and 1: no group limit;
    see the module doc)."""
    per_node, per_group, per_chosen = experts // nodes, experts // groups, topk // group_topk
    chosen = comb(groups, group_topk)
    hit = 0.0
    for node in range(nodes):
        first, last = node * per_node, (node + 1) * per_node  # the node's experts [first, last)
        missed = [comb(per_group - (min(last, (j + 1) * per_group) - max(first, j * per_group)), per_chosen)
                  / comb(per_group, per_chosen) for j in range(first // per_group, (last - 1) // per_group + 1)]
        symmetric = [1.0] + [0.0] * len(missed)  # e_a(missed), a = 0 .. |J|
        for q in missed:
            for a in range(len(missed), 0, -1):
                symmetric[a] += q * symmetric[a - 1]
        hit += 1.0 - sum(comb(groups - len(missed), group_topk - a) * e for a, e in enumerate(symmetric)) / chosen
    return hit


@dataclass(frozen=True, kw_only=True)
class DeepEpTransfer(Collective):
    """A DeepEP dispatch or combine: `nbytes` = the tokens' bytes once (T x load x h x e);
    the routing (`experts`, `topk`, and the group limit `groups`, `group_topk`) sets how
    many nodes each token reaches."""

    experts: int = 0
    topk: int = 0
    groups: int = 1
    group_topk: int = 1

    def time_s(self, group: Group, node: NvlinkNode | None = None) -> float:
        """Its time over the EP group `group` (see the module doc); `node` (the cluster's
        GPU and NVLink) prices a group inside one node."""
        if group.size < 2:
            return 0.0
        if group.nodes < 2:
            return self._intranode_s(group, node)
        bandwidth = DEEPEP_INTERNODE_GBps.get(group.size)
        if bandwidth is None:
            raise StrategyError(
                f"moe_token_dispatcher_type flex (DeepEP) with expert_model_parallel_size {group.size}: DeepEP's "
                f"internode bandwidth is published for EP {', '.join(map(str, DEEPEP_INTERNODE_GBps))} only")
        if group.size % group.nodes or self.experts % group.nodes:
            raise StrategyError(f"DeepEP: {self.experts} experts on {group.size} ranks do not spread evenly over "
                                f"{group.nodes} nodes")
        gbps = bandwidth[0] if self.collective == DEEPEP_DISPATCH else bandwidth[1]
        reached = nodes_hit(self.experts, self.topk, group.nodes, self.groups, self.group_topk)
        return self.nbytes * reached / (gbps * 1e9)

    def _intranode_s(self, group: Group, node: NvlinkNode | None) -> float:
        """DeepEP's intranode kernels: T x load x h x e x ranks_hit over the node's bandwidth."""
        bandwidth = DEEPEP_INTRANODE_GBps.get((node, group.size)) if node is not None else None
        if bandwidth is None:
            measured = "; ".join(f"EP {ep} on {n.describe()}" for n, ep in DEEPEP_INTRANODE_GBps)
            where = f" on {node.describe()}" if node is not None else ""
            raise StrategyError(
                f"moe_token_dispatcher_type flex (DeepEP) with an expert-parallel group of {group.size} ranks inside "
                f"one node{where}: DeepEP's intranode kernels are measured for {measured} only")
        if self.experts % group.size:
            raise StrategyError(f"DeepEP: {self.experts} experts do not spread evenly over {group.size} ranks")
        gbps = bandwidth[0] if self.collective == DEEPEP_DISPATCH else bandwidth[1]
        return self.nbytes * ranks_hit(self.experts, self.topk, group.size, self.groups, self.group_topk) / (gbps * 1e9)


def ranks_hit(experts: int, topk: int, ranks: int, groups: int = 1, group_topk: int = 1) -> float:
    """Expected distinct EP ranks among a token's experts: the copies DeepEP delivers
    (one per destination rank), so each rank receives T x this from the group."""
    return nodes_hit(experts, topk, ranks, groups, group_topk)


LAYOUT_INDEX_BYTES = 8  # a top-k expert index (int64) the layout kernel reads
LAYOUT_COUNT_BYTES = 4  # the counts it writes (int32)


def deepep_host_work(w: _Builder, tokens: float, topk: int, experts: int, ranks: int, cached: bool) -> None:
    """What one DeepEP call issues besides its transfer (Megatron-Core `fused_a2a.py`
    at 0d8e0714, `FusedDispatch` / `FusedCombine`; DeepEP's `Buffer.dispatch` /
    `combine`): a call with a cached layout (the combine, and both backward calls, which
    reuse the forward dispatch's handle) launches one notify kernel before its transfer;
    the forward dispatch first runs `get_dispatch_layout` (reads the T k int64 expert
    indices, writes the per-rank token flags and the int32 counts per rank and expert),
    then `notify_dispatch`, and then the host waits, polling the host-mapped counters
    the notify kernel writes, before it can size and launch the transfer: a host wait with
    nothing queued behind it (`PassCost.sync_idle_s`). Each kernel is one row of its pass
    (one `host_kernel_s`, one `kernel_latency_s`, its bytes)."""
    if not cached:
        w.memory(tokens * topk * LAYOUT_INDEX_BYTES + tokens * ranks + (ranks + experts) * LAYOUT_COUNT_BYTES)
    w.memory(2 * (ranks * ranks + experts) * LAYOUT_COUNT_BYTES)  # notify: the rank x rank and expert counts
    if not cached:
        w.host_syncs.append((len(w.rows), len(w.rows)))
