"""Atomic file output: write to a temporary file beside the target, then rename.

A crash or Ctrl-C never leaves a half-written result behind. The file gets the mode
`open()` would give it (0666 less the umask: 0644 on the usual umask 022), not
mkstemp's private 0600, so teammates and a tracking server running as another user
can read results and their MLflow copies.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def _umask() -> int:
    # os.umask both reads and sets; put the value straight back
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; on success rename it onto `path`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    with atomic_path(path) as tmp, open(tmp, mode) as handle:
        yield handle


def write_text(path: str | Path, text: str) -> None:
    with atomic_open(path) as handle:
        handle.write(text)


def write_json(path: str | Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_csv(path: str | Path, frame: Any) -> None:
    """Write a pandas DataFrame (header row, no index) atomically."""
    with atomic_open(path, "w") as handle:
        frame.to_csv(handle, index=False, lineterminator="\n")
