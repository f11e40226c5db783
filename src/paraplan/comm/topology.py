"""`TopologyCommModel`: collectives across nodes priced the way NCCL runs them on a
rail-optimised fabric (one NIC per GPU, every NIC of a node on its own rail), picking
the fastest algorithm as NCCL's tuner does (`src/graph/tuning.cc`: time = latency +
size / bandwidth per algorithm, the smallest wins). Groups inside one NVLink domain are
priced by the intra-domain model unchanged (a fitted nccl-tests curve or the cluster's
`links.intra`).

Notation: a group of n ranks over N NVLink domains (a domain is a node, or a rack of
nodes on an NVL72), r = n / N ranks per domain; S the nccl-tests size; k NICs per node,
d devices per node; one NIC moves m bytes in a + m / b (the rail curve: a fitted
`RailFit`, else line rate x `DEFAULT_RAIL_EFFICIENCY` and `DEFAULT_RAIL_LATENCY_S`).
`intra(c, m)` is the intra-domain model's time of collective c on r ranks.

Assumptions, each a formula's premise:
- NICs: a rank drives k // d NICs (the ones on its PCIe switch) when k >= d; with fewer
  NICs than GPUs (k < d: d / k GPUs behind each NIC's PCIe switch) it gets k / d of one,
  since every GPU of a node runs its cross-node collective at the same time (the data-
  parallel groups of the t tensor-parallel ranks reduce the same buckets together; the t
  ranks of a stage send their pipeline transfers together). The group's ranks in one
  domain together drive B = b x min(k x nodes per domain, r x that share): on a
  rail-optimised node (k = d) each concurrent group sits on its own rails.
- Channels spread over all NICs evenly and the NVLink and NIC stages pipeline, so a
  multi-stage algorithm costs its slowest stage plus the other stages' latencies.

all_reduce, the fastest of:
- ring (NCCL Ring): one ring over all n ranks per channel, channels over all NICs. Each
  ring crosses each domain boundary once per direction, so the NICs carry what one ring
  link carries: t = 2(N-1) a + 2(n-1)/n x S / B, against the NVLink hops
  intra(all_reduce, S x (n-1)/n x r/(r-1)) (the same bytes per rank); the larger.
- hierarchical (NCCL's NVLS-Tree / CollNet shape), only where the network has NVLink
  SHARP (`Network.nvls`: NVSwitch multicast, Hopper and newer; NCCL's `ncclNvlsInit`
  reads `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`, and CollNet needs a SHARP network
  plugin it does not load by default): intra-domain reduce-scatter, an
  all_reduce of S / r per rail among the N domains, intra-domain all_gather, pipelined:
  t = max(intra(all_reduce, S) + 2(N-1) a, 2(N-1) a + 2(N-1)/N x S / B + intra(all_reduce, 0)):
  the slower stage plus the other stage's latency. Two domains move S / B instead of the ring's
  ~2 S / B: why 2-node nccl-tests report bus bandwidths above the NICs' line rate.
- tree (NCCL Tree: double binary tree between domains, a chain inside): latency
  2 ceil(log2 N) a, bandwidth: each domain sends S over its NICs per direction with two
  domains and 2 S with more (interior in one tree, leaf in the other), each GPU of the
  chain sends 2 S over NVLink: t = 2 ceil(log2 N) a + max(c_N S / B,
  intra(all_reduce, S x r / (r-1))), c_2 = 1, c_N = 2. Wins for small S at N > 2 (log
  latency).
all_gather / reduce_scatter: ring only (NCCL's tuner has no tree for them across
nodes): t = (N-1) a + (n-1)/n x S / B against intra(c, S x (n-1)/n x r/(r-1)).
broadcast / reduce: a pipelined ring, t = (N-1) a + S / B against intra(c, S).
all_to_all (expert parallelism; NCCL runs it as point-to-point sends to every peer, no
ring or tree): each rank sends S / n to every rank; (n - r) / n of its S crosses domains
over its own share of the NICs. PXN (NCCL >= 2.12, rail-optimised nodes) first moves a
message over NVLink to the GPU on the destination's rail, so NVLink carries the
intra-domain share plus (r-1)/r of the crossing share: per rank as much as an r-rank
all_to_all of the whole S. The NICs run these sends at `A2A_NIC_EFFICIENCY` of line rate
(fitted on a published alltoall_perf, not on the all-reduce curve: ring/tree overheads
that the all-reduce curve absorbs are not in a send), with the rail curve's latency once
per remote domain: t = max((N-1) a + r (n-r)/n x S / B_a2a, intra(all_to_all, S)),
B_a2a = line rate x A2A_NIC_EFFICIENCY x the domain's NICs as for B.
send_recv across domains (pipeline stages): one rank's share of the NICs at the point-to-point
efficiency (`P2P_NIC_EFFICIENCY`, the NIC rate of all_to_all's sends: a pipeline transfer is
one such send), not the all-reduce rail bandwidth b: t = a + S / (line rate x P2P_NIC_EFFICIENCY
x share). Inside a domain it is the intra-domain model's send_recv (NVLink).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from paraplan.core.cluster import Network, RailFit
from paraplan.core.comm import CommModel, Group

DEFAULT_RAIL_EFFICIENCY = 0.678
"""Effective / line-rate bandwidth of one NIC when a cluster has no fitted rail curve:
`paraplan.comm.fit_rail.fit_rail` over the sizes >= 1 MiB of all nine multi-node
all_reduce logs of data/nccl-tests/ (H100 NDR 400 Gb/s 2x8 twice, 4x8 twice, 8x8; GCP
A3 Mega 2x8; A100 OCI BM.GPU4.8 2x8; GH200 Slingshot 2x4, 2x1), each with its cluster file
and the algorithms its network has (`Network.nvls`: the A100 and GH200 logs rings and
trees only; `benchmarks/bench_comm_topology.py` refits it and prints the held-out errors).
0.642 when every log was priced with the NVLS hierarchy too."""
DEFAULT_RAIL_LATENCY_S = 46.45e-6
"""Latency of one inter-node step, fitted with the efficiency above (same logs). It is
several times NCCL's own per-step network latency (14 us for the Simple protocol): it
also absorbs the lower bandwidth of mid sizes (1-64 MiB, fewer channels in flight), so
sizes under 1 MiB across nodes come out too slow (the benchmark prints by how much)."""
A2A_NIC_EFFICIENCY = 0.846
"""Effective / line-rate bandwidth of a NIC under all_to_all's point-to-point sends:
`paraplan.comm.fit_a2a_nic.nic_efficiency` of the one published multi-node
`alltoall_perf` row with its NICs stated and a bandwidth-bound size
(data/published/alltoall/, row 1: 2 x 8 A100, 4 x 200 Gb/s RoCE, 4 GiB, busbw 19.83 GB/s;
`benchmarks/bench_alltoall.py` prints it and the held-out H800 row). NVIDIA's NCCL
maintainers quote 46-49 GB/s per 400 Gb/s NIC for all-to-all (0.92-0.98; nccl-tests issues
#267, #290); the all_reduce rail curves sit at 0.57-0.71."""
P2P_NIC_EFFICIENCY = A2A_NIC_EFFICIENCY
"""Effective / line-rate bandwidth of a NIC under one point-to-point send (pipeline
transfers): the all_to_all fit above, which measures the same NCCL sends to n - 1 peers;
no published multi-node sendrecv_perf log is in data/ to fit it on its own."""
ALL_REDUCE_ALGORITHMS = ("ring", "hierarchical", "tree")
_MEMO_LIMIT = 1 << 18


@dataclass(frozen=True)
class Rail:
    """One NIC: latency_s + m / bandwidth_Bps for m bytes."""

    latency_s: float
    bandwidth_Bps: float


def default_rail(network: Network) -> Rail:
    """The line rate x the published-log efficiency (no fitted curve)."""
    return Rail(DEFAULT_RAIL_LATENCY_S, network.nic_bandwidth_Bps * DEFAULT_RAIL_EFFICIENCY)


def nearest_fit(fits: tuple[RailFit, ...], nodes: int) -> RailFit | None:
    """The fit measured on the node count nearest to `nodes` (in log2; ties to the larger)."""
    if not fits:
        return None
    return min(fits, key=lambda f: (abs(math.log2(f.nodes) - math.log2(max(nodes, 1))), -f.nodes))


@dataclass(frozen=True)
class TopologyCommModel:
    """`CommModel` for a cluster with a `Network` (see the module docstring)."""

    intra: CommModel
    network: Network
    devices_per_node: int
    rail: Rail | None = None  # None: the network's fitted rail curves, else the default efficiency
    # all_reduce algorithms to choose from (None: ring, hierarchical and tree); e.g. ("ring",)
    # for a fabric where NCCL is measured to run rings only
    all_reduce_algorithms: tuple[str, ...] | None = None
    # the planner asks for the same few (collective, size, group) many times: answers are memoised
    _memo: dict[tuple[str, float, int, int], float] = field(default_factory=dict, init=False, repr=False,
                                                            compare=False)

    def __post_init__(self) -> None:
        unknown = set(self.all_reduce_algorithms or ()) - set(ALL_REDUCE_ALGORITHMS)
        if unknown or self.all_reduce_algorithms == ():
            raise ValueError(f"all_reduce_algorithms: expected some of {', '.join(ALL_REDUCE_ALGORITHMS)}, got "
                             f"{self.all_reduce_algorithms!r}")

    def rail_for(self, domains: int) -> Rail:
        if self.rail is not None:
            return self.rail
        fit = nearest_fit(self.network.rail_fits, domains)
        if fit is None:
            return default_rail(self.network)
        return Rail(fit.latency_s, fit.bandwidth_Bps)

    # ---- shape ---------------------------------------------------------------------
    def _shape(self, group: Group) -> tuple[int, int, int]:
        """(n, N domains, r ranks per domain) of a group, its ranks spread evenly."""
        per_domain_nodes = max(1, self.network.nvlink_domain_size // self.devices_per_node)
        domains = max(1, math.ceil(group.nodes / per_domain_nodes))
        n = int(group.size)
        return n, domains, max(1, n // domains)

    def _domain_bandwidth_Bps(self, group: Group, ranks_per_domain: int, rail: Rail) -> float:
        net = self.network
        nodes_per_domain = max(1, min(group.nodes, net.nvlink_domain_size // self.devices_per_node))
        nics = min(net.nics_per_node * nodes_per_domain, ranks_per_domain * self._rank_nics())
        return rail.bandwidth_Bps * nics

    def _rank_nics(self) -> float:
        """NICs one rank drives while every GPU of its node crosses nodes (module doc)."""
        k, d = self.network.nics_per_node, self.devices_per_node
        return float(k // d) if k >= d else k / d

    def _intra(self, collective: str, nbytes: float, ranks: int) -> float:
        if ranks <= 1:
            return 0.0
        return float(self.intra.time_s(collective, nbytes, Group(ranks, 1)))

    # ---- prediction ----------------------------------------------------------------
    def time_s(self, collective: str, nbytes: float, group: Group) -> float:
        key = (collective, float(nbytes), int(group.size), int(group.nodes))
        answer = self._memo.get(key)
        if answer is None:
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            answer = self._memo[key] = self.choose(collective, nbytes, group)[1]
        return answer

    def choose(self, collective: str, nbytes: float, group: Group) -> tuple[str, float]:
        """(algorithm, seconds): the fastest algorithm NCCL has for this collective."""
        if group.size <= 1:
            return "none", 0.0
        n, domains, _ = self._shape(group)
        if domains <= 1:
            return "intra", float(self.intra.time_s(collective, nbytes, Group(n, 1)))
        times = self.algorithm_times(collective, float(nbytes), group)
        best = min(times, key=lambda name: times[name])
        return best, times[best]

    def algorithm_times(self, collective: str, nbytes: float, group: Group) -> dict[str, float]:
        """Seconds of every algorithm that applies (groups spanning several domains)."""
        n, domains, r = self._shape(group)
        rail = self.rail_for(domains)
        a = rail.latency_s
        bw = self._domain_bandwidth_Bps(group, r, rail)
        s = nbytes
        # bytes per rank scaled so an r-rank intra collective moves what the n-rank one does
        ring_share = (n - 1) / n * r / (r - 1) if r > 1 else 0.0
        intra: Callable[[str, float], float] = lambda c, m: self._intra(c, m, r)  # noqa: E731
        if collective == "all_reduce":
            ring = max(2 * (domains - 1) * a + 2 * (n - 1) / n * s / bw, intra("all_reduce", s * ring_share))
            # two pipelined stages: the slower one plus the other's latency
            inter_lat, intra_lat = 2 * (domains - 1) * a, intra("all_reduce", 0.0)
            hierarchical = max(intra("all_reduce", s) + inter_lat,
                               inter_lat + 2 * (domains - 1) / domains * s / bw + intra_lat)
            c_n = 1.0 if domains == 2 else 2.0
            tree = 2 * math.ceil(math.log2(domains)) * a + max(
                c_n * s / bw, intra("all_reduce", s * r / (r - 1)) if r > 1 else 0.0)
            every = {"ring": ring, "hierarchical": hierarchical, "tree": tree}
            if self.all_reduce_algorithms is not None:
                return {name: every[name] for name in self.all_reduce_algorithms}
            if not self.network.nvls:  # no NVLink SHARP: NCCL has rings and trees only
                return {"ring": ring, "tree": tree}
            return every
        if collective in ("all_gather", "reduce_scatter"):
            ring = max((domains - 1) * a + (n - 1) / n * s / bw, intra(collective, s * ring_share))
            return {"ring": ring}
        if collective in ("broadcast", "reduce"):
            return {"ring": max((domains - 1) * a + s / bw, intra(collective, s))}
        if collective in ("all_to_all", "all_to_allv"):
            a2a_bw = self._domain_bandwidth_Bps(group, r, Rail(a, self.network.nic_bandwidth_Bps * A2A_NIC_EFFICIENCY))
            inter = (domains - 1) * a + r * (n - r) / n * s / a2a_bw
            return {"pairwise": max(inter, intra("all_to_all", s))}  # PXN: NVLink also forwards
        if collective == "send_recv":  # one peer's point-to-point send, not the all-reduce rail curve
            return {"p2p": a + s / (self.network.nic_bandwidth_Bps * P2P_NIC_EFFICIENCY * self._rank_nics())}
        raise ValueError(f"unknown collective '{collective}'")
