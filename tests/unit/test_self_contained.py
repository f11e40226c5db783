"""The repository is complete on its own: no tracked file points at a folder that sits
beside the checkout (the published data is in data/, the design notes in docs/)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

FORBIDDEN = ("../shared", "shared/data/", "shared/reference", "shared/seeds")


def tracked_files(repo_root: Path) -> list[Path]:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    out = subprocess.run([git, "ls-files", "-z"], cwd=repo_root, capture_output=True, timeout=60)
    if out.returncode != 0:
        pytest.skip(f"{repo_root} is not a git checkout")
    return [repo_root / name for name in out.stdout.decode().split("\0") if name]


def outside_references(paths: list[Path], root: Path) -> list[str]:
    """`file:line: pattern` for every line that names a path outside the repository."""
    hits = []
    for path in paths:
        if not path.is_file():  # tracked but deleted in this working tree
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            hits += [f"{path.relative_to(root)}:{number}: {p}" for p in FORBIDDEN if p in line]
    return hits


def test_no_tracked_file_points_beside_the_checkout(repo_root):
    this = Path(__file__).resolve()
    files = [p for p in tracked_files(repo_root) if p.resolve() != this]
    assert len(files) > 100  # the listing worked
    assert outside_references(files, repo_root) == []


def test_a_path_beside_the_checkout_is_found(tmp_path):
    (tmp_path / "a.md").write_text("fine\nsee ../shared/data/x.txt\n")
    (tmp_path / "b.py").write_text('ROOT.parent / "shared/reference/y.csv"\n')
    assert outside_references([tmp_path / "a.md", tmp_path / "b.py", tmp_path / "gone"], tmp_path) == [
        "a.md:2: ../shared", "a.md:2: shared/data/", "b.py:1: shared/reference"]
