"""all_to_all across nodes: the held-out rates stated with their NICs
(data/published/alltoall/nccl_alltoall_nic_statements.csv, `paraplan.comm.fit_a2a_nic`)
against their closed forms, and the topology model's all_to_all of an EP group across nodes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.clusters import load_cluster
from paraplan.comm.fit_a2a_nic import busbw_efficiency, read_nic_statements
from paraplan.comm.topology import A2A_NIC_EFFICIENCY, TopologyCommModel
from paraplan.core import Group, InputFileError
from paraplan.predict.calibration import load_calibration

STATEMENTS = Path(__file__).resolve().parents[2] / "data/published/alltoall/nccl_alltoall_nic_statements.csv"
HEADER = "source,date,gpu,nodes,gpus_per_node,nics_per_node,nic_Gbps,nccl_version,busbw_GBps,per_nic_GBps,statement\n"
GiB = 2.0**30


def test_statements_read_as_written():
    rows = read_nic_statements(STATEMENTS)
    assert [(r.source, r.nccl_version) for r in rows] == [
        ("NVIDIA/nccl#1316", "2.18"), ("NVIDIA/nccl#1316", "2.19-2.20"), ("NVIDIA/nccl-tests#267", "")]
    first = rows[0]
    assert (first.gpu, first.nodes, first.gpus_per_node, first.nics_per_node) == ("H800", 8, 8, 16)
    assert first.nic_bandwidth_Bps == 25e9 and first.busbw_Bps == 50e9 and first.per_nic_Bps is None
    assert rows[2].per_nic_Bps == 48.5e9 and rows[2].busbw_Bps is None
    assert rows[2].statement.startswith("CX-7 NICs at NDR rate (400Gbps)")


def test_efficiency_from_a_bus_bandwidth_is_the_nic_share_of_the_crossing_traffic():
    # 64 ranks on 8 nodes, 2 x 25 GB/s NICs per GPU: algbw = busbw x 64/63, 7/8 of it leaves
    # the node over 50 GB/s of line rate per GPU
    rows = read_nic_statements(STATEMENTS)
    assert rows[0].efficiency() == pytest.approx(50 * 64 / 63 * 7 / 8 / 50, rel=1e-12)  # 0.8889
    assert rows[1].efficiency() == pytest.approx(37 * 64 / 63 * 7 / 8 / 50, rel=1e-12)  # 0.6578
    assert rows[2].efficiency() == pytest.approx(48.5 / 50, rel=1e-12)
    # the shipped efficiency (fitted on the A100 nccl-tests row) lies inside the held-out spread
    assert min(r.efficiency() for r in rows) < A2A_NIC_EFFICIENCY < max(r.efficiency() for r in rows)
    with pytest.raises(ValueError, match=r"^the NIC efficiency of all_to_all needs a group across >= 2 nodes$"):
        busbw_efficiency(50e9, 1, 8, 8, 50e9)


def test_the_model_predicts_the_statement_as_line_rate_times_efficiency():
    # dgx-h800 with the statement's 16 x 200 Gb/s NICs, 8 x 8 ranks, 1 GiB: every rank sends
    # 7/8 of S over its two NICs at A2A_NIC_EFFICIENCY, plus the rail latency once per remote node
    row = read_nic_statements(STATEMENTS)[0]
    cluster = load_cluster("dgx-h800")
    assert cluster.network is not None
    network = replace(cluster.network, nics_per_node=row.nics_per_node, nic_bandwidth_Bps=row.nic_bandwidth_Bps)
    comm = load_calibration().comm_model(replace(cluster, network=network))
    assert isinstance(comm, TopologyCommModel)
    latency_s = comm.rail_for(8).latency_s
    expected_s = 7 * latency_s + 7 / 8 * GiB / (A2A_NIC_EFFICIENCY * 2 * 25e9)
    assert comm.time_s("all_to_all", GiB, Group(64, 8)) == pytest.approx(expected_s, rel=1e-12)
    busbw_Bps = GiB / expected_s * 63 / 64
    assert busbw_Bps / 1e9 == pytest.approx(47.1, abs=0.05)  # stated 50 GB/s with NCCL 2.18: -5.8%


@pytest.mark.parametrize("cells, why", [
    ("x,2024,H800,8,8,16,200,2.18,50,48,both", "exactly one of busbw_GBps and per_nic_GBps"),
    ("x,2024,H800,8,8,16,200,2.18,,,neither", "exactly one of busbw_GBps and per_nic_GBps"),
    ("x,2024,H800,eight,8,16,200,2.18,50,,words", "invalid literal"),
])
def test_statement_errors_name_the_line(tmp_path, cells, why):
    bad = tmp_path / "statements.csv"
    bad.write_text(HEADER + cells + "\n")
    with pytest.raises(InputFileError, match=rf"statements\.csv:2.*{why}"):
        read_nic_statements(bad)


def test_an_ep32_token_all_to_all_over_four_dgx_h100_nodes():
    # Qwen3-235B-A22B's dispatch at TP 2 with sequence parallelism, micro-batch 1 of 4,096
    # tokens: 2,048 tokens x top-8 x hidden 4,096 x 2 bytes = 128 MiB per rank; EP 32 holds
    # all 8 GPUs of 4 nodes, so each rank sends 3/4 of it over its own NIC (PXN keeps it on
    # its rail) at A2A_NIC_EFFICIENCY, plus the 4-node rail latency once per remote node
    size_bytes = 2048 * 8 * 4096 * 2
    cluster = load_cluster("dgx-h100")
    comm = load_calibration().comm_model(cluster)
    assert isinstance(comm, TopologyCommModel)
    latency_s = comm.rail_for(4).latency_s
    assert latency_s == pytest.approx(33.3e-6)
    expected_s = 3 * latency_s + 3 / 4 * size_bytes / (A2A_NIC_EFFICIENCY * 50e9)
    assert comm.time_s("all_to_all", size_bytes, Group(32, 4)) == pytest.approx(expected_s, rel=1e-12)
    assert expected_s == pytest.approx(2.480e-3, abs=1e-6)
    # the node's NVLink (PXN forwards the crossing share too) is far from binding: 8 ranks
    # moving 7/8 of 128 MiB at 360 GB/s take about 0.33 ms
    assert comm.time_s("all_to_all", size_bytes, Group(8, 1)) < 0.2 * expected_s
