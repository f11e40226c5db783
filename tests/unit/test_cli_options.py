"""One option vocabulary across stages: -o/--output, --plots DIR, --cluster NAME with
--shapes NxG, units in names, the glossary's names; old spellings work for one release
with a warning; help shows no empty defaults and keeps examples on their own lines."""

from __future__ import annotations

import pytest

from paraplan.cli.main import build_parser, main


def _help(command: str) -> str:
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]
    return sub.format_help()


@pytest.mark.parametrize("command", ["bench", "fit", "ingest", "profile", "simulate", "plan", "validate",
                                     "report", "export"])
def test_help_has_no_empty_defaults_and_one_output_option(command):
    text = _help(command)
    assert "(default: None)" not in text and "(default: )" not in text and "(default: False)" not in text
    assert "-o PATH, --output PATH" in text
    for old in ("--out ", "--out-dir", "--figures", "--cluster-file", "--timeout "):
        assert old not in text, (command, old)


def test_examples_stay_on_their_own_lines():
    text = _help("plan")
    lines = text.splitlines()
    assert "Examples:" in lines
    examples = [line for line in lines if line.strip().startswith("paraplan plan ")]
    assert len(examples) == 6  # three transformer plans, two profile plans, one study
    assert "--shapes NxG[,NxG]" in text and "--cluster NAME|FILE" in text


def test_old_spellings_work_with_a_warning(tmp_path, capsys, data_dir):
    log = data_dir / "nccl-tests/04_gh200_alps_2node_1gpu_all_reduce.txt"
    assert main(["ingest", "--format", "nccl-tests", str(log), "--out", str(tmp_path / "a.csv"), "--no-track"]) == 0
    assert main(["fit", str(tmp_path / "a.csv"), "--out", str(tmp_path / "cm.json"), "--no-track"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: --out is deprecated, use -o/--output") == 2
    assert (tmp_path / "cm.json").is_file()
    profile = data_dir / "pipedream-profiles/vgg-19-pbs-32.txt"
    assert main(["plan", "--profile", str(profile), "--cluster", "2x8", "--cluster-file", "dgx1-v100",
                 "--gbs", "32", "--pbs", "32", "--mbs", "32", "--optimizer-factor", "2", "--jobs", "1",
                 "-o", str(tmp_path / "vgg.csv"), "--no-track"]) == 0
    err = capsys.readouterr().err
    assert "--cluster 2x8 is deprecated, use --shapes 2x8" in err
    assert "--cluster-file is deprecated, use --cluster" in err
    for old, new_name in (("--gbs", "--global-batch-sizes"), ("--pbs", "--profile-batch-size"),
                          ("--mbs", "--min-micro-batch-size"), ("--optimizer-factor", "--model-state-factor")):
        assert f"{old} is deprecated, use {new_name}" in err
    new = tmp_path / "vgg_new.csv"
    assert main(["plan", "--profile", str(profile), "--cluster", "dgx1-v100", "--shapes", "2x8",
                 "--global-batch-sizes", "32", "--profile-batch-size", "32", "--min-micro-batch-size", "32",
                 "--model-state-factor", "2", "--jobs", "1", "-o", str(new), "--no-track"]) == 0
    assert "deprecated" not in capsys.readouterr().err
    # the same plan either way (planning_time_s aside)
    old_row = (tmp_path / "vgg.csv").read_text().splitlines()[1].split(",")
    new_row = new.read_text().splitlines()[1].split(",")
    assert old_row[:5] == new_row[:5]


def test_missing_output_is_a_one_line_usage_error(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["simulate", "--study", "schedules"])
    assert stop.value.code == 2
    assert "required: -o/--output" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "line"), [
    (["plan", "--dtype", "fp9", "--model", "gpt3-13b"],
     "paraplan plan: error: argument --dtype: invalid choice: 'fp9' (choose from 'bf16', 'fp16', 'fp8', 'fp32') "
     "(see paraplan plan --help)"),
    (["plan", "--model", "gpt3-13b", "--bogus"],
     "paraplan plan: error: unrecognized arguments: --bogus (see paraplan plan --help)"),
    (["simulate", "--study", "schedules"],
     "paraplan simulate: error: the following arguments are required: -o/--output (see paraplan simulate --help)"),
    (["plsn"], "paraplan: error: argument <command>: invalid choice: 'plsn' (choose from 'bench', 'bench-figures', "
               "'ingest', 'fit', 'profile', 'export', 'simulate', 'plan', 'calibrate', 'predict', 'validate', "
               "'report', 'track') (see paraplan --help)"),
])
def test_a_bad_command_line_is_one_error_line_without_the_usage_block(capsys, argv, line):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err == line + "\n"
