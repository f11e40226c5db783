"""FittedCommModel (the CommModel the simulator and planner use) and the
comm_model.json contract of docs/design.md."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paraplan.comm.fit_a2av import effective_size_bytes
from paraplan.comm.fit_sweep import fit_sweep
from paraplan.comm.model import FittedCommModel, fits_document
from paraplan.core import CommModel, Group, InputFileError

SIZES = 2.0 ** np.arange(10, 27)  # 1 KiB .. 64 MiB
ALPHA_INTRA, BETA_INTRA = 10e-6, 100e9
ALPHA_INTER, BETA_INTER = 40e-6, 10e9


def _document():
    entries = []
    for nodes, alpha, beta in ((1, ALPHA_INTRA, BETA_INTRA), (2, ALPHA_INTER, BETA_INTER)):
        times = alpha + SIZES * 1.75 / beta
        entries += fit_sweep("all_reduce", 8, nodes, SIZES, times)
    entries += fit_sweep("all_to_all", 2, 1, SIZES, 5e-6 + SIZES * 0.5 / 20e9)
    return fits_document(entries)


@pytest.fixture(scope="module")
def model():
    return FittedCommModel.from_dict(_document())


def test_json_contract():
    document = json.loads(json.dumps(_document()))
    assert set(document) == {"schema_version", "fits"}
    assert len(document["fits"]) == 3 * 3  # 3 sweeps x 3 models
    keys = {"collective", "world_size", "nodes", "tier", "model", "chosen", "params", "size_range_bytes",
            "gmae", "heldout_gmae", "mean_abs_rel_err", "std_abs_rel_err", "n_points"}
    for fit in document["fits"]:
        assert set(fit) == keys
        assert fit["tier"] == ("intra" if fit["nodes"] == 1 else "inter")
        assert fit["size_range_bytes"] == [1024, 2**26] and fit["n_points"] == SIZES.size
        assert 0 <= fit["gmae"] < 1 and 0 <= fit["heldout_gmae"] < 1  # fractions
    for sweep in {(f["collective"], f["world_size"], f["nodes"]) for f in document["fits"]}:
        chosen = [f for f in document["fits"]
                  if (f["collective"], f["world_size"], f["nodes"]) == sweep and f["chosen"]]
        assert len(chosen) == 1


def test_tiers_select_their_fit(model):
    assert isinstance(model, CommModel)
    m = 2**20
    assert model.time_s("all_reduce", m, Group(8, 1)) == pytest.approx(ALPHA_INTRA + m * 1.75 / BETA_INTRA, rel=1e-3)
    assert model.time_s("all_reduce", m, Group(8, 2)) == pytest.approx(ALPHA_INTER + m * 1.75 / BETA_INTER, rel=1e-3)
    assert model.predict("all_reduce", m, Group(8, 4)).flags == ()  # any multi-node group is `inter`
    assert model.time_s("all_reduce", m, Group(1)) == 0.0


def test_outside_the_measured_range_is_flagged_and_continuous(model):
    group = Group(8, 1)
    top = SIZES[-1]
    inside = model.predict("all_reduce", top, group)
    above = model.predict("all_reduce", top * (1 + 1e-9), group)
    assert inside.flags == () and above.flags == ("outside_range",)
    assert above.time_s == pytest.approx(inside.time_s, rel=1e-6)
    far = model.predict("all_reduce", 2**32, group)
    assert far.time_s == pytest.approx(ALPHA_INTRA + 2**32 * 1.75 / BETA_INTRA, rel=1e-3)
    assert model.predict("all_reduce", 8, group).flags == ("outside_range",)


def test_unmeasured_world_size_uses_per_link_ring_formulas(model):
    """From the 8-rank fit t = alpha + 1.75 m / beta: ring all_reduce has 2(p-1) = 14
    latency steps, so a link has alpha/14 latency and bandwidth beta; 4 ranks then
    take 6 alpha/14 + 1.5 m / beta."""
    m = 2**20
    prediction = model.predict("all_reduce", m, Group(4, 1))
    assert prediction.flags == ("extrapolated",)
    assert prediction.time_s == pytest.approx(6 * ALPHA_INTRA / 14 + 1.5 * m / BETA_INTRA, rel=1e-3)
    gather = model.predict("all_gather", m, Group(4, 2))
    assert gather.flags == ("extrapolated", "other_collective")
    assert gather.time_s == pytest.approx(3 * ALPHA_INTER / 14 + 0.75 * m / BETA_INTER, rel=1e-3)


def test_send_recv_and_all_to_allv(model):
    m = 2**20
    p2p = model.predict("send_recv", m, Group(2, 2))
    assert p2p.flags == ("derived",)
    assert p2p.time_s == pytest.approx(ALPHA_INTER / 14 + m / BETA_INTER, rel=1e-3)
    assert model.time_s("all_to_allv", m, Group(2)) == pytest.approx(model.time_s("all_to_all", m, Group(2)))


def test_json_round_trip_and_bad_files(tmp_path):
    path = tmp_path / "comm_model.json"
    path.write_text(json.dumps(_document()))
    loaded = FittedCommModel.from_json(path)
    assert loaded.measured() == [("all_reduce", 8, "inter"), ("all_reduce", 8, "intra"), ("all_to_all", 2, "intra")]
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  oops")
    with pytest.raises(InputFileError, match=r"bad\.json:2: not valid JSON"):
        FittedCommModel.from_json(bad)
    with pytest.raises(InputFileError, match=r"^<dict>: no fits: a comm model needs at least one fitted sweep$"):
        FittedCommModel.from_dict({"schema_version": 1, "fits": []})


def test_a2av_effective_sizes():
    # B = 256 over 2 ranks (128 each), tables (1, 3), D = 32, float32
    assert effective_size_bytes("sum", 256, (1, 3), 32) == 128 * 4 * 32 * 4
    assert effective_size_bytes("max_of_max", 256, (1, 3), 32) == 128 * 3 * 32 * 4
    assert effective_size_bytes("max_of_sum", 256, (1, 3), 32) == 128 * 4 * 32 * 4
    # even tables: sum is the all_to_all per-rank total B x T x D x 4
    assert effective_size_bytes("sum", 1024, (5, 5, 5, 5), 64) == 1024 * 5 * 64 * 4
    assert effective_size_bytes("max_of_max", 1024, (5, 5, 5, 5), 64) == 256 * 15 * 64 * 4



@pytest.mark.parametrize(("change", "message"), [
    ({"collective": "all7777"}, r"fits\[0\].collective: expected one of all_reduce, .*, got 'all7777'"),
    ({"params": {"log2_size_bytes": [10.0, 20.0], "log2_time_s": [-10.0, 5000.0]}},
     r"fits\[0\].params: expected log2_size_bytes increasing within \[0, 50\] and as many log2_time_s within "
     r"\[-60, 40\]"),
    ({"params": {"log2_size_bytes": [20.0, 10.0], "log2_time_s": [-10.0, -5.0]}},
     r"fits\[0\].params: expected log2_size_bytes increasing"),
])
def test_a_broken_table_fit_is_refused_when_read(change, message):
    fit = {"collective": "all_reduce", "world_size": 8, "nodes": 1, "tier": "intra", "model": "table",
           "chosen": True, "params": {"log2_size_bytes": [10.0, 20.0], "log2_time_s": [-15.0, -8.0]},
           "size_range_bytes": [1024, 2**20]}
    ab = {**fit, "model": "alpha_beta", "chosen": False,
          "params": {"alpha_s": 3e-5, "beta_Bps": 1e11, "busbw_factor": 1.75}}
    assert FittedCommModel.from_dict({"fits": [fit, ab]}).time_s("all_reduce", 2**15, Group(8)) > 0
    with pytest.raises(InputFileError, match=r"comm.json: " + message):
        FittedCommModel.from_dict({"fits": [{**fit, **change}, ab]}, "comm.json")
    with pytest.raises(InputFileError, match=r"comm.json: fits: the all_reduce sweep at 8 ranks \(intra\) has no "
                                             r"alpha_beta fit"):
        FittedCommModel.from_dict({"fits": [fit]}, "comm.json")
