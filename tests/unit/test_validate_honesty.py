"""Validation told honestly: a busy machine and a profile whose layers do not add up to
its whole step are said in the CLI output and in summary.md, not only in a log."""

from __future__ import annotations

import pandas as pd
import pytest

from paraplan.profile.consistency import profile_inconsistency
from paraplan.report.summary import StageFiles, profile_section, render, validate_section
from paraplan.validate import load as load_module
from paraplan.validate.compare import LOAD_COLUMN, Measurement, validation_table
from paraplan.validate.load import LoadCheck, read_load_1m
from paraplan.validate.strategies import round_order


def _frame(other_load: float | None):
    measured = {"dp": Measurement("dp", (0.010, 0.011, 0.012)), "tp2": Measurement("tp2", (0.020,))}
    return validation_table(measured, {"dp": 0.0121, "tp2": 0.017}, other_load)


def _profile(err: float, shortest_s: float = 5e-3):
    frame = pd.DataFrame({"fwd_s": [0.01, 0.01], "bwd_s": [0.02, 0.02], "param_bytes": [4e6, 4e6]})
    return frame, {"batch_size": 32, "device": "cpu", "threads": 1, "sum_vs_whole_rel_err": err,
                   "whole_step_s": 0.095, "min_layer_step_s": shortest_s}


def test_others_load_is_the_larger_of_before_and_after_less_the_run_itself():
    # 2 cores, 2 ranks x 1 thread: after = 2.3 is the run's 2 threads + 0.3 of others
    check = LoadCheck(load_before_1m=0.1, load_after_1m=2.3, cores=2, own_threads=2)
    assert check.other_load_per_core == pytest.approx(0.15) and not check.busy and check.warning() is None
    busy = LoadCheck(load_before_1m=6.0, load_after_1m=7.9, cores=2, own_threads=2)
    assert busy.other_load_per_core == pytest.approx(3.0) and busy.busy
    assert busy.warning().startswith("warning: the machine was busy (load average 6.00 before, 7.90 after")
    assert "other processes 3.00 per core" in busy.warning()


def test_the_load_warning_appears_when_the_load_is_faked_high(monkeypatch):
    monkeypatch.setattr(load_module.os, "getloadavg", lambda: (8.0, 7.0, 6.0))
    check = LoadCheck(read_load_1m(), read_load_1m(), cores=2, own_threads=2)
    assert check.busy and "rerun on an idle machine" in check.warning()
    text = "\n".join(validate_section({"mlp": _frame(check.other_load_per_core)}))
    assert "**Warning: `mlp` was measured on a busy machine**: other processes' load 4.00 per core" in text


def test_an_idle_measurement_gets_no_warning_and_the_table_carries_the_load():
    frame = _frame(0.05)
    assert list(frame[LOAD_COLUMN]) == [0.05, 0.05]
    assert "Warning" not in "\n".join(validate_section({"mlp": frame}))
    assert LOAD_COLUMN not in _frame(None)  # older files without it still render
    assert "Warning" not in "\n".join(validate_section({"mlp": _frame(None)}))


def test_an_inconsistent_profile_is_flagged_in_the_summary():
    profiles = {"mlp": _profile(-0.36), "gpt": _profile(0.05)}
    section = "\n".join(profile_section(profiles))
    assert "| -36.0% (inconsistent) |" in section and "| 5.0% |" in section
    assert ("**Warning: profile `mlp`**: the layers sum to -36% of the whole step (95 ms), beyond +-15% (the "
            "machine's load probably changed while profiling)") in section
    assert "profile `gpt`" not in section
    # and beside the validation that used it
    text = render(StageFiles({}, {}, profiles, {}, {}, {"mlp": _frame(0.0)}))
    validate_part = text[text.index("## validate"):]
    assert "**Warning: profile `mlp`**" in validate_part


def test_short_layers_are_named_as_the_likely_reason():
    assert "its shortest layer takes 0.2 ms, where per-layer timing overhead counts" in profile_inconsistency(
        _profile(0.4, shortest_s=2e-4)[1])
    assert profile_inconsistency({"sum_vs_whole_rel_err": 0.149}) is None
    assert profile_inconsistency({"method": "analytic"}) is None


def test_strategies_are_timed_round_robin():
    names = ("dp", "dp_overlap", "pp_1f1b", "tp2")
    orders = [round_order(names, i) for i in range(5)]
    assert orders[0] == names and orders[1] == ("dp_overlap", "pp_1f1b", "tp2", "dp") and orders[4] == names
    for place in range(len(names)):  # over len(names) rounds every strategy holds every place once
        assert sorted(o[place] for o in orders[:4]) == sorted(names)
