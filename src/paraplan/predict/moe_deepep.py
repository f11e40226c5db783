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

HybridEP (`moe_flex_dispatcher_backend hybridep`, NVIDIA's kernels in DeepEP's library,
`deep_ep.HybridEPBuffer`) forwards tokens the same way, once per destination node over
RDMA (TMA copies over NVLink inside the node), and its benchmark counts bytes as DeepEP's
internode one does (tests/test_hybrid_ep.py on the hybrid-ep branch: RDMA bytes = tokens x
distinct nodes per token, the local node included, x hidden x 2 bytes, over the time of
the `dispatch` / `combine` call: "Torch API", with its stream synchronisation). So a
HybridEP transfer across nodes is priced by the formula above with HybridEP's published
H100 bandwidths (deepseek-ai/DeepEP docs/README_Hybrid-EP.md, "H100 Platform", BF16
dispatch and combine, Torch API, by EP size 16 / 32 / 64 over 8-GPU nodes and SM count
4 / 8 / 16: `data/published/deepep/hybridep_h100_internode.csv`, `HYBRIDEP_INTERNODE_GBps`),
at the run's `moe_flex_dispatcher_num_sms` (HybridEP's default across nodes: 8, its
`Configurer`). Past 8 SMs the published figures stop rising (dispatch at 8 and 16 SMs:
57.74 and 54.47 GB/s for EP 16, 46.54 and 47.36 for EP 32, 41.46 and 41.24 for EP 64), so
a count above the largest measured, 16, is priced at 16's figures (`hybridep_priced_sms`;
Megatron-Bridge's performance scripts run HybridEP at 32), and `paraplan predict` says so
in a note; counts under 16 that were not measured are errors. Megatron-Core runs
HybridEP's dispatch in BF16 (`fused_a2a.py`: "HybridEP dispatcher does not support fp8
dispatch now"). Its host-side work differs from DeepEP's:
the forward dispatch first all-gathers every rank's routing map over the EP group (T x E
booleans per rank) and scans it (`metadata_preprocessing`), then the host waits for the
received count before it launches the transfer; the other calls reuse that handle and
launch the transfer alone (`hybridep_host_work`). Not measured, so errors: HybridEP
inside one node on these GPUs, other EP sizes or SM counts, and GPUs or NVLink other than
the H100 SXM's (the figures' node, `H100_NODE`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import comb

from paraplan.core.cluster import Cluster
from paraplan.core.comm import Group
from paraplan.core.errors import StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.predict.overlap_share import DEEPEP_SMS
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


HYBRIDEP_INTERNODE_GBps: dict[tuple[NvlinkNode, int, int], tuple[float, float]] = {
    (H100_NODE, 16, 4): (37.08, 42.47), (H100_NODE, 16, 8): (57.74, 56.96), (H100_NODE, 16, 16): (54.47, 53.35),
    (H100_NODE, 32, 4): (44.88, 43.60), (H100_NODE, 32, 8): (46.54, 50.68), (H100_NODE, 32, 16): (47.36, 52.53),
    (H100_NODE, 64, 4): (40.63, 41.00), (H100_NODE, 64, 8): (41.46, 47.68), (H100_NODE, 64, 16): (41.24, 46.57)}
"""(node, EP size, SMs): (BF16 dispatch, combine) RDMA bandwidth in GB/s, HybridEP across
8-GPU H100 nodes, the `dispatch` / `combine` calls timed whole ("Torch API"):
deepseek-ai/DeepEP docs/README_Hybrid-EP.md at commit 41cad944
(`data/published/deepep/hybridep_h100_internode.csv`); see the module doc."""
HYBRIDEP_DEFAULT_SMS_ACROSS_NODES, HYBRIDEP_DEFAULT_SMS_IN_NODE = 8, 24
"""HybridEP's SMs for dispatch and combine when the run names none, for an EP group across
nodes and inside one (DeepEP hybrid-ep branch at 94a9f8f, csrc/hybrid_ep/config.cuh
`Configurer`)."""


HYBRIDEP_MAX_MEASURED_SMS = max(k for _, _, k in HYBRIDEP_INTERNODE_GBps)


def hybridep_priced_sms(node: NvlinkNode | None, ep: int, sms: int) -> int:
    """The SM count whose published HybridEP bandwidth prices `sms`: itself when measured;
    above the largest measured count, that count, where the published figures no longer
    rise with SMs (the module doc; `paraplan predict` names such rows in a note)."""
    measured = sorted(k for n, e, k in HYBRIDEP_INTERNODE_GBps if n == node and e == ep)
    return measured[-1] if measured and sms > measured[-1] else sms


def hybridep_sms_above_measured(settings: RunSettings) -> bool:
    """Whether a run's HybridEP kernels are priced at fewer SMs than it names
    (`hybridep_priced_sms`)."""
    return (settings.moe_token_dispatcher_type == "flex" and settings.moe_flex_dispatcher_backend == "hybridep"
            and settings.moe_flex_dispatcher_num_sms > HYBRIDEP_MAX_MEASURED_SMS)


