"""The flex token dispatcher with DeepEP: nodes a token reaches, the published kernel
bandwidths (equal to the transcribed CSV), the layer's transfers and exact errors."""

import csv
from math import comb
from pathlib import Path

import pytest

from paraplan.cli.main import main
from paraplan.core import StrategyError
from paraplan.core.comm import Group
from paraplan.core.run_settings import RunSettings
from paraplan.predict.models import PRESETS
from paraplan.predict.moe_deepep import (
    DEEPEP_COMBINE,
    DEEPEP_DISPATCH,
    H100_NODE,
    DEEPEP_INTERNODE_GBps,
    DeepEpTransfer,
    HYBRIDEP_INTERNODE_GBps,
    hybridep_sms_above_measured,
    nodes_hit,
)
from paraplan.predict.moe_ops import moe_layer_work
from paraplan.predict.moe_shape import moe_shape
from paraplan.predict.ops import MEMORY

QWEN = PRESETS["qwen3-30b-a3b"]  # h 2048, 128 experts, top-8, s 4096
TABLE = Path(__file__).resolve().parents[2] / "data/published/deepep/deepep_v1_normal_h800.csv"


def flex(**kw) -> RunSettings:
    base = dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, data_parallel_size=16,
                global_batch_size=16, micro_batch_size=1, expert_model_parallel_size=16,
                moe_token_dispatcher_type="flex")
    return RunSettings(**{**base, **kw})


def test_the_bandwidths_are_the_published_internode_rows():
    with TABLE.open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["type"] == "internode"]
    assert {int(r["ep"]): (float(r["dispatch_GBps"]), float(r["combine_GBps"])) for r in rows} == \
        DEEPEP_INTERNODE_GBps


def test_a_token_reaches_the_nodes_of_its_distinct_experts():
    # 128 experts on 2 nodes, top-8: a node is missed only when all 8 fall on the other
    assert nodes_hit(128, 8, 2) == pytest.approx(2 * (1 - comb(64, 8) / comb(128, 8)), rel=1e-15)
    assert nodes_hit(128, 8, 2) == pytest.approx(1.99381, abs=1e-5)  # C(64,8)/C(128,8) = 0.0030959
    assert nodes_hit(8, 2, 8) == pytest.approx(2.0)  # one expert per node: k nodes
    assert nodes_hit(64, 8, 1) == 1.0


def test_group_limited_routing_caps_the_nodes_a_token_reaches():
    """k / g experts in each of g groups out of G (DeepSeek-V3: 8 experts, 4 of 8 groups of 32)."""
    assert nodes_hit(256, 8, 8, 8, 4) == pytest.approx(4.0, rel=1e-15)  # a group per node: g nodes
    # two groups per node: a node is missed when neither of its groups is chosen
    assert nodes_hit(256, 8, 4, 8, 4) == pytest.approx(4 * (1 - comb(6, 4) / comb(8, 4)), rel=1e-15)
    # a group over two nodes of 16: hit when its group is chosen and not both experts on the other node
    assert nodes_hit(256, 8, 16, 8, 4) == pytest.approx(16 * 0.5 * (1 - comb(16, 2) / comb(32, 2)), rel=1e-15)
    assert nodes_hit(256, 8, 8, 1, 1) == nodes_hit(256, 8, 8) == pytest.approx(
        8 * (1 - comb(224, 8) / comb(256, 8)), rel=1e-15)
    grouped = DeepEpTransfer(DEEPEP_DISPATCH, 1e6, -1, "ep", experts=256, topk=8, groups=8, group_topk=4)
    assert grouped.time_s(Group(64, 8)) == pytest.approx(1e6 * 4.0 / 51e9, rel=1e-12)


def test_dispatch_time_is_bytes_times_nodes_over_the_published_bandwidth():
    t = DeepEpTransfer(DEEPEP_DISPATCH, 4096 * 2048 * 2, -1, "ep", experts=128, topk=8)
    assert t.time_s(Group(16, 2)) == pytest.approx(4096 * 2048 * 2 * nodes_hit(128, 8, 2) / 43e9, rel=1e-12)
    combine = DeepEpTransfer(DEEPEP_COMBINE, 1e6, -1, "ep", experts=128, topk=8)
    assert combine.time_s(Group(32, 4)) == pytest.approx(1e6 * nodes_hit(128, 8, 4) / 57e9, rel=1e-12)
    assert t.time_s(Group(1, 1)) == 0.0


@pytest.mark.parametrize(("group", "message"), [  # inside one node: tests/unit/test_deepep_intranode.py
    (Group(128, 16), "moe_token_dispatcher_type flex (DeepEP) with expert_model_parallel_size 128: DeepEP's "
                     "internode bandwidth is published for EP 16, 32, 64 only"),
])
def test_unpublished_groups_are_errors(group, message):
    with pytest.raises(StrategyError) as err:
        DeepEpTransfer(DEEPEP_DISPATCH, 1.0, -1, "ep", experts=128, topk=8).time_s(group)
    assert str(err.value) == message


