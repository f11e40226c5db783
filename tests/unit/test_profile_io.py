"""Profile CSV + meta JSON: exact round trip, optional columns, located errors."""

from __future__ import annotations

import json

import pytest

from paraplan.core import InputFileError, LayerProfile, ModelProfile
from paraplan.profile.io import meta_path, read_profile, write_profile

HEADER = "layer,name,fwd_s,bwd_s,activation_bytes,param_bytes\n"


def _profile() -> ModelProfile:
    layers = (
        LayerProfile("fc0", 0.001, 0.002, 4096.0, 1052672.0, fwd_fixed_s=1e-5, bwd_fixed_s=2e-5, flops=3.3e7),
        LayerProfile("fc1", 1 / 3, 0.1, 1.5, 0.0, flops=1e3),
    )
    return ModelProfile("mlp", 32, layers, meta={"device": "cpu", "threads": 1, "model_settings": {"layers": 2}})


def test_round_trip_is_exact(tmp_path):
    original = _profile()
    csv_path, mpath = write_profile(original, tmp_path / "mlp.csv")
    assert mpath == tmp_path / "mlp.meta.json" == meta_path(csv_path)
    back = read_profile(csv_path)
    assert back.layers == original.layers
    assert back.batch_size == 32 and back.name == "mlp"
    meta = json.loads(mpath.read_text())
    assert meta["threads"] == 1 and meta["model_settings"] == {"layers": 2}
    assert csv_path.read_text().splitlines()[0] == (
        "layer,name,fwd_s,bwd_s,activation_bytes,param_bytes,fwd_fixed_s,bwd_fixed_s,flops")


def test_optional_columns_only_when_used(tmp_path):
    profile = ModelProfile("p", 4, (LayerProfile("a", 1.0, 2.0, 3.0, 4.0),))
    csv_path, _ = write_profile(profile, tmp_path / "p.csv")
    assert csv_path.read_text() == HEADER + "0,a,1,2,3,4\n"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("0,a,1,2,3", "expected 6 fields"),
        ("0,a,x,2,3,4", r"'fwd_s': expected a time in seconds \(a number >= 0 and <= 100000\), got 'x'$"),
        ("0,a,-1,2,3,4", r"'fwd_s': expected a time in seconds .*, got '-1': negative$"),
        ("0,a,1,nan,3,4", r"'bwd_s': expected a time in seconds .*, got 'nan': not a finite number$"),
        ("0,a,1e300,2,3,4", r"'fwd_s': .*, got '1e300': above 1e5 s \(28 h\) for one layer; wrong unit\?$"),
        ("1,a,1,2,3,4", "column 'layer': expected 0"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, row, message):
    path = tmp_path / "bad.csv"
    path.write_text(HEADER + row + "\n")
    with pytest.raises(InputFileError, match=message) as info:
        read_profile(path, batch_size=8)
    assert info.value.line == 2 and info.value.path == str(path)


def test_missing_column_and_missing_meta(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("layer,name,fwd_s\n0,a,1\n")
    with pytest.raises(InputFileError, match="missing column"):
        read_profile(path, batch_size=1)
    path.write_text(HEADER + "0,a,1,2,3,4\n")
    with pytest.raises(InputFileError, match=r"meta\.json"):
        read_profile(path)


def test_meta_keeps_profile_name_and_model_apart(tmp_path):
    profile = ModelProfile("gpt-small", 8, (LayerProfile("a", 1.0, 2.0, 3.0, 4.0),), meta={"model": "gpt"})
    csv_path, mpath = write_profile(profile, tmp_path / "gpt-small.csv")
    meta = json.loads(mpath.read_text())
    assert (meta["name"], meta["model"], meta["batch_size"], meta["num_layers"]) == ("gpt-small", "gpt", 8, 1)
    assert read_profile(csv_path).name == "gpt-small"
