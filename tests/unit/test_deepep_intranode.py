"""DeepEP's intranode kernels (an expert-parallel group inside one node): the measured
bandwidths equal the transcribed tables, the pricing reproduces the H100 measurement,
each cluster picks its node's figures, and unmeasured nodes are exact errors."""

import csv
from math import comb
from pathlib import Path

import pytest

from paraplan.clusters import load_cluster
from paraplan.core import StrategyError
from paraplan.core.comm import ConstantBandwidthModel, Group
from paraplan.core.run_settings import RunSettings
from paraplan.predict.models import PRESETS
from paraplan.predict.moe_deepep import (
    DEEPEP_COMBINE,
    DEEPEP_DISPATCH,
    H100_NODE,
    H800_NODE,
    DEEPEP_INTRANODE_GBps,
    DeepEpTransfer,
    NvlinkNode,
    ranks_hit,
)
from paraplan.predict.moe_ops import moe_layer_work
from paraplan.predict.pass_cost import PassCost

DATA = Path(__file__).resolve().parents[2] / "data/published/deepep"
H100_TABLE = DATA / "deepep_v1_intranode_h100_tilescale.csv"
H800_TABLE = DATA / "deepep_v1_normal_h800.csv"


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_h100_figures_are_deepeps_row_of_the_tilescale_table():
    (deepep,) = [r for r in rows(H100_TABLE) if r["method"] == "DeepEP"]
    assert (deepep["gpu"], deepep["ranks"], deepep["num_sms"], deepep["dispatch_dtype"]) == ("H100", "8", "20", "bf16")
    assert DEEPEP_INTRANODE_GBps[H100_NODE, 8] == (float(deepep["dispatch_GBps"]), float(deepep["combine_GBps"]))
    assert DEEPEP_INTRANODE_GBps[H100_NODE, 8] == (328.97, 287.14)


def test_the_h800_figures_are_deepeps_own_intranode_row():
    (intranode,) = [r for r in rows(H800_TABLE) if r["type"] == "intranode"]
    assert DEEPEP_INTRANODE_GBps[H800_NODE, int(intranode["ep"])] == (
        float(intranode["dispatch_GBps"]), float(intranode["combine_GBps"]))
    assert set(DEEPEP_INTRANODE_GBps) == {(H800_NODE, 8), (H100_NODE, 8)}


def test_the_published_bandwidth_counts_one_copy_per_destination_rank():
    """bandwidth x time / (T h 2) is the tokens rank 0 received per token sent: the
    expected distinct ranks among a token's 8 of 32 experts (4 per rank), 5.636."""
    for r in rows(H100_TABLE):
        tokens, hidden = int(r["tokens"]), int(r["hidden"])
        for kind in ("dispatch", "combine"):
            received = float(r[f"{kind}_GBps"]) * 1e9 * float(r[f"{kind}_ms"]) * 1e-3 / (tokens * hidden * 2)
            assert received == pytest.approx(ranks_hit(32, 8, 8), rel=4e-3), (r["method"], kind)
    assert ranks_hit(32, 8, 8) == pytest.approx(8 * (1 - comb(28, 8) / comb(32, 8)), rel=1e-15)
    assert ranks_hit(32, 8, 8) == pytest.approx(5.63604, abs=1e-5)


def test_pricing_the_benchmarks_transfer_gives_its_measured_time():
    nbytes = 4096 * 7168 * 2
    dispatch = DeepEpTransfer(DEEPEP_DISPATCH, nbytes, -1, "ep", experts=32, topk=8)
    combine = DeepEpTransfer(DEEPEP_COMBINE, nbytes, -1, "ep", experts=32, topk=8)  # its sample: 5.649 ranks
    assert dispatch.time_s(Group(8, 1), H100_NODE) == pytest.approx(1.0045e-3, rel=3e-3)
    assert combine.time_s(Group(8, 1), H100_NODE) == pytest.approx(1.1552e-3, rel=3e-3)


