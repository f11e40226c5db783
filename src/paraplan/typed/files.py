"""Input files at the edge: a YAML file read as a mapping (UTF-8 text of bounded size,
`paraplan.inputs.read_text`), then loaded as a typed dataclass tree
(`paraplan.typed.load`). Errors name the file, the line where YAML knows it, and what
was expected."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml

from paraplan.core.errors import InputFileError
from paraplan.inputs import read_text
from paraplan.typed.convert import load
from paraplan.typed.source import Source

T = TypeVar("T")


def read_yaml(path: str | Path, expected: str) -> object:
    """The parsed YAML of `path`."""
    text = read_text(path, expected)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputFileError(path, f"not valid YAML ({problem}); expected {expected}", line=line) from None
    except RecursionError:
        raise InputFileError(path, f"not valid YAML: nested too deeply; expected {expected}") from None


def load_yaml(cls: type[T], path: str | Path, expected: str) -> T:
    """`path` as an instance of the dataclass `cls`."""
    return load(cls, read_yaml(path, expected), Source.file(path))
