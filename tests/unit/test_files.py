"""Atomic writes: the target appears whole or not at all."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pandas as pd
import pytest

from paraplan import files


def test_write_csv_then_read_back(tmp_path):
    frame = pd.DataFrame({"size_bytes": [8, 16], "time_us": [1.5, 2.5]})
    target = tmp_path / "sub" / "out.csv"
    files.write_csv(target, frame)
    assert target.read_text() == "size_bytes,time_us\n8,1.5\n16,2.5\n"
    assert [p.name for p in target.parent.iterdir()] == ["out.csv"]


def test_failed_write_leaves_nothing_and_keeps_old_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), files.atomic_open(target) as handle:
        handle.write("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_keyboard_interrupt_leaves_no_partial_file(tmp_path):
    target = tmp_path / "new.json"
    with pytest.raises(KeyboardInterrupt), files.atomic_open(target) as handle:
        handle.write("{")
        raise KeyboardInterrupt
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_write_json_round_trip(tmp_path):
    import json

    files.write_json(tmp_path / "a.json", {"b": [1, 2]})
    assert json.loads((tmp_path / "a.json").read_text()) == {"b": [1, 2]}


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_written_files_honour_the_umask(tmp_path, umask, mode):
    import os
    import stat

    previous = os.umask(umask)
    try:
        files.write_text(tmp_path / "a.txt", "x")
        with files.atomic_path(tmp_path / "fig.png") as tmp:
            tmp.write_bytes(b"png")
    finally:
        os.umask(previous)
    for name in ("a.txt", "fig.png"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name


def test_json_refuses_nan_rather_than_writing_invalid_json(tmp_path):
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        files.write_json(tmp_path / "a.json", {"gmae": float("nan")})
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_is_an_output_error_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "out.csv"
    target.write_text("old")
    with pytest.raises(files.OutputError) as info, files.atomic_open(target) as handle:
        handle.write("half")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(info.value) == f"cannot write '{target}': No space left on device; nothing was written"
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]


def test_a_folder_in_the_way_of_a_write_is_an_output_error(tmp_path):
    (tmp_path / "blocker").write_text("a file where a folder should be")
    with pytest.raises(files.OutputError) as info:
        files.write_text(tmp_path / "blocker" / "deeper" / "out.csv", "x")
    blocker = tmp_path / "blocker"
    assert str(info.value) == f"cannot write '{blocker / 'deeper' / 'out.csv'}': '{blocker}' is a file, not a folder"


def unwritable_folder(tmp_path):
    """A folder no file can be created in: read-only bits, or (as root, whom the bits do
    not stop) /sys, where even root cannot create files."""
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir(mode=0o555)
        return folder
    try:
        files.check_outputs(folders=["/sys"])
    except files.OutputError:
        return Path("/sys")
    pytest.skip("running as root without a folder that refuses new files")


def test_check_outputs_names_each_problem_in_one_line(tmp_path):
    folder = tmp_path / "existing"
    folder.mkdir()
    a_file = tmp_path / "a.csv"
    a_file.write_text("x")
    before = sorted(tmp_path.iterdir())
    with pytest.raises(files.OutputError) as info:
        files.check_outputs(files=[folder])
    assert str(info.value) == f"cannot write '{folder}': is an existing folder; expected a file path"
    with pytest.raises(files.OutputError) as info:
        files.check_outputs(folders=[a_file])
    assert str(info.value) == f"cannot write '{a_file}': is an existing file; expected a folder"
    with pytest.raises(files.OutputError) as info:
        files.check_outputs(files=[a_file / "sub" / "out.csv"])
    assert str(info.value) == f"cannot write '{a_file / 'sub' / 'out.csv'}': '{a_file}' is a file, not a folder"
    ro = unwritable_folder(tmp_path)
    with pytest.raises(files.OutputError, match=rf"^cannot write '{ro}/new/out\.csv': cannot create files in '{ro}': "):
        files.check_outputs(files=[ro / "new" / "out.csv"])
    # fine paths pass, and checking leaves nothing behind
    files.check_outputs(files=[a_file, tmp_path / "new" / "b.csv", None], folders=[folder, tmp_path / "x", None])
    assert sorted(tmp_path.iterdir()) == before
    assert list(folder.iterdir()) == []