def test_intranode_time_is_bytes_times_ranks_hit_over_the_nodes_bandwidth():
    t = DeepEpTransfer(DEEPEP_DISPATCH, 1e6, -1, "ep", experts=128, topk=8)
    assert ranks_hit(128, 8, 8) == pytest.approx(8 * (1 - comb(112, 8) / comb(128, 8)), rel=1e-15)
    assert t.time_s(Group(8, 1), H100_NODE) == pytest.approx(1e6 * ranks_hit(128, 8, 8) / 328.97e9, rel=1e-12)
    assert t.time_s(Group(8, 1), H800_NODE) == pytest.approx(1e6 * ranks_hit(128, 8, 8) / 153e9, rel=1e-12)
    combine = DeepEpTransfer(DEEPEP_COMBINE, 1e6, -1, "ep", experts=128, topk=8)
    assert combine.time_s(Group(8, 1), H100_NODE) == pytest.approx(1e6 * ranks_hit(128, 8, 8) / 287.14e9, rel=1e-12)
    assert combine.time_s(Group(8, 1), H800_NODE) == pytest.approx(1e6 * ranks_hit(128, 8, 8) / 158e9, rel=1e-12)
    # group-limited routing: 8 of 256 experts in 4 of 8 groups of 32 (one group per rank): 4 ranks
    grouped = DeepEpTransfer(DEEPEP_DISPATCH, 1e6, -1, "ep", experts=256, topk=8, groups=8, group_topk=4)
    assert grouped.time_s(Group(8, 1), H100_NODE) == pytest.approx(1e6 * 4.0 / 328.97e9, rel=1e-12)


@pytest.mark.parametrize(("cluster", "node"), [("dgx-h100", H100_NODE), ("dgx-h800", H800_NODE),
                                               ("dgx-h200", H100_NODE), ("dgx-a100", NvlinkNode(108, 230.0))])
def test_each_cluster_names_its_gpu_and_nvlink(cluster, node):
    assert NvlinkNode.of(load_cluster(cluster)) == node


@pytest.mark.parametrize(("group", "node", "message"), [
    (Group(8, 1), None,
     "moe_token_dispatcher_type flex (DeepEP) with an expert-parallel group of 8 ranks inside one node: DeepEP's "
     "intranode kernels are measured for EP 8 on 132 SMs, 160 GB/s NVLink; EP 8 on 132 SMs, 360 GB/s NVLink only"),
    (Group(8, 1), NvlinkNode(108, 240.0),
     "moe_token_dispatcher_type flex (DeepEP) with an expert-parallel group of 8 ranks inside one node on 108 SMs, "
     "240 GB/s NVLink: DeepEP's intranode kernels are measured for EP 8 on 132 SMs, 160 GB/s NVLink; EP 8 on 132 "
     "SMs, 360 GB/s NVLink only"),
    (Group(4, 1), H100_NODE,
     "moe_token_dispatcher_type flex (DeepEP) with an expert-parallel group of 4 ranks inside one node on 132 SMs, "
     "360 GB/s NVLink: DeepEP's intranode kernels are measured for EP 8 on 132 SMs, 160 GB/s NVLink; EP 8 on 132 "
     "SMs, 360 GB/s NVLink only"),
])
def test_unmeasured_nodes_are_errors(group, node, message):
    with pytest.raises(StrategyError) as err:
        DeepEpTransfer(DEEPEP_DISPATCH, 1.0, -1, "ep", experts=128, topk=8).time_s(group, node)
    assert str(err.value) == message


def test_uneven_experts_are_an_error():
    with pytest.raises(StrategyError) as err:
        DeepEpTransfer(DEEPEP_DISPATCH, 1.0, -1, "ep", experts=60, topk=4).time_s(Group(8, 1), H100_NODE)
    assert str(err.value) == "DeepEP: 60 experts do not spread evenly over 8 ranks"


def test_a_qwen3_layer_on_one_h100_node_pays_both_transfers():
    """Qwen3-30B-A3B, EP 8 inside one node, flex: the forward's expert-parallel cost is
    its dispatch and combine at the H100 figures (nothing hidden without the overlap)."""
    settings = RunSettings(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, data_parallel_size=8,
                           global_batch_size=8, micro_batch_size=1, expert_model_parallel_size=8,
                           moe_token_dispatcher_type="flex")
    forward = moe_layer_work(PRESETS["qwen3-30b-a3b"], settings).forward
    comm = ConstantBandwidthModel(1e12, 1e12)
    cost = PassCost.of(forward, comm, Group(1, 1), {"ep": Group(8, 1)}, H100_NODE)
    tokens = 4096 * settings.moe_load_imbalance
    per_token = 2048 * 2 * ranks_hit(128, 8, 8)
    assert dict(cost.other_blocking_s)["ep"] == pytest.approx(
        tokens * per_token * (1 / 328.97e9 + 1 / 287.14e9), rel=1e-12)
