"""PARAPLAN_TRACKING turns tracking on or off; a value that is neither (a typo such as
`of`) is one error naming the variable, where it used to track as if it said on."""

import pytest

from paraplan.cli.main import main
from paraplan.core import TrackingError
from paraplan.track import tracking_enabled


@pytest.mark.parametrize(("value", "enabled"), [("off", False), ("OFF", False), ("0", False), ("no", False),
                                                ("false", False), ("on", True), ("1", True), ("yes", True),
                                                ("", True)])
def test_on_and_off_spellings(monkeypatch, value, enabled):
    monkeypatch.setenv("PARAPLAN_TRACKING", value)
    assert tracking_enabled() is enabled


def test_a_misspelt_value_is_one_error_and_writes_nothing(monkeypatch, tmp_path, capsys, repo_root):
    monkeypatch.setenv("PARAPLAN_TRACKING", "of")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///x.db")
    with pytest.raises(TrackingError):
        tracking_enabled()
    out = tmp_path / "p.csv"
    assert main(["predict", str(repo_root / "config/runs/llm_a100.csv"), "--cluster", "dgx-a100", "-o",
                 str(out)]) == 2
    assert capsys.readouterr().err == ("paraplan predict: error: MLflow tracking store 'sqlite:///x.db': "
                                       "PARAPLAN_TRACKING='of': expected on or off (also 1/0, true/false, yes/no)\n")
    assert not out.exists()
