"""One option vocabulary across stages: -o/--output, --plots DIR, --cluster NAME with
--shape NxG, units in names; old spellings work for one release with a warning; help
shows no empty defaults and keeps examples on their own lines; a progress line on a
terminal and none in a log."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

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
    assert len(examples) == 3
    assert "--shape NxG" in text and "--cluster NAME|FILE" in text


def test_old_spellings_work_with_a_warning(tmp_path, capsys, shared_dir):
    log = shared_dir / "data/nccl-tests/04_gh200_alps_2node_1gpu_all_reduce.txt"
    assert main(["ingest", "--format", "nccl-tests", str(log), "--out", str(tmp_path / "a.csv"), "--no-track"]) == 0
    assert main(["fit", str(tmp_path / "a.csv"), "--out", str(tmp_path / "cm.json"), "--no-track"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: --out is deprecated, use -o/--output") == 2
    assert (tmp_path / "cm.json").is_file()
    profile = shared_dir / "data/pipedream-profiles/vgg-19-pbs-32.txt"
    assert main(["plan", "--profile", str(profile), "--cluster", "2x8", "--cluster-file", "dgx1-v100",
                 "--gbs", "32", "--jobs", "1", "-o", str(tmp_path / "vgg.csv"), "--no-track"]) == 0
    err = capsys.readouterr().err
    assert "--cluster 2x8 is deprecated, use --shape 2x8" in err
    assert "--cluster-file is deprecated, use --cluster" in err
    new = tmp_path / "vgg_new.csv"
    assert main(["plan", "--profile", str(profile), "--cluster", "dgx1-v100", "--shape", "2x8", "--gbs", "32",
                 "--jobs", "1", "-o", str(new), "--no-track"]) == 0
    assert "deprecated" not in capsys.readouterr().err
    # the same plan either way (planning_time_s aside)
    old_row = (tmp_path / "vgg.csv").read_text().splitlines()[1].split(",")
    new_row = new.read_text().splitlines()[1].split(",")
    assert old_row[:5] == new_row[:5]


def test_missing_output_is_a_one_line_usage_error(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["simulate", "--experiment", "schedules"])
    assert stop.value.code == 2
    assert "required: -o/--output" in capsys.readouterr().err


def _stderr_of(args: list[str], cwd, terminal: bool) -> str:
    env = {**os.environ, "COLUMNS": "120"}
    if not terminal:
        out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return out.stderr
    controller, worker = pty.openpty()
    # a terminal 120 columns wide (a fresh pty has no size)
    fcntl.ioctl(worker, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=worker)
    os.close(worker)
    chunks = []
    while True:
        try:
            data = os.read(controller, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    os.close(controller)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_progress_line_on_a_terminal_only(tmp_path):
    args = [sys.executable, "-m", "paraplan", "simulate", "--experiment", "distir_fig4", "-o", "sim",
            "--repeats", "1", "--no-plots", "--no-track"]
    on_terminal = _stderr_of(args, tmp_path, terminal=True)
    assert "simulate distir_fig4" in on_terminal and "config/s" in on_terminal
    assert "/222 [" in on_terminal  # the grid's configurations, both modes
    in_a_log = _stderr_of(args, tmp_path, terminal=False)
    assert "/222 [" not in in_a_log and "distir_fig4: 222 configurations" in in_a_log
