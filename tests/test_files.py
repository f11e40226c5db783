"""Atomic writes: the target appears whole or not at all."""

from __future__ import annotations

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
