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


def test_predict_warns_once_when_it_reprices_a_plan_with_another_calibration(repo_root, tmp_path, capsys,
                                                                             monkeypatch):
    from paraplan.predict.calibration import load_calibration

    monkeypatch.chdir(repo_root)
    plans, out = tmp_path / "plans.csv", tmp_path / "out.csv"
    assert main(["plan", "--model", "gpt3-125m", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "64",
                 "--top-k", "2", "--calibration", "a100-vtrain", "-o", str(plans), "--no-track"]) == 0
    planned, shipped = load_calibration("a100-vtrain").label, load_calibration("h100-transfer").label
    capsys.readouterr()
    assert main(["predict", str(plans), "--cluster", "dgx-h100", "-o", str(out), "--no-track"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [
        f"paraplan predict: warning: {plans}: its calibration column says its rows were priced with {planned}; this "
        f"prediction uses {shipped}, so its figures may differ from the table's; to re-price with the table's, give "
        "--calibration a100-vtrain"]
    # with the plan's own calibration: no warning
    assert main(["predict", str(plans), "--cluster", "dgx-h100", "--calibration", "a100-vtrain", "-o", str(out),
                 "--no-track"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_the_warning_names_a_calibration_it_cannot_find_by_its_file():
    from paraplan.cli.predict import other_calibration_warning

    assert other_calibration_warning("t.csv", ["h100-transfer@8bc98a0d", ""], "h100-transfer@8bc98a0d") is None
    assert other_calibration_warning("t.csv", ["mine@1234abcd", "mine@1234abcd", "x@0", "y@1", "z@2"], "used@5") == (
        "t.csv: its calibration column says its rows were priced with mine@1234abcd (and 3 other(s): x@0, y@1 ...); "
        "this prediction uses used@5, so its figures may differ from the table's; to re-price with the table's, give "
        "--calibration <file> (the file of calibration 'mine' that `paraplan calibrate` wrote)")


def test_track_says_the_background_logger_logged_what_it_waited_for(tmp_path, capsys):
    """`paraplan track` right after a command: the command's background logger holds its
    record while it logs it, then removes it; track waits, finds it gone, and says who
    logged it (it said "logged 0 MLflow run(s)")."""
    import fcntl
    import threading

    spool = tmp_path / "runs"
    spool.mkdir()
    record = spool / "1795688252256-20756-1bc91173.json"
    record.write_text("{}")
    held = open(record)  # the background logger's lock  # noqa: SIM115
    fcntl.flock(held, fcntl.LOCK_EX)

    def logger_finishes() -> None:
        record.unlink()  # logged: removed, then unlocked
        held.close()

    timer = threading.Timer(0.3, logger_finishes)
    timer.start()
    assert main(["track", "--spool", str(spool)]) == 0
    timer.join()
    assert capsys.readouterr().err == ("paraplan track: 0 pending, 1 already logged by the background logger "
                                       "(this pass waited for it)\n")


def test_track_with_an_empty_spool_says_every_run_there_is_logged(tmp_path, capsys):
    assert main(["track", "--spool", str(tmp_path)]) == 0
    assert capsys.readouterr().err == (f"paraplan track: 0 pending in {tmp_path}: every run recorded there is already "
                                       "logged (each command's background logger logs its run when the command "
                                       "ends)\n")


def test_a_workflow_config_key_is_named_with_the_file_it_was_given_in(repo_root, tmp_path, monkeypatch, capsys):
    """Snakemake merges config/config.yaml, the --configfile files and --config: the
    error names the key and which of them gave it."""
    import yaml

    from paraplan import workflow_env

    monkeypatch.chdir(repo_root)
    mine = tmp_path / "mine.yaml"
    mine.write_text("plan:\n  llm:\n    my.model:\n      cluster: nope\n")
    config = yaml.safe_load((repo_root / "config/config.yaml").read_text())
    workflow_env.upgrade_config(config, str(repo_root / "workflow/schemas/config.schema.yaml"))
    entry = next(iter(config["plan"]["llm"].values()))
    config["plan"]["llm"] = {"my.model": {**entry, "cluster": "nope"}}  # an entry name with a dot
    config["bench"].update(min_bytes=4096, max_bytes=1024)  # as from --config
    with pytest.raises(SystemExit):
        workflow_env.check_config(config, local=False, configfiles=["config/config.yaml", mine])
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(
        "paraplan: error: config key 'plan.llm.my.model.cluster' in mine.yaml: no cluster file "
        "config/clusters/nope.yaml; known clusters: dgx-a100, "), lines
    # the default file holds bench.min_bytes too, with another value: --config gave this one
    assert lines[1] == ("paraplan: error: config key 'bench.min_bytes' in --config: 4096 is above bench.max_bytes "
                        "(1024); expected min_bytes <= max_bytes")
