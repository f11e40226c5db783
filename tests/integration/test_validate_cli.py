"""`paraplan validate` end to end on a tiny MLP (real 2-rank gloo runs), and its
errors for bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from paraplan.cli.main import main
from paraplan.comm.fit_sweep import fit_sweep
from paraplan.comm.model import fits_document
from paraplan.core import LayerProfile, ModelProfile
from paraplan.profile.io import meta_path, write_profile
from paraplan.validate import COLUMNS, STRATEGIES
from paraplan.validate import load as load_module
from paraplan.validate.compare import LOAD_COLUMN

SETTINGS = {"num_layers": 4, "input_dim": 32, "hidden_dim": 64, "output_dim": 16, "bias": True}


def _inputs(tmp_path, settings=SETTINGS, meta=None):
    layer = LayerProfile("linear", 2e-4, 4e-4, activation_bytes=8 * 64 * 4, param_bytes=64 * 65 * 4,
                         fwd_fixed_s=5e-5, bwd_fixed_s=1e-4)
    profile = ModelProfile("tiny", 8, (layer,) * settings["num_layers"],
                           meta={"model": "mlp", "model_settings": settings, "threads": 1, "method": "torch",
                                 **(meta or {})})
    csv_path, _ = write_profile(profile, tmp_path / "tiny.csv")
    sizes = 2.0 ** np.arange(3, 21)
    entries = fit_sweep("all_reduce", 2, 1, sizes, 60e-6 + sizes / 1e9)
    entries += fit_sweep("broadcast", 2, 1, sizes, 30e-6 + sizes / 2e9)
    comm = tmp_path / "comm_model.json"
    comm.write_text(json.dumps(fits_document(entries)))
    return csv_path, comm


def test_tiny_real_validation_writes_the_table_and_figure(tmp_path, capsys):
    profile, comm = _inputs(tmp_path)
    out = tmp_path / "validation" / "tiny.csv"
    code = main(["validate", "--profile", str(profile), "--comm-model", str(comm), "--global-batch-size", "8",
                 "--num-microbatches", "2", "--steps", "3", "--warmup", "1", "--threads", "1",
                 "-o", str(out), "--plots", str(tmp_path / "fig"), "--no-track"])
    assert code == 0
    table = pd.read_csv(out)
    assert tuple(table.columns) == (*COLUMNS, LOAD_COLUMN)
    assert tuple(table["strategy"]) == STRATEGIES
    assert (table["measured_p10_s"] <= table["measured_s"]).all()
    assert (table["measured_s"] <= table["measured_p90_s"]).all()
    assert (table["measured_s"] > 0).all() and (table["predicted_s"] > 0).all()
    np.testing.assert_allclose(table["rel_err"], table["predicted_s"] / table["measured_s"] - 1)
    assert (tmp_path / "fig" / "tiny.png").is_file() and (tmp_path / "fig" / "tiny.pdf").is_file()
    out = capsys.readouterr().out
    assert "|rel_err| median" in out
    assert "(tp2's activations), " in out and "tp2 charged the mean" in out  # the all-reduce calibration


def test_a_busy_machine_and_an_inconsistent_profile_are_warned_in_the_output(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(load_module.os, "getloadavg", lambda: (9.0, 9.0, 9.0))  # far above any core count
    profile, comm = _inputs(tmp_path, meta={"sum_vs_whole_rel_err": -0.4, "whole_step_s": 0.01,
                                            "min_layer_step_s": 6e-4})
    out = tmp_path / "v.csv"
    code = main(["validate", "--profile", str(profile), "--comm-model", str(comm), "--global-batch-size", "8",
                 "--num-microbatches", "2", "--steps", "1", "--warmup", "0", "--threads", "1",
                 "--strategies", "dp", "-o", str(out), "--no-track"])
    assert code == 0
    captured = capsys.readouterr()
    assert "paraplan validate: warning: the machine was busy (load average 9.00 before, 9.00 after" in captured.err
    assert ("paraplan validate: warning: profile tiny: the layers sum to -40% of the whole step (10 ms), beyond "
            "+-15% (its shortest layer takes 0.6 ms, where per-layer timing overhead counts") in captured.err
    assert "load average 9.00 before" in captured.out  # beside the table's median and max
    assert pd.read_csv(out)[LOAD_COLUMN].iloc[0] > 1


def test_missing_meta_names_the_file(tmp_path, capsys):
    profile, comm = _inputs(tmp_path)
    meta_path(profile).unlink()
    code = main(["validate", "--profile", str(profile), "--comm-model", str(comm),
                 "-o", str(tmp_path / "v.csv"), "--no-track"])
    assert code == 2
    assert "tiny.meta.json: missing" in capsys.readouterr().err
    assert not (tmp_path / "v.csv").exists()


def test_profile_of_another_model_is_refused(tmp_path, capsys):
    profile, comm = _inputs(tmp_path)
    meta = json.loads(meta_path(profile).read_text())
    meta["model_settings"]["num_layers"] = 6
    meta_path(profile).write_text(json.dumps(meta))
    code = main(["validate", "--profile", str(profile), "--comm-model", str(comm),
                 "-o", str(tmp_path / "v.csv"), "--no-track"])
    assert code == 2
    assert "4 layers, but the model 'mlp'" in capsys.readouterr().err


def test_unknown_strategy_lists_the_known_ones(tmp_path, capsys):
    profile, comm = _inputs(tmp_path)
    code = main(["validate", "--profile", str(profile), "--comm-model", str(comm), "--strategies", "dp,zb",
                 "-o", str(tmp_path / "v.csv"), "--no-track"])
    assert code == 2
    assert "unknown value 'zb'; expected one of dp, dp_overlap" in capsys.readouterr().err
