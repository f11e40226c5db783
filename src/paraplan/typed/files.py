"""Input files at the edge: a YAML file read as a mapping, then loaded as a typed
dataclass tree (`paraplan.typed.load`). Errors name the file and what was expected."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml

from paraplan.core.errors import InputFileError
from paraplan.typed.convert import load
from paraplan.typed.source import Source

T = TypeVar("T")
MAX_YAML_BYTES = 4 * 2**20  # a cluster, study or config file is a few KiB


def read_yaml(path: str | Path, expected: str) -> object:
    """The parsed YAML of `path` (UTF-8 text, at most MAX_YAML_BYTES)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputFileError(path, f"file not found; expected {expected}") from None
    except IsADirectoryError:
        raise InputFileError(path, f"is a directory; expected {expected}") from None
    except OSError as exc:
        raise InputFileError(path, f"cannot read ({exc.strerror}); expected {expected}") from None
    if len(data) > MAX_YAML_BYTES:
        raise InputFileError(path, f"larger than {MAX_YAML_BYTES // 2**20} MiB; expected {expected}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(path, f"byte {exc.start} is not UTF-8; expected {expected} as UTF-8 text") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputFileError(path, f"not valid YAML: {exc}") from None
    except RecursionError:
        raise InputFileError(path, "not valid YAML: nested too deeply") from None


def load_yaml(cls: type[T], path: str | Path, expected: str) -> T:
    """`path` as an instance of the dataclass `cls`."""
    return load(cls, read_yaml(path, expected), Source.file(path))
