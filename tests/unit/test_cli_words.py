"""What the command line says back: an option is named as an option, a workflow
config key as a config key (the new-user walkthrough of 2026-11-26)."""

from __future__ import annotations

import pytest

from paraplan.cli.main import main
from paraplan.core import ConfigError


@pytest.mark.parametrize(("key", "text"), [
    ("--gpus", "option --gpus: must be >= 1, got 0"),
    ("--gpus, --global-batch-size", "options --gpus, --global-batch-size: must be >= 1, got 0"),
    ("bench.min_bytes", "config key 'bench.min_bytes': must be >= 1, got 0"),
])
def test_an_error_names_an_option_as_an_option_and_a_key_as_a_key(key, text):
    err = ConfigError(key, "must be >= 1, got 0")
    assert str(err) == text and err.reason == "must be >= 1, got 0"
    assert str(ConfigError("cluster", "x").as_option("--cluster")) == "option --cluster: x"


@pytest.mark.parametrize(("args", "line"), [
    # the check is the command's own
    (["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "0"], "option --gpus: must be >= 1, got 0"),
    # the check is the cluster loader's, which names the value `cluster`
    (["--model", "llama3-8b", "--cluster", "nope", "--gpus", "8"],
     "option --cluster: no cluster file config/clusters/nope.yaml; known clusters: dgx-a100, dgx-a100-40gb, "),
    # the model loader's, which names the value `seq_length`
    (["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-length", "100000000"],
     "option --seq-length: 100,000,000 is above 16,777,216: wider than any trained model (the widest dimensions "
     "hold a few hundred thousand)\n"),
])
def test_plan_names_the_option_the_bad_value_came_from(repo_root, tmp_path, capsys, monkeypatch, args, line):
    monkeypatch.chdir(repo_root)
    assert main(["plan", *args, "--global-batch-size", "64", "-o", str(tmp_path / "p.csv"), "--no-track"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"paraplan plan: error: {line}") and err.count("\n") == 1, err
    assert not (tmp_path / "p.csv").exists()
