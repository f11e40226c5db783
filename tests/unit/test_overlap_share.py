"""Which share prices which overlap (`paraplan.predict.overlap_share`): tensor-parallel
collectives keep the calibration's Table-4 share, every other overlapped NCCL collective
takes the occupancy share CTAs / SMs of the device."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel
from paraplan.core.comm import Group
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import PassCost, run_structure
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.moe_deepep import NvlinkNode
from paraplan.predict.ops import Collective, PassWork, _Builder
from paraplan.predict.overlap_contention import OVERLAP_DATA, many_wave_slowdown
from paraplan.predict.overlap_share import (
    DEEPEP_SMS,
    NCCL_INTER_NODE_CTAS,
    NCCL_INTRA_NODE_CTAS,
    OverlapShares,
    collective_share,
    nccl_ctas,
    occupancy_share,
    occupancy_shares,
    share_or_calibrated,
)


def test_the_cta_counts_are_the_published_ones():
    rows = list(csv.DictReader((OVERLAP_DATA / "collective_ctas.csv").open(newline="")))
    nvswitch = {int(r["ctas"]) for r in rows if r["ranks"] == "8" and r["algorithm"].startswith("ring")}
    assert nvswitch == {NCCL_INTRA_NODE_CTAS} == {24}
    assert [int(r["ctas"]) for r in rows if r["ranks"] == "64"] == [NCCL_INTER_NODE_CTAS] == [32]
    assert [int(r["ctas"]) for r in rows if "DeepEP" in r["algorithm"]] == [DEEPEP_SMS] == [20]


def test_a_collective_holds_24_ctas_in_a_node_and_32_across_nodes():
    assert nccl_ctas(Group(8, 1)) == 24
    assert nccl_ctas(Group(48, 6)) == 32


def test_the_occupancy_share_is_one_less_the_inverse_many_wave_slowdown():
    assert occupancy_share(132, 24) == pytest.approx(1 - 1 / many_wave_slowdown(132, 24)) == pytest.approx(2 / 11)
    assert occupancy_share(108, 24) == pytest.approx(2 / 9)  # A100: 0.222
    assert occupancy_share(132, 32) == pytest.approx(8 / 33)  # H100 across nodes: 0.242
    assert occupancy_share(0, 24) is None  # no SM count stated
    assert occupancy_share(1, 24) is None  # a CPU "device": nothing left beside the collective


def test_without_an_occupancy_share_the_calibrations_applies():
    eff = DeviceEfficiency(comm_overlap_contention=0.85)
    assert share_or_calibrated(None, eff) == 0.85
    assert share_or_calibrated(0.25, eff) == 0.25


def test_a_run_gets_the_shares_of_its_groups_and_device():
    model = TransformerModel("gpt", num_layers=8, hidden_size=2048, num_attention_heads=16, seq_length=2048,
                             vocab_size=32000)
    comm = ConstantBandwidthModel(300e9, 40e9)
    # TP 2 x DP 8 on 8-GPU nodes: the DP group spans 2 nodes; PP 2 with stride 16 crosses them
    s = RunSettings(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, data_parallel_size=8,
                    global_batch_size=64, micro_batch_size=1, use_distributed_optimizer=True)
    assert run_structure(model, s, load_cluster("dgx-h100"), comm).overlap_shares == OverlapShares(
        32 / 132, 32 / 132, 32 / 132, 32 / 132)
    inside = RunSettings(data_parallel_size=4, pipeline_model_parallel_size=2, global_batch_size=8,
                         micro_batch_size=1)  # DP 4 and its pipeline neighbour in one node
    assert run_structure(model, inside, load_cluster("dgx-a100"), comm).overlap_shares == OverlapShares(
        24 / 108, 24 / 108, 24 / 108, 24 / 108)


def test_the_planner_prices_each_candidate_with_its_groups_share():
    got = occupancy_shares(132, np.array([1, 2, 16]), 0.85)
    np.testing.assert_allclose(got, [24 / 132, 32 / 132, 32 / 132])
    np.testing.assert_allclose(occupancy_shares(0, np.array([1, 2]), 0.85), [0.85, 0.85])  # no SM count


def test_tensor_parallel_collectives_keep_the_calibrations_share_the_others_take_occupancy():
    assert np.isnan(collective_share("tp", Group(8, 1), 132))
    assert np.isnan(collective_share("etp", Group(8, 1), 132))
    assert collective_share("cp_ring", Group(2, 1), 132) == 24 / 132
    assert collective_share("ep", Group(16, 2), 132) == 32 / 132
    assert collective_share("ep", Group(16, 2), 132, kernel_sms=DEEPEP_SMS) == DEEPEP_SMS / 132 == 20 / 132
    assert collective_share("ep", Group(16, 2), 132, kernel_sms=8) == 8 / 132  # HybridEP's default across nodes
    assert np.isnan(collective_share("ep", Group(16, 2), 0))  # no SM count: the calibration's


def _hidden_pass(group: str, node: NvlinkNode | None) -> PassCost:
    """One GEMM with one all-to-all (2 s at 1 B/s) beside it, over `group`."""
    w = _Builder(2)
    g = w.gemm(128, 128, 128)
    work = PassWork(w.build().kernels, (Collective("all_to_all", 2.0, g, group=group),))
    return PassCost.of(work, ConstantBandwidthModel(1.0, 1.0, 0.0, 0.0), Group(2, 1), {"ep": Group(2, 1)}, node)


def test_a_pass_prices_each_overlapped_collective_with_its_own_share():
    eff = DeviceEfficiency(comm_overlap_contention=0.85)
    gemm = np.array([5.0])
    ep = _hidden_pass("ep", NvlinkNode(132, 360.0))
    c = float(ep.hidden_comm_s[0])
    assert ep.comm_s(gemm, eff) == pytest.approx(24 / 132 * c)  # hidden: only its occupancy share of itself
    assert ep.comm_s(gemm, eff, part="ep") == pytest.approx(24 / 132 * c)
    tp = _hidden_pass("tp", NvlinkNode(132, 360.0))
    assert tp.hidden_share is None and tp.comm_s(gemm, eff) == pytest.approx(0.85 * c)
    no_units = _hidden_pass("ep", None)  # a pass built without the device: the calibration's
    assert no_units.hidden_share is None and no_units.comm_s(gemm, eff) == pytest.approx(0.85 * c)
