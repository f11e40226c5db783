"""Atomic file output: write to a temporary file beside the target, then rename.

A crash, Ctrl-C or a full disk never leaves a half-written result behind; a failed
write is an `OutputError` naming the target (one line, no traceback). Commands call
`check_outputs` before they start working, so a bad `-o` fails in a second, not after
minutes of measuring. JSON is written strictly: NaN and infinity are not JSON. A file
gets the mode `open()` would give it (0666 less the umask: 0644 on the usual umask
022), not mkstemp's private 0600, so teammates and a tracking server running as
another user can read results and their MLflow copies.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from paraplan.core import OutputError


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe(folder: Path, target: Path) -> None:
    """Create and remove a file in `folder`: the one honest test of writability (access
    bits say nothing for root, read-only mounts or special file systems)."""
    if not folder.is_dir():
        raise OutputError(target, f"'{folder}' is a file, not a folder")
    try:
        fd, name = tempfile.mkstemp(prefix=".paraplan-check.", dir=folder)
    except OSError as exc:
        raise OutputError(target, f"cannot create files in '{folder}': {_reason(exc)}") from None
    os.close(fd)
    os.unlink(name)


def check_outputs(
    files: Iterable[str | Path | None] = (), folders: Iterable[str | Path | None] = ()
) -> None:
    """Fail now, with one line, if an output could not be written later: a file path
    that is an existing folder, a folder path that is an existing file, or a place
    where no file can be created (no permission, read-only). None entries are skipped
    (options not given). Creates nothing that stays."""
    try:
        for path in (Path(p) for p in files if p is not None):
            if path.is_dir():
                raise OutputError(path, "is an existing folder; expected a file path")
            _probe(_nearest_existing(path.parent), path)
        for path in (Path(p) for p in folders if p is not None):
            if path.exists() and not path.is_dir():
                raise OutputError(path, "is an existing file; expected a folder")
            _probe(_nearest_existing(path), path)
    except OSError as exc:  # e.g. a name longer than the file system's 255 bytes
        raise OutputError(exc.filename or path, _reason(exc)) from None


def _umask() -> int:
    # os.umask both reads and sets; put the value straight back
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; on success rename it onto `path`."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except (FileExistsError, NotADirectoryError):
        raise OutputError(target, f"'{_nearest_existing(target.parent)}' is a file, not a folder") from None
    except OSError as exc:
        raise OutputError(target, _reason(exc)) from None
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        yield tmp
        os.replace(tmp, target)
    except OSError as exc:  # a full disk, a quota, a folder in the way: keep nothing
        raise OutputError(target, f"{_reason(exc)}; nothing was written") from None
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
    """`obj` as JSON; NaN or infinity in it is a ValueError (a bug: they are not JSON)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


def write_csv(path: str | Path, frame: Any) -> None:
    """Write a pandas DataFrame (header row, no index) atomically."""
    with atomic_open(path, "w") as handle:
        frame.to_csv(handle, index=False, lineterminator="\n")