def test_a_flex_layer_sends_each_token_once_and_orders_it_on_the_receiving_rank():
    s = flex()
    work = moe_layer_work(QWEN, s)
    m = moe_shape(QWEN, s)
    T, h = 4096, 2048
    ep = [c for c in work.forward.collectives if c.group == "ep"]
    assert [(c.collective, c.nbytes) for c in ep] == [(DEEPEP_DISPATCH, T * h * 2), (DEEPEP_COMBINE, T * h * 2)]
    assert [c.collective for c in work.backward.collectives if c.group == "ep"] == [DEEPEP_DISPATCH, DEEPEP_COMBINE]
    # each rank receives T x (distinct ranks per token) tokens: 8 experts per rank of 16
    assert m.received_tokens == pytest.approx(T * 16 * (1 - comb(120, 8) / comb(128, 8)), rel=1e-12)
    local = (m.received_tokens + T * 8) * 2 * h
    assert sum(1 for b, k in zip(work.forward.kernels.bytes, work.forward.kernels.kind, strict=True)
               if k == MEMORY and b == pytest.approx(local)) == 2


def test_flex_with_the_a2a_overlap_keeps_each_kernel_kind():
    work = moe_layer_work(QWEN, flex(overlap_moe_expert_parallel_comm=True))
    fwd = [c.collective for c in work.forward.collectives if c.group == "ep"]
    bwd = [c.collective for c in work.backward.collectives if c.group == "ep"]
    assert fwd == [DEEPEP_DISPATCH, DEEPEP_COMBINE]  # the combine's backward is a dispatch kernel, and back
    assert bwd == [DEEPEP_DISPATCH, DEEPEP_COMBINE]
    assert all(c.hidden_by >= 0 for c in work.forward.collectives + work.backward.collectives if c.group == "ep")


def test_flex_with_expert_tensor_parallelism_is_an_error():
    s = flex(tensor_model_parallel_size=2, data_parallel_size=8, sequence_parallel=True, expert_model_parallel_size=8,
             expert_tensor_parallel_size=2)
    with pytest.raises(StrategyError) as err:
        s.check(QWEN)
    assert str(err.value) == ("moe_token_dispatcher_type flex with expert_tensor_parallel_size 2 is not modelled "
                              "(DeepEP priced for ETP 1)")


# -- HybridEP (moe_flex_dispatcher_backend hybridep)
HYBRID_TABLE = TABLE.with_name("hybridep_h100_internode.csv")


def hybrid(kind: str = DEEPEP_DISPATCH, nbytes: float = 1e6, num_sms: int = 0) -> DeepEpTransfer:
    return DeepEpTransfer(kind, nbytes, -1, "ep", experts=128, topk=8, backend="hybridep", num_sms=num_sms)


def test_the_hybridep_bandwidths_are_the_published_torch_api_bf16_rows():
    with HYBRID_TABLE.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {(H100_NODE, int(r["ranks"]), int(r["sms"])): (float(r["dispatch_bf16_GBps"]), float(r["combine_GBps"]))
            for r in rows} == HYBRIDEP_INTERNODE_GBps
    assert all(int(r["ranks"]) == 8 * int(r["nodes"]) for r in rows)


def test_hybridep_is_priced_like_deepep_across_nodes_at_its_own_bandwidth_and_sms():
    nbytes = 4096 * 2048 * 2
    # HybridEP's default across nodes is 8 SMs: EP 16 dispatch 57.74 GB/s, combine 56.96
    assert hybrid(nbytes=nbytes).time_s(Group(16, 2), H100_NODE) == pytest.approx(
        nbytes * nodes_hit(128, 8, 2) / 57.74e9, rel=1e-12)
    assert hybrid(DEEPEP_COMBINE, nbytes).time_s(Group(32, 4), H100_NODE) == pytest.approx(
        nbytes * nodes_hit(128, 8, 4) / 50.68e9, rel=1e-12)
    assert hybrid(nbytes=nbytes, num_sms=16).time_s(Group(16, 2), H100_NODE) == pytest.approx(
        nbytes * nodes_hit(128, 8, 2) / 54.47e9, rel=1e-12)
    # past 8 SMs the figures stop rising: more than the 16 measured is priced as 16
    assert hybrid(nbytes=nbytes, num_sms=32).time_s(Group(16, 2), H100_NODE) == \
        hybrid(nbytes=nbytes, num_sms=16).time_s(Group(16, 2), H100_NODE)
    assert hybrid(num_sms=32).sms(Group(16, 2)) == 32  # its SMs still hold 32 beside an overlapped kernel
    assert hybridep_sms_above_measured(flex(moe_flex_dispatcher_backend="hybridep", moe_flex_dispatcher_num_sms=32))
    assert not hybridep_sms_above_measured(flex(moe_flex_dispatcher_backend="hybridep", moe_flex_dispatcher_num_sms=16))
    assert not hybridep_sms_above_measured(flex(moe_flex_dispatcher_num_sms=32))  # DeepEP: an error, not a note
    assert hybrid().sms(Group(16, 2)) == 8 and hybrid(num_sms=4).sms(Group(16, 2)) == 4
    assert hybrid().sms(Group(8, 1)) == 24  # its default inside one node
    assert DeepEpTransfer(DEEPEP_DISPATCH, 1.0, -1, "ep", experts=128, topk=8).sms(Group(16, 2)) == 20


