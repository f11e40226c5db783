"""One validation boundary for every input mapping: a parsed YAML file, the workflow
config or command-line options become a frozen dataclass tree, or an error naming
the source, the key, the value and what was expected.

Keys are the fields' names; a 0.1 name of a field (`paraplan.core.glossary`) is
accepted with a deprecation warning. Numbers must be finite and inside the field's
bounds; an integer field takes no fraction, a text field no number. A dataclass's own
`__post_init__` checks (e.g. "hidden_size divisible by num_attention_heads") are
reported at the mapping that built it. A field with `metadata={"checked_first": True}`
(a study's `stage`) is checked before any other key, so a file of the wrong kind says so.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from paraplan.core.errors import ConfigError, ParaplanError
from paraplan.core.glossary import TERMS_BY_NAME
from paraplan.typed.constraints import reason, violated
from paraplan.typed.source import Path_, Source
from paraplan.typed.types import (
    Choice,
    FieldType,
    ListOf,
    Nullable,
    Parsed,
    Raw,
    Record,
    Scalar,
    TableOf,
    default_of,
    expected,
    fields_of,
    resolved_types,
)

T = TypeVar("T")
_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}
_SHOWN = 60


def shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def load(cls: type[T], data: object, source: Source, path: Path_ = ()) -> T:
    """`data` as an instance of the dataclass `cls` (see the module doc)."""
    return _record(cls, data, source, path)


def not_a_mapping(data: object, path: Path_ = ()) -> str:
    """Why `data` (at key `path`; () for a whole file) is no mapping: a file YAML reads
    as None holds nothing but blanks and comments."""
    if data is None and not path:
        return "empty file (blanks or comments only); expected a mapping"
    return f"expected a mapping, got {shown(data)}"


def _record(cls: type[T], data: object, source: Source, path: Path_) -> T:
    if not isinstance(data, Mapping):
        raise source.error(path, not_a_mapping(data, path))
    klass: type = cls  # (a class is hashable: the field descriptions are cached per class)
    data = upgrade_keys(klass, data, source, path)
    fields = fields_of(klass)
    types = resolved_types(klass)
    for key, f in fields:  # what kind of file this is (e.g. `stage`) before its other keys
        if f.metadata.get("checked_first") and key in data:
            convert(types[f.name], data[key], source, (*path, key))
    keys = [k for k, _ in fields]
    unknown = [k for k in data if k not in keys]
    if unknown:
        known = ", ".join(source.key_name(path, k) for k in keys)
        what = "does not apply here" if source.text_values((*path, str(unknown[0]))) else "unknown key"
        raise source.error((*path, str(unknown[0])), f"{what}; expected one of {known}")
    kwargs: dict[str, Any] = {}
    for key, f in fields:
        if key not in data:
            if default_of(f) is dataclasses.MISSING:
                raise source.error((*path, key), f"missing; expected {expected(types[f.name])}")
            continue
        kwargs[f.name] = convert(types[f.name], data[key], source, (*path, key))
    try:
        return cls(**kwargs)
    except ParaplanError as exc:
        raise source.error(path, _reason(exc), tuple(data)) from None
    except (ValueError, TypeError) as exc:
        raise source.error(path, str(exc), tuple(data)) from None


def _reason(exc: ParaplanError) -> str:
    """A nested error's own words (a ConfigError's message without its key prefix)."""
    return exc.reason if isinstance(exc, ConfigError) else str(exc)


def upgrade_keys(cls: type, data: Mapping, source: Source, path: Path_) -> dict:
    """`data` with every 0.1 key of `cls`'s fields renamed (and its value converted where
    the concept changed form), each with a deprecation warning. Old and new name side
    by side are an error, except in the workflow config (see below)."""
    out = dict(data)
    for key, f in fields_of(cls):
        term = TERMS_BY_NAME.get(f.name)
        if term is None:
            continue
        for old in term.old_names:
            if old not in out or old == key:
                continue
            if key in out and source.kind != "config":
                raise source.error((*path, old), f"'{old}' is the old name of '{key}'; give only '{key}'")
            # the workflow config merges a user's file over defaults written in new names:
            # an old name there is the user's, and wins
            source.renamed((*path, old), old, key)
            value = out.pop(old)
            convert_old = term.convert.get(old)
            out[key] = convert_old(value) if convert_old else value
    return out


def convert(tp: FieldType, value: object, source: Source, path: Path_) -> Any:
    """One value of type `tp`; errors name `path` in `source`."""
    text = source.text_values(path) and isinstance(value, str)
    if isinstance(tp, Raw):
        return value
    if isinstance(tp, Nullable):
        return None if value is None else convert(tp.inner, value, source, path)
    if isinstance(tp, Scalar):
        return _scalar(tp, value, source, path, text)
    if isinstance(tp, Choice):
        if value in tp.values and any(type(value) is type(v) for v in tp.values):
            return value
        raise source.error(path, f"expected {expected(tp)}, got {shown(value)}")
    if isinstance(tp, ListOf):
        if text:
            value = [part.strip() for part in str(value).split(",") if part.strip()]
        if not isinstance(value, list | tuple):
            raise source.error(path, f"expected {expected(tp)}, got {shown(value)}")
        return tuple(convert(tp.item, v, source, (*path, i)) for i, v in enumerate(value))
    if isinstance(tp, TableOf):
        if not isinstance(value, Mapping):
            raise source.error(path, f"expected {expected(tp)}, got {shown(value)}")
        out = {}
        for name, entry in value.items():
            if not isinstance(name, str):
                raise source.error(path, f"names must be text, got {shown(name)}")
            out[name] = convert(tp.value, entry, source, (*path, name))
        return out
    if isinstance(tp, Record):
        return _record(tp.cls, value, source, path)
    if isinstance(tp, Parsed):
        try:
            return tp.cls.parse(value)  # type: ignore[attr-defined]
        except ValueError as exc:
            raise source.error(path, str(exc)) from None
    errors = []
    for option in tp.options:
        try:
            return convert(option, value, source, path)
        except ParaplanError as exc:
            errors.append((option, exc))
    # one option of the value's own form (a list for a list, ...): its error says more
    same_form = [exc for option, exc in errors if _same_form(option, value)]
    if len(same_form) == 1:
        raise same_form[0]
    raise source.error(path, f"expected {expected(tp)}, got {shown(value)}")


def _same_form(tp: FieldType, value: object) -> bool:
    if isinstance(tp, ListOf):
        return isinstance(value, list | tuple)
    if isinstance(tp, TableOf | Record):
        return isinstance(value, Mapping)
    if isinstance(tp, Scalar) and tp.kind in (int, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    return False


_INT_TEXT = re.compile(r"[+-]?[0-9]{1,40}", re.ASCII)
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:nan|inf|infinity)",
                         re.ASCII | re.IGNORECASE)


def _number_text(text: str, kind: type) -> int | float | None:
    """A number typed on the command line, in plain decimal notation (no '1_000', no
    other scripts' digits); None when the text is not one."""
    text = text.strip()
    if _INT_TEXT.fullmatch(text):
        return int(text) if kind is int else float(text)
    if _FLOAT_TEXT.fullmatch(text):
        value = float(text)
        return int(value) if kind is int and math.isfinite(value) and value.is_integer() else value
    return None


def _scalar(tp: Scalar, value: object, source: Source, path: Path_, text: bool) -> Any:
    kind = tp.kind
    problem = f"expected {expected(tp)}, got {shown(value)}"
    if kind is bool:
        if isinstance(value, bool):
            return value
        if text and str(value).strip().lower() in _TRUE | _FALSE:
            return str(value).strip().lower() in _TRUE
        raise source.error(path, problem)
    if kind is str:
        if not isinstance(value, str):
            raise source.error(path, problem)
        return value
    if kind is Path:
        if not isinstance(value, str) or not value:
            raise source.error(path, problem)
        return Path(value)
    number: object = value
    if text:
        number = _number_text(str(value), kind)
        if number is None:
            raise source.error(path, problem)
    if isinstance(number, bool) or not isinstance(number, int | float):
        raise source.error(path, problem)
    if kind is int and not isinstance(number, int):
        raise source.error(path, problem + ": not an integer")
    if isinstance(number, float) and not math.isfinite(number):
        raise source.error(path, problem + ": not a finite number")
    if violated(number, tp.bounds):
        why = reason(number, tp.bounds)
        raise source.error(path, problem + (f": {why}" if why else ""))
    return float(number) if kind is float else number
