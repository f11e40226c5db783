"""Topology-aware collectives (`paraplan.comm.topology`) against their closed forms."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.clusters import cluster_from_dict, load_cluster
from paraplan.comm.fit_a2a_nic import nic_efficiency, read_alltoall_rows
from paraplan.comm.fit_rail import MeasuredSweep, fit_rail, rail_fits
from paraplan.comm.topology import (
    A2A_NIC_EFFICIENCY,
    DEFAULT_RAIL_EFFICIENCY,
    DEFAULT_RAIL_LATENCY_S,
    P2P_NIC_EFFICIENCY,
    Rail,
    TopologyCommModel,
)
from paraplan.core import (
    Cluster,
    ConstantBandwidthModel,
    Device,
    Group,
    InputFileError,
    Link,
    Network,
    RailFit,
    TieredCommModel,
    ring_time_s,
)
from paraplan.predict.calibration import Calibration, load_calibration

GiB = 2.0**30
NIC_Bps = 50e9  # 400 Gb/s
A_S = 10e-6


RAIL = Rail(A_S, NIC_Bps)
ALLTOALL_CSV = Path(__file__).resolve().parents[2] / "data/published/alltoall/nccl_tests_alltoall_multinode.csv"


def model(intra_Bps: float = 900e9, nics: int = 8, nvls: bool = True) -> TopologyCommModel:
    """A DGX H100-like node (NVSwitch with multicast: NCCL's NVLS algorithms) unless `nvls` is off."""
    intra = ConstantBandwidthModel(intra_Bps, intra_Bps)
    return TopologyCommModel(intra, Network(nics, NIC_Bps, 8, nvls=nvls), 8, RAIL)


def test_two_dgx_nodes_all_reduce_is_the_hierarchical_formula():
    # 2 x 8 GPUs, 8 x 50 GB/s NICs: the inter-node all_reduce of S/8 per rail among 2 nodes
    # moves S / (8 x 50 GB/s) and dominates NVLink's 2 (7/8) S / 900 GB/s: S / 400 GB/s + 2 a
    m = model()
    algorithm, t = m.choose("all_reduce", GiB, Group(16, 2))
    assert algorithm == "hierarchical"
    assert t == pytest.approx(GiB / (8 * NIC_Bps) + 2 * A_S, rel=1e-12)
    # the ring over all 16 ranks moves 2 (15/16) S over the same NICs: ~1.9x slower
    assert m.algorithm_times("all_reduce", GiB, Group(16, 2))["ring"] == pytest.approx(
        2 * A_S + 2 * 15 / 16 * GiB / (8 * NIC_Bps), rel=1e-12)


def test_without_nvlink_sharp_nccl_has_rings_and_trees_only():
    """An A100 node (NVSwitch without multicast) or GPUs linked without an NVSwitch: NCCL's
    NVLS algorithms do not run, so the hierarchy is not among the choices; across 3
    nodes the ring's 2 (23/24) S per rail is then what a large all_reduce pays, not the
    hierarchy's 2 (2/3) S / 8 per rail."""
    a100 = model(nvls=False)
    times = a100.algorithm_times("all_reduce", GiB, Group(24, 3))
    assert set(times) == {"ring", "tree"}
    assert a100.choose("all_reduce", GiB, Group(24, 3)) == ("ring", pytest.approx(
        4 * A_S + 2 * 23 / 24 * GiB / (8 * NIC_Bps), rel=1e-12))
    h100 = model()
    assert h100.choose("all_reduce", GiB, Group(24, 3))[0] == "hierarchical"
    assert h100.time_s("all_reduce", GiB, Group(24, 3)) < 0.75 * a100.time_s("all_reduce", GiB, Group(24, 3))


def test_slow_nvlink_bounds_the_hierarchical_all_reduce():
    m = model(intra_Bps=360e9)
    t = m.time_s("all_reduce", GiB, Group(16, 2))
    # the intra-node stages, then the inter-node stage's latency
    assert t == pytest.approx(2 * 7 / 8 * GiB / 360e9 + 2 * A_S, rel=1e-12)


def test_one_rank_per_node_is_the_flat_ring_over_one_nic():
    m = model()
    group = Group(8, 8)
    for collective in ("all_reduce", "all_gather", "reduce_scatter"):
        assert m.time_s(collective, GiB, group) == pytest.approx(
            ring_time_s(collective, GiB, 8, A_S, NIC_Bps), rel=1e-12), collective


def test_tree_wins_small_messages_across_more_than_two_nodes():
    m = model()
    group = Group(32, 4)
    small, _ = m.choose("all_reduce", 1024, group)
    large, _ = m.choose("all_reduce", GiB, group)
    assert (small, large) == ("tree", "hierarchical")
    # tree latency 2 log2(N) a against the ring's 2 (N-1) a
    times = m.algorithm_times("all_reduce", 0.0, group)
    assert times["tree"] == pytest.approx(4 * A_S) and times["ring"] == pytest.approx(6 * A_S)


def test_all_to_all_sends_the_crossing_share_over_the_nics():
    m = model()
    # 16 ranks on 2 nodes: each rank sends 8/16 of its S to the other node over its own NIC,
    # point-to-point at the all-to-all NIC efficiency (not the all-reduce rail curve)
    expected = A_S + 0.5 * GiB / (A2A_NIC_EFFICIENCY * NIC_Bps)
    assert m.time_s("all_to_all", GiB, Group(16, 2)) == pytest.approx(expected, rel=1e-12)
    # 32 ranks on 4 nodes, 8 per node: 3/4 of S leaves, latency once per remote node
    expected4 = 3 * A_S + 0.75 * GiB / (A2A_NIC_EFFICIENCY * NIC_Bps)
    assert m.time_s("all_to_all", GiB, Group(32, 4)) == pytest.approx(expected4, rel=1e-12)


def test_all_to_all_with_half_the_nics_shares_them_and_pxn_loads_nvlink():
    # 4 NICs for 8 GPUs: each GPU drives half a NIC (2 x 8 ranks: S/2 over 0.5 NIC)
    m = model(nics=4)
    expected = A_S + 0.5 * GiB / (0.5 * A2A_NIC_EFFICIENCY * NIC_Bps)
    assert m.time_s("all_to_all", GiB, Group(16, 2)) == pytest.approx(expected, rel=1e-12)
    # a slow NVLink: PXN forwards the crossing share too, so each rank moves what an 8-rank
    # all_to_all of the whole S moves, 7/8 S at 10 GB/s
    slow = model(intra_Bps=10e9)
    assert slow.time_s("all_to_all", GiB, Group(16, 2)) == pytest.approx(7 / 8 * GiB / 10e9, rel=1e-9)


def test_a2a_nic_efficiency_is_the_fit_on_the_published_alltoall_row():
    rows = read_alltoall_rows(ALLTOALL_CSV)
    fitted = [r for r in rows if r.source == "NVIDIA/nccl#1138"]
    assert len(fitted) == 1
    # busbw 19.83 GB/s, 16 ranks on 2 nodes, 4 x 25 GB/s NICs for 8 GPUs:
    # e = 19.83 x 16/15 x 1/2 / (0.5 x 25) = 0.84608
    assert nic_efficiency(fitted[0]) == pytest.approx(19.83 * 16 / 15 * 0.5 / 12.5, rel=1e-12)
    assert abs(A2A_NIC_EFFICIENCY - nic_efficiency(fitted[0])) < 5e-4
    held_out = next(r for r in rows if r.source == "NVIDIA/nccl#1531")
    assert (held_out.ranks, held_out.size_bytes, held_out.time_s) == (64, 8388608.0, pytest.approx(337.8e-6))
    with pytest.raises(ValueError, match="NICs per node and their rate are needed"):
        nic_efficiency(held_out)


def test_alltoall_csv_errors_name_the_line(tmp_path):
    bad = tmp_path / "a2a.csv"
    bad.write_text("source,gpu,nodes,gpus_per_node,nics_per_node,nic_Gbps,nccl_version,size_bytes,time_us,busbw_GBps\n"
                   "x,A100,two,8,4,200,,4096,,1.0\n")
    with pytest.raises(InputFileError, match=r"a2a\.csv:2"):
        read_alltoall_rows(bad)


def test_p2p_across_nodes_uses_one_nic_per_rank_and_nvlink_inside():
    m = model()
    p2p_Bps = NIC_Bps * P2P_NIC_EFFICIENCY
    assert m.time_s("send_recv", GiB, Group(2, 2)) == pytest.approx(A_S + GiB / p2p_Bps, rel=1e-12)
    assert m.time_s("send_recv", GiB, Group(2, 1)) == pytest.approx(GiB / 900e9, rel=1e-12)
    # two NICs per GPU (16 NICs, 8 GPUs): a rank drives both
    assert model(nics=16).time_s("send_recv", GiB, Group(2, 2)) == pytest.approx(A_S + GiB / (2 * p2p_Bps))


def test_p2p_is_priced_at_the_point_to_point_nic_rate_not_the_all_reduce_rail():
    # a rail curve fitted on all_reduce at 64% of line rate leaves a send at the
    # point-to-point rate (the all_to_all sends' 0.846); only its latency is shared
    slow_rail = TopologyCommModel(ConstantBandwidthModel(900e9, 900e9), Network(8, NIC_Bps, 8), 8,
                                  Rail(A_S, 0.642 * NIC_Bps))
    assert P2P_NIC_EFFICIENCY == A2A_NIC_EFFICIENCY == pytest.approx(0.846)
    assert slow_rail.time_s("send_recv", GiB, Group(2, 2)) == pytest.approx(A_S + GiB / (0.846 * NIC_Bps),
                                                                             rel=1e-3)


def test_groups_inside_one_nvlink_domain_are_the_intra_model():
    intra = ConstantBandwidthModel(900e9, 900e9, 1e-6, 1e-6)
    m = TopologyCommModel(intra, Network(4, NIC_Bps, 72), 4, Rail(A_S, NIC_Bps))
    # an NVL72 rack: 18 trays of 4 GPUs, one NVLink domain
    assert m.time_s("all_reduce", GiB, Group(72, 18)) == intra.time_s("all_reduce", GiB, Group(72, 1))
    assert m.time_s("all_reduce", GiB, Group(8, 1)) == intra.time_s("all_reduce", GiB, Group(8, 1))
    # two racks of 72 ranks on 72 NICs each: all NVLink-bound, so the ring (2 (143/144) S over
    # NVLink, 2 a across) and the hierarchy (2 (71/72) S over NVLink, then 2 a) come close
    algorithm, t = m.choose("all_reduce", GiB, Group(144, 36))
    nvlink = intra.time_s("all_reduce", GiB, Group(72, 1))
    hierarchical = max(nvlink + 2 * A_S, 2 * A_S + GiB / (72 * NIC_Bps) + intra.time_s("all_reduce", 0.0, Group(72, 1)))
    ring = max(2 * A_S + 2 * 143 / 144 * GiB / (72 * NIC_Bps),
               intra.time_s("all_reduce", GiB * 143 / 144 * 72 / 71, Group(72, 1)))
    assert (algorithm, t) == ("ring", pytest.approx(ring, rel=1e-12))
    assert ring < hierarchical < 1.01 * ring


def test_rail_defaults_to_line_rate_times_the_fitted_efficiency_else_the_nearest_fit():
    net = Network(8, NIC_Bps, 8)
    m = TopologyCommModel(ConstantBandwidthModel(1e12, 1e12), net, 8)
    assert m.rail_for(4) == Rail(DEFAULT_RAIL_LATENCY_S, DEFAULT_RAIL_EFFICIENCY * NIC_Bps)
    fits = (RailFit(2, 5e-6, 40e9), RailFit(8, 9e-6, 35e9))
    m = TopologyCommModel(ConstantBandwidthModel(1e12, 1e12), Network(8, NIC_Bps, 8, fits), 8)
    assert m.rail_for(2) == Rail(5e-6, 40e9)
    assert m.rail_for(3) == Rail(5e-6, 40e9)  # log2 distance: 3 is nearer 2 than 8
    assert m.rail_for(64) == Rail(9e-6, 35e9)


def _cluster(network: Network | None) -> Cluster:
    device = Device("A100-SXM4-80GB", 312e12, 2.0e12, 80e9)
    return Cluster("c", 4, 8, device, Link(230e9, 3e-6), Link(20e9, 8e-6), network)


def test_calibration_uses_the_topology_model_only_for_clusters_with_a_network():
    calibration = load_calibration()
    with_network = calibration.comm_model(_cluster(Network(8, 25e9, 8)))
    without = calibration.comm_model(_cluster(None))
    assert isinstance(with_network, TopologyCommModel) and isinstance(without, TieredCommModel)
    # inside a node both are the calibration's fitted curve: single-node predictions unchanged
    for collective in ("all_reduce", "all_gather", "send_recv"):
        assert with_network.time_s(collective, 2**26, Group(8, 1)) == without.time_s(collective, 2**26, Group(8, 1))
    # the flat ring at 20 GB/s prices a 32-rank data-parallel all_reduce of 1 GiB at
    # 2 (31/32) S / 20 GB/s; rails and the hierarchy make it several times faster
    flat = without.time_s("all_reduce", GiB, Group(32, 4))
    assert flat == pytest.approx(2 * 31 * 8e-6 + 2 * 31 / 32 * GiB / 20e9, rel=1e-12)
    assert flat / with_network.time_s("all_reduce", GiB, Group(32, 4)) > 4


def test_no_fitted_intra_curve_for_another_device_uses_the_cluster_link():
    cal = Calibration("x", "other-device", load_calibration().efficiency, intra_node_comm=None)
    m = cal.comm_model(_cluster(Network(8, 25e9, 8)))
    assert isinstance(m, TopologyCommModel)
    assert m.time_s("all_reduce", GiB, Group(8, 1)) == pytest.approx(2 * 7 * 3e-6 + 2 * 7 / 8 * GiB / 230e9)


def test_shipped_dgx_clusters_state_one_nic_per_gpu():
    for name, gbps in (("dgx-a100", 200), ("dgx-h100", 400), ("dgx-h200", 400)):
        net = load_cluster(name).network
        assert net is not None and (net.nics_per_node, net.nic_bandwidth_Bps) == (8, gbps * 1e9 / 8), name
    assert load_cluster("dgx1-v100").network is None  # DAPPLE's setting keeps its flat 3 GB/s


def _cluster_dict(network: object) -> dict:
    return {"name": "t", "nodes": 2, "devices_per_node": 8,
            "device": {"name": "d", "peak_tflops": 1, "mem_bandwidth_GBps": 1, "memory_GB": 1},
            "links": {"intra": {"bandwidth_GBps": 100}, "inter": {"bandwidth_GBps": 10}}, "network": network}


@pytest.mark.parametrize(("network", "message"), [
    ({"nics_per_node": 8}, "key 'network.nic_Gbps': missing"),
    ({"nics_per_node": 0, "nic_Gbps": 400}, "key 'network.nics_per_node': expected an integer >= 1"),
    ({"nics_per_node": 8, "nic_Gbps": 400, "nics": 2}, "key 'network.nics': unknown key"),
    ({"nics_per_node": 8, "nic_Gbps": 400, "nvlink_domain_size": 12},
     "network.nvlink_domain_size 12 is not a multiple of devices_per_node 8"),
    ({"nics_per_node": 8, "nic_Gbps": 400, "rail_fits": [{"nodes": 1, "latency_us": 5, "bandwidth_GBps": 40}]},
     "key 'network.rail_fits[0].nodes': expected an integer >= 2"),
])
def test_bad_network_keys_are_named(network, message):
    with pytest.raises(InputFileError, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
        cluster_from_dict(_cluster_dict(network), "x.yaml")
    assert str(info.value).startswith("x.yaml")


def test_network_is_optional_and_read_in_si_units():
    assert cluster_from_dict(_cluster_dict(None)).network is None
    net = cluster_from_dict(_cluster_dict({"nics_per_node": 4, "nic_Gbps": 200, "rail_fits": [
        {"nodes": 4, "latency_us": 7, "bandwidth_GBps": 20}]})).network
    assert net == Network(4, 25e9, 8, (RailFit(4, 7e-6, 20e9),))


def test_fit_rail_recovers_the_curve_it_generated():
    cluster = cluster_from_dict(_cluster_dict({"nics_per_node": 8, "nic_Gbps": 400}))
    intra = ConstantBandwidthModel(360e9, 360e9, 2e-6, 2e-6)
    assert cluster.network is not None
    truth = TopologyCommModel(intra, cluster.network, 8, Rail(20e-6, 0.7 * 50e9))
    sizes = tuple(2.0**k for k in range(20, 34))
    sweeps = [MeasuredSweep(f"s{n}", cluster, intra, "all_reduce", 8 * n, n, sizes,
                            tuple(truth.time_s("all_reduce", s, Group(8 * n, n)) for s in sizes)) for n in (2, 4, 8)]
    fit = fit_rail(sweeps)
    assert fit.efficiency == pytest.approx(0.7, rel=1e-4) and fit.latency_s == pytest.approx(20e-6, rel=1e-3)
    assert fit.gmae < 1e-4
    per_nodes = rail_fits(sweeps)
    assert [f.nodes for f in per_nodes] == [2, 4, 8]
    assert all(math.isclose(f.bandwidth_Bps, 35e9, rel_tol=1e-3) for f in per_nodes)


def test_fit_cluster_reproduces_the_shipped_dgx_h100_rail_curve(tmp_path, capsys):
    # dgx-h100.yaml's 2-node rail curve is what `paraplan fit --cluster` gives on the two
    # published 2 x 8 H100 NDR logs; without a network section it is a named error
    from pathlib import Path

    from paraplan.cli.main import main

    data = Path(__file__).resolve().parents[2] / "data" / "nccl-tests"
    csvs = []
    for name in ("10_h100_ndr400_2x8_all_reduce", "13_h100_ib400_2x8_all_reduce"):
        csvs.append(str(tmp_path / f"{name}.csv"))
        assert main(["ingest", "--no-track", "--format", "nccl-tests", "--collective", "all_reduce",
                     str(data / f"{name}.txt"), "-o", csvs[-1]]) == 0
    out = tmp_path / "comm_model.json"
    assert main(["fit", "--no-track", *csvs, "--cluster", "dgx-h100", "-o", str(out)]) == 0
    import json

    (row,) = json.loads(out.read_text())["rail_fits"]
    shipped = load_cluster("dgx-h100").network.rail_fits[0]
    assert (row["nodes"], round(row["latency_us"], 1), round(row["bandwidth_GBps"], 1)) == (
        shipped.nodes, round(shipped.latency_s * 1e6, 1), round(shipped.bandwidth_Bps / 1e9, 1))
    assert "rail_fits:\n    - {nodes: 2, latency_us: 35, bandwidth_GBps: 28.3}" in capsys.readouterr().err
    assert main(["fit", "--no-track", *csvs, "--cluster", "dgx1-v100", "-o", str(tmp_path / "x.json")]) == 2
    assert "cluster 'dgx1-v100' has no `network` section" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_fewer_nics_than_gpus_are_shared_by_the_gpus_behind_them():
    # 8 GPUs, 4 NICs (vtrain-a100): two GPUs behind each NIC, both crossing nodes at once
    # (the t data-parallel groups reduce together; the t ranks of a stage send together)
    m = model(nics=4)
    # one rank per node (TP8's data-parallel groups): a flat ring over half a NIC
    assert m.time_s("all_reduce", GiB, Group(8, 8)) == pytest.approx(
        ring_time_s("all_reduce", GiB, 8, A_S, NIC_Bps / 2), rel=1e-12)
    # four ranks per node (TP2): two NICs' worth, 2 x 4 = 8 ranks would have all four
    times = m.algorithm_times("all_reduce", GiB, Group(32, 8))
    assert times["ring"] == pytest.approx(2 * 7 * A_S + 2 * 31 / 32 * GiB / (2 * NIC_Bps), rel=1e-12)
    assert m.algorithm_times("all_reduce", GiB, Group(64, 8))["ring"] == pytest.approx(
        2 * 7 * A_S + 2 * 63 / 64 * GiB / (4 * NIC_Bps), rel=1e-12)
    # a pipeline transfer: half a NIC per rank
    assert m.time_s("send_recv", GiB, Group(2, 2)) == pytest.approx(
        A_S + GiB / (P2P_NIC_EFFICIENCY * NIC_Bps / 2), rel=1e-12)


def test_all_reduce_restricted_to_rings_is_the_ring_formula():
    # 2 x 8 GPUs with rings only (a fabric where NCCL is measured to run rings): each node's
    # NICs carry 2 (15/16) S instead of the hierarchical stage's S
    m = replace(model(), all_reduce_algorithms=("ring",))
    assert m.choose("all_reduce", GiB, Group(16, 2)) == (
        "ring", pytest.approx(2 * A_S + 2 * 15 / 16 * GiB / (8 * NIC_Bps), rel=1e-12))
    assert set(m.algorithm_times("all_reduce", GiB, Group(16, 2))) == {"ring"}
    with pytest.raises(ValueError, match="expected some of ring, hierarchical, tree, got \\('nvls',\\)"):
        replace(model(), all_reduce_algorithms=("nvls",))


@pytest.mark.parametrize(("device", "nvls", "expected"), [
    ("H100-SXM5-80GB", None, True),  # Hopper on an NVSwitch: multicast
    ("A100-SXM4-80GB", None, False),  # Ampere's NVSwitch has none
    ("GH200-96GB", False, False),  # stated: GPUs linked without an NVSwitch
    ("A100-SXM4-80GB", True, True),  # stated wins
])
def test_nvls_defaults_to_the_device_unless_the_file_says(device, nvls, expected):
    data = _cluster_dict({"nics_per_node": 8, "nic_Gbps": 400, **({} if nvls is None else {"nvls": nvls})})
    data["device"]["name"] = device
    network = cluster_from_dict(data).network
    assert network is not None and network.nvls is expected


def test_the_shipped_clusters_state_nvlink_sharp_as_their_nodes_have_it():
    from paraplan.clusters import load_cluster

    assert all(load_cluster(n).network.nvls for n in ("dgx-h100", "dgx-h200", "dgx-h800", "gcp-a3-mega"))
    assert not any(load_cluster(n).network.nvls for n in ("dgx-a100", "vtrain-a100", "oci-bm-gpu4-8", "gh200-alps"))
