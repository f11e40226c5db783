"""Shared fixtures: the repository root, ../shared (skipped when absent) and a fresh
MLflow store."""

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


@pytest.fixture()
def store(tmp_path, monkeypatch) -> str:
    """A SQLite MLflow store in a fresh working directory, with the job tags a
    Snakemake invocation would set."""
    from paraplan import track

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv(track.ENV_INVOCATION, "inv-123")
    monkeypatch.setenv(track.ENV_CONFIG_DIGEST, "abcd")
    return uri
