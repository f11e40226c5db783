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


class DuplicateKeyError(yaml.YAMLError):
    """A mapping that gives one key twice (YAML's loaders keep the last one silently)."""

    def __init__(self, key: object, first_line: int, second_line: int):
        self.line = second_line
        super().__init__(f"key '{key}' appears twice (lines {first_line} and {second_line}); "
                         "expected each key once in a mapping")


class UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping. Keys merged in
    with `<<: *alias` may be overridden, as YAML intends."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: SafeLoader's own error names it
                continue
            if first != key_node.start_mark.line:
                raise DuplicateKeyError(key, first + 1, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str) -> object:
    """YAML `text` parsed safely, a key given twice in a mapping refused
    (`DuplicateKeyError`)."""
    return yaml.load(text, Loader=UniqueKeyLoader)


def read_yaml(path: str | Path, expected: str) -> object:
    """The parsed YAML of `path`."""
    text = read_text(path, expected)
    try:
        data = parse_yaml(text)
    except DuplicateKeyError as exc:
        raise InputFileError(path, str(exc), line=exc.line) from None
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
