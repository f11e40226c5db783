"""Shared fixtures: the repository root and ../shared (skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = REPO_ROOT.parent / "shared"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared (data and reference numbers); tests that need it skip without it."""
    if not (SHARED_DIR / "data").is_dir():
        pytest.skip(f"{SHARED_DIR} is absent: shared data and reference numbers are not available")
    return SHARED_DIR