@pytest.mark.parametrize(("transfer", "group", "node", "message"), [
    (hybrid(), Group(8, 1), H100_NODE,
     "moe_flex_dispatcher_backend hybridep with an expert-parallel group of 8 ranks inside one node on 132 SMs, "
     "360 GB/s NVLink and 24 SMs: HybridEP's kernels are measured for EP 16, 32, 64 at 4, 8, 16 SMs across 8-GPU "
     "nodes of 132 SMs, 360 GB/s NVLink only"),
    (hybrid(num_sms=12), Group(16, 2), H100_NODE,
     "moe_flex_dispatcher_backend hybridep with an expert-parallel group of 16 ranks over 2 nodes on 132 SMs, "
     "360 GB/s NVLink and 12 SMs: HybridEP's kernels are measured for EP 16, 32, 64 at 4, 8, 16 SMs across 8-GPU "
     "nodes of 132 SMs, 360 GB/s NVLink only"),
    (DeepEpTransfer(DEEPEP_DISPATCH, 1.0, -1, "ep", experts=128, topk=8, num_sms=24), Group(16, 2), H100_NODE,
     "moe_flex_dispatcher_num_sms 24 with DeepEP: its kernels are measured at its default of 20 SMs only"),
])
def test_unmeasured_flex_settings_are_errors(transfer, group, node, message):
    with pytest.raises(StrategyError) as err:
        transfer.time_s(group, node)
    assert str(err.value) == message


def test_a_hybridep_layer_gathers_the_routing_maps_once_and_reuses_the_handle():
    s = flex(moe_flex_dispatcher_backend="hybridep")
    s.check(QWEN)
    work = moe_layer_work(QWEN, s)
    T, E, ep = 4096, 128, 16
    fwd = [(c.collective, c.nbytes) for c in work.forward.collectives if c.group == "ep"]
    assert fwd == [("all_gather", ep * T * E), (DEEPEP_DISPATCH, T * 2048 * 2), (DEEPEP_COMBINE, T * 2048 * 2)]
    assert [c.collective for c in work.backward.collectives if c.group == "ep"] == [DEEPEP_DISPATCH, DEEPEP_COMBINE]
    assert all(c.backend == "hybridep" for c in work.forward.collectives if isinstance(c, DeepEpTransfer))
    assert len(work.forward.host_syncs) == 1 and not work.backward.host_syncs
    deepep = moe_layer_work(QWEN, flex())
    assert len(deepep.forward.host_syncs) == 1  # DeepEP waits too, after its layout and notify kernels
    assert sum(1 for b, k in zip(work.forward.kernels.bytes, work.forward.kernels.kind, strict=True)
               if k == MEMORY and b == ep * T * E) == 1  # the metadata scan


@pytest.mark.parametrize(("settings", "message"), [
    (dict(moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_backend="hybridep"),
     "moe_flex_dispatcher_backend hybridep needs moe_token_dispatcher_type flex (the row's dispatcher is alltoall)"),
    (dict(moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_num_sms=8),
     "moe_flex_dispatcher_num_sms 8 needs moe_token_dispatcher_type flex (the row's dispatcher is alltoall)"),
    (dict(moe_flex_dispatcher_num_sms=-1),
     "moe_flex_dispatcher_num_sms must be >= 0 (0: the backend's default), got -1"),
])
def test_flex_settings_are_checked(settings, message):
    with pytest.raises(StrategyError) as err:
        flex(**settings).check(QWEN)
    assert str(err.value) == message


def test_predict_names_hybridep_rows_priced_at_fewer_sms(tmp_path, capsys):
    path = tmp_path / "runs.csv"
    head = ("model,seq_length,tensor_model_parallel_size,pipeline_model_parallel_size,data_parallel_size,"
            "global_batch_size,micro_batch_size,expert_model_parallel_size,expert_tensor_parallel_size,"
            "moe_token_dispatcher_type,moe_flex_dispatcher_backend,moe_flex_dispatcher_num_sms\n")
    path.write_text(head + "qwen3-30b-a3b,4096,1,1,16,16,1,16,1,flex,hybridep,32\n"
                           "qwen3-30b-a3b,4096,1,1,16,16,1,16,1,flex,hybridep,16\n")
    out = tmp_path / "out.csv"
    assert main(["predict", str(path), "--cluster", "dgx-h100", "-o", str(out), "--no-track"]) == 0
    assert (f"paraplan predict: note: {path}: line(s) 2: HybridEP with moe_flex_dispatcher_num_sms above 16 is "
            "priced at 16 SMs' published bandwidths, the most it was measured with (docs/moe.md)"
            ) in capsys.readouterr().err
    with out.open(newline="") as handle:
        first, second = csv.DictReader(handle)
    assert first["predicted_iteration_s"] == second["predicted_iteration_s"]  # 32 SMs priced as 16
