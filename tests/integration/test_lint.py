"""The code and the workflow are lint-clean (ruff, vulture, `snakemake --lint`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _tool(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(found).exists():
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return found


def test_ruff_is_clean(repo_root):
    out = subprocess.run([_tool("ruff"), "check", "src", "tests", "benchmarks"], cwd=repo_root,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_vulture_finds_no_unused_code(repo_root):
    """pyproject.toml's [tool.vulture]: paths, confidence and .ci/vulture_whitelist.py."""
    out = subprocess.run([_tool("vulture")], cwd=repo_root, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_snakemake_lint_is_clean(repo_root):
    out = subprocess.run([_tool("snakemake"), "--lint", "--nolock"], cwd=repo_root,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_only_track_imports_mlflow(repo_root):
    offenders = [
        str(path.relative_to(repo_root))
        for path in (repo_root / "src/paraplan").rglob("*.py")
        if path.name != "track.py"
        and any(line.strip().startswith(("import mlflow", "from mlflow")) for line in path.read_text().splitlines())
    ]
    assert offenders == []


def test_workflow_files_import_no_torch_or_mlflow(repo_root):
    files = [repo_root / "Snakefile", *sorted((repo_root / "workflow/rules").glob("*.smk"))]
    for path in files:
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith(("import ", "from ")) and not line.startswith((" ", "\t")):
                assert "torch" not in stripped and "mlflow" not in stripped, f"{path.name}: {stripped}"
