"""Output paths are checked before a command starts working, and a write that fails
half-way (a full disk) leaves nothing: one line on stderr, exit code 2."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time

import pytest

from paraplan.cli.main import main

LOG = "data/nccl-tests/05_a100_oci_bm_gpu4_1x8_all_reduce.txt"


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [entry for entry in err.splitlines() if ": error: " in entry]
    return line


def test_ingest_to_an_existing_folder(repo_root, tmp_path, capsys):
    assert main(["ingest", "--format", "nccl-tests", str(repo_root / LOG), "-o", str(tmp_path), "--no-track"]) == 2
    assert _error_line(capsys) == (
        f"paraplan ingest: error: cannot write '{tmp_path}': is an existing folder; expected a file path"
    )
    assert list(tmp_path.iterdir()) == []


def test_fit_checks_every_output_before_reading(tmp_path, capsys):
    (tmp_path / "plots").write_text("a file where the figures folder should go")
    missing_input = tmp_path / "never-read.csv"
    args = ["fit", str(missing_input), "-o", str(tmp_path / "cm.json"), "--plots", str(tmp_path / "plots"),
            "--no-track"]
    assert main(args) == 2
    assert _error_line(capsys) == (
        f"paraplan fit: error: cannot write '{tmp_path / 'plots'}': is an existing file; expected a folder"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots"]


def test_bench_refuses_a_file_as_its_folder_before_measuring(tmp_path, capsys):
    target = tmp_path / "results.csv"
    target.write_text("not a folder")
    start = time.monotonic()
    assert main(["bench", "--world-size", "2", "-o", str(target), "--no-track"]) == 2
    assert time.monotonic() - start < 5  # no rank was started
    assert _error_line(capsys) == (
        f"paraplan bench: error: cannot write '{target}': is an existing file; expected a folder")


def test_profile_to_an_existing_folder(tmp_path, capsys):
    assert main(["profile", "--model", "mlp", "-o", str(tmp_path), "--no-track"]) == 2
    assert _error_line(capsys) == (
        f"paraplan profile: error: cannot write '{tmp_path}': is an existing folder; expected a file path"
    )


def _limit_file_size(limit_bytes: int):
    """In the child: files may not grow past `limit_bytes` (writes fail with EFBIG, as
    on a full disk, instead of the process being killed by SIGXFSZ)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return apply


def test_a_write_that_fails_half_way_leaves_nothing(repo_root, tmp_path):
    out = tmp_path / "out" / "a100.csv"
    proc = subprocess.run(
        [sys.executable, "-m", "paraplan.cli.main", "ingest", "--format", "nccl-tests", str(repo_root / LOG),
         "-o", str(out), "--no-track"],
        capture_output=True, text=True, preexec_fn=_limit_file_size(1000), timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"paraplan ingest: error: cannot write '{out}': File too large; nothing was written"
    )
    assert list(out.parent.iterdir()) == []  # neither the CSV nor its temporary file


@pytest.mark.parametrize("command", ["ingest", "fit"])
def test_an_old_output_survives_a_failed_write(repo_root, tmp_path, command):
    """A rerun that fails half-way keeps the previous result whole."""
    out = tmp_path / ("a100.csv" if command == "ingest" else "cm.json")
    first = ["ingest", "--format", "nccl-tests", str(repo_root / LOG), "-o", str(tmp_path / "a100.csv")]
    assert main([*first, "--no-track"]) == 0
    if command == "fit":
        assert main(["fit", str(tmp_path / "a100.csv"), "-o", str(out), "--no-track"]) == 0
    old = out.read_bytes()
    args = first if command == "ingest" else ["fit", str(tmp_path / "a100.csv"), "-o", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "paraplan.cli.main", *args, "--no-track"],
        capture_output=True, text=True, preexec_fn=_limit_file_size(len(old) // 2), timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("File too large; nothing was written")
    assert out.read_bytes() == old
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_profile_meta_path_in_the_way_is_found_before_the_csv_is_written(repo_root, tmp_path, capsys):
    """The meta JSON goes beside the CSV; a folder in its place fails before either is written."""
    (tmp_path / "vgg.meta.json").mkdir()
    graph = repo_root / "data" / "pipedream-profiles" / "vgg-19-pbs-32.txt"
    args = ["ingest", "--format", "pipedream", str(graph), "-o", str(tmp_path / "vgg.csv"), "--no-track"]
    assert main(args) == 2
    assert _error_line(capsys) == (
        f"paraplan ingest: error: cannot write '{tmp_path / 'vgg.meta.json'}': is an existing folder; "
        "expected a file path"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vgg.meta.json"]
