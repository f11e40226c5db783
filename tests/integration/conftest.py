"""Integration tests: real ranks, subprocesses, workflow runs, MLflow stores, the
wheel. `pytest` alone runs tests/unit; `pytest tests` (what .ci/run does) runs these
too. Each test here carries the `integration` marker, so `-m integration` selects them
from any path."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)
