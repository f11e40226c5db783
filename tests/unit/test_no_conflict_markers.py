"""No tracked text file carries a merge's conflict markers (a merged file that was added
unresolved would otherwise reach the docs site and the code unnoticed)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.MULTILINE)
TEXT = (".py", ".md", ".yaml", ".yml", ".toml", ".csv", ".json", ".txt", ".cfg", ".smk", "Snakefile")


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        names = out.splitlines()
    except (OSError, subprocess.CalledProcessError):  # an sdist without git: walk the tree
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    return [ROOT / n for n in names if n.endswith(TEXT)]


def test_the_marker_pattern_finds_a_conflict_and_nothing_else():
    conflicted = "a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> branch\n"
    assert len(MARKER.findall(conflicted)) == 3
    assert not MARKER.findall("| a | b |\n|===|===|\n======== heading underline\n")


def test_no_tracked_file_has_conflict_markers():
    found = [f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}"
             for path in _tracked() if path.exists()
             for text in [path.read_text(encoding="utf-8", errors="replace")]
             for m in MARKER.finditer(text)]
    assert found == []
