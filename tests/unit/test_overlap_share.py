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
from paraplan.predict.build import run_structure
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.overlap_contention import OVERLAP_DATA, many_wave_slowdown
from paraplan.predict.overlap_share import (
    NCCL_INTER_NODE_CTAS,
    NCCL_INTRA_NODE_CTAS,
    OverlapShares,
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
