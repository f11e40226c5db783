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


MAX_VALUES = 1_000_000
"""Values (mappings, lists and scalars, counted as if aliases were copied) a YAML
input may hold: a cluster or study has hundreds; a YAML alias bomb has billions."""


def read_yaml(path: str | Path, expected: str) -> object:
    """The parsed YAML of `path`."""
    text = read_text(path, expected)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputFileError(path, f"not valid YAML ({problem}); expected {expected}", line=line) from None
    except RecursionError:
        raise InputFileError(path, f"not valid YAML: nested too deeply; expected {expected}") from None
    try:
        size = _expanded_size(data, {})
    except RecursionError:
        raise InputFileError(path, f"not valid YAML: nested too deeply; expected {expected}") from None
    if size > MAX_VALUES:
        raise InputFileError(path, f"holds more than {MAX_VALUES:,} values once its aliases are expanded; "
                             f"expected {expected}")
    return data


def _expanded_size(data: object, sizes: dict[int, int]) -> int:
    """Values in `data` with every shared (aliased) part counted each time it is used;
    `sizes` memoises by identity, so this takes time linear in the distinct parts."""
    if not isinstance(data, dict | list):
        return 1
    known = sizes.get(id(data))
    if known is not None:
        return known
    sizes[id(data)] = MAX_VALUES + 1  # a part that contains itself (a recursive alias) is endless
    items = [*data.keys(), *data.values()] if isinstance(data, dict) else data
    total = 1
    for item in items:
        total += _expanded_size(item, sizes)
        if total > MAX_VALUES:
            break
    sizes[id(data)] = total
    return total


def load_yaml(cls: type[T], path: str | Path, expected: str) -> T:
    """`path` as an instance of the dataclass `cls`."""
    return load(cls, read_yaml(path, expected), Source.file(path))