def flex_sms(backend: str, num_sms: int, nodes: int) -> int:
    """SMs the flex dispatcher's kernels run on: the run's `moe_flex_dispatcher_num_sms`,
    else the backend's default."""
    if num_sms:
        return num_sms
    if backend == "deepep":
        return DEEPEP_SMS
    return HYBRIDEP_DEFAULT_SMS_ACROSS_NODES if nodes > 1 else HYBRIDEP_DEFAULT_SMS_IN_NODE


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
    backend: str = "deepep"  # `moe_flex_dispatcher_backend`: deepep or hybridep
    num_sms: int = 0  # `moe_flex_dispatcher_num_sms`; 0: the backend's default

    def sms(self, group: Group) -> int:
        """SMs its kernels hold while they run (their share of an overlapped compute kernel)."""
        return flex_sms(self.backend, self.num_sms, group.nodes)

    def time_s(self, group: Group, node: NvlinkNode | None = None) -> float:
        """Its time over the EP group `group` (see the module doc); `node` (the cluster's
        GPU and NVLink) prices a group inside one node, and HybridEP's across nodes."""
        if group.size < 2:
            return 0.0
        if self.backend == "hybridep":
            return self._hybridep_s(group, node)
        if self.num_sms not in (0, DEEPEP_SMS):
            raise StrategyError(f"moe_flex_dispatcher_num_sms {self.num_sms} with DeepEP: its kernels are measured "
                                f"at its default of {DEEPEP_SMS} SMs only")
        if group.nodes < 2:
            return self._intranode_s(group, node)
        bandwidth = DEEPEP_INTERNODE_GBps.get(group.size)
        if bandwidth is None:
            raise StrategyError(
                f"moe_token_dispatcher_type flex (DeepEP) with expert_model_parallel_size {group.size}: DeepEP's "
                f"internode bandwidth is published for EP {', '.join(map(str, DEEPEP_INTERNODE_GBps))} only")
        return self._across_nodes_s(group, bandwidth, "DeepEP")

    def _hybridep_s(self, group: Group, node: NvlinkNode | None) -> float:
        """HybridEP across nodes: T x load x h x e x nodes_hit over its published bandwidth."""
        sms = self.sms(group)
        priced = hybridep_priced_sms(node, group.size, sms)
        bandwidth = HYBRIDEP_INTERNODE_GBps.get((node, group.size, priced)) if node is not None else None
        if bandwidth is None or group.nodes < 2:
            where = f" on {node.describe()}" if node is not None else ""
            span = "inside one node" if group.nodes < 2 else f"over {group.nodes} nodes"
            nodes = {n for n, _, _ in HYBRIDEP_INTERNODE_GBps}
            listed = "; ".join(
                f"EP {', '.join(map(str, sorted({ep for m, ep, _ in HYBRIDEP_INTERNODE_GBps if m == n})))} at "
                f"{', '.join(map(str, sorted({k for m, _, k in HYBRIDEP_INTERNODE_GBps if m == n})))} SMs across "
                f"8-GPU nodes of {n.describe()}" for n in sorted(nodes, key=NvlinkNode.describe))
            raise StrategyError(
                f"moe_flex_dispatcher_backend hybridep with an expert-parallel group of {group.size} ranks {span}"
                f"{where} and {sms} SMs: HybridEP's kernels are measured for {listed} only")
        return self._across_nodes_s(group, bandwidth, "HybridEP")

    def _across_nodes_s(self, group: Group, bandwidth: tuple[float, float], kernels: str) -> float:
        """T x load x h x e x nodes_hit over the (dispatch, combine) RDMA `bandwidth`."""
        if group.size % group.nodes or self.experts % group.nodes:
            raise StrategyError(f"{kernels}: {self.experts} experts on {group.size} ranks do not spread evenly over "
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


ROUTING_MAP_BYTES = 1  # a routing-map entry (torch.bool)


def hybridep_host_work(w: _Builder, tokens: float, experts: int, ranks: int, cached: bool) -> None:
    """What one HybridEP call issues besides its transfer (Megatron-Core `fused_a2a.py`
    `HybridEPDispatch` / `HybridEPCombine`; DeepEP hybrid-ep branch `HybridEPBuffer`): the
    forward dispatch all-gathers the T x E routing map of every EP rank
    (`metadata_preprocessing`, `allgather_routing_map`), scans the gathered maps in one
    kernel, and the host then waits for the received-token count before it launches the
    transfer; every other call reuses that handle and adds nothing."""
    if cached:
        return
    gathered = ranks * tokens * experts * ROUTING_MAP_BYTES
    w.comm("all_gather", gathered, group="ep")
    w.memory(gathered)  # the metadata scan reads every rank's map
    w.host_syncs.append((len(w.rows), len(w.rows)))
