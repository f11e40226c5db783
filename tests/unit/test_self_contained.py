"""The repository is complete on its own: no tracked file points at a folder that sits
beside the checkout or cites a document a user of the repository does not have (the
published data is in data/, the design notes in docs/; papers are cited by name)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

# the sibling folder's path, spelt so that this file does not match its own search
SIBLING = "/".join(("..", "shared"))
# what each pattern catches, by the text it reports
FORBIDDEN = {
    SIBLING: re.compile(re.escape(SIBLING)),
    "shared/<folder>": re.compile(r"shared/(data|reference|seeds)\b"),
    "DESIGN.md": re.compile(r"\bDESIGN\.md"),
    "STYLE.md": re.compile(r"\bSTYLE\.md"),
    "seed NNN": re.compile(r"\b[Ss]eeds? 0\d\d\b"),
}


def tracked_files(repo_root: Path) -> list[Path]:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    out = subprocess.run([git, "ls-files", "-z"], cwd=repo_root, capture_output=True, timeout=60)
    if out.returncode != 0:
        pytest.skip(f"{repo_root} is not a git checkout")
    return [repo_root / name for name in out.stdout.decode().split("\0") if name]


def outside_references(paths: list[Path], root: Path) -> list[str]:
    """`file:line: what` for every line that names a path outside the repository or a
    document the repository does not hold."""
    hits = []
    for path in paths:
        if not path.is_file():  # tracked but deleted in this working tree
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            hits += [f"{path.relative_to(root)}:{number}: {what}" for what, pattern in FORBIDDEN.items()
                     if pattern.search(line)]
    return hits


def test_no_tracked_file_points_beside_the_checkout(repo_root):
    this = Path(__file__).resolve()
    files = [p for p in tracked_files(repo_root) if p.resolve() != this]
    assert len(files) > 100  # the listing worked
    assert outside_references(files, repo_root) == []


def test_a_path_beside_the_checkout_is_found(tmp_path):
    (tmp_path / "a.md").write_text(f"fine\nsee {SIBLING}/data/x.txt\n")
    (tmp_path / "b.py").write_text('ROOT.parent / "shared/reference/y.csv"  # DESIGN.md\n')
    (tmp_path / "c.md").write_text("as seed 001 draws; tests/data/seed001_schedules.json is ours\n")
    paths = [tmp_path / "a.md", tmp_path / "b.py", tmp_path / "c.md", tmp_path / "gone"]
    assert outside_references(paths, tmp_path) == [
        f"a.md:2: {SIBLING}", "a.md:2: shared/<folder>", "b.py:1: shared/<folder>", "b.py:1: DESIGN.md",
        "c.md:1: seed NNN"]
