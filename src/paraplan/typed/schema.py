"""JSON Schema (draft 2020-12) of an input dataclass: types, bounds, choices,
defaults, required keys and every field's docstring as its description. The files
under workflow/schemas/ are written from these (`python -m paraplan.typed.schema`)
and a test keeps them equal."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from paraplan.core.glossary import TERMS_BY_NAME
from paraplan.typed.constraints import Above, AtLeast, AtMost
from paraplan.typed.types import (
    AnyOf,
    Choice,
    FieldType,
    ListOf,
    Nullable,
    Parsed,
    ParsedValue,
    Raw,
    Record,
    Scalar,
    TableOf,
    default_of,
    field_docs,
    fields_of,
    resolved_types,
)

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def json_schema(cls: type, title: str = "") -> dict[str, Any]:
    """The schema of files that `paraplan.typed.load(cls, ...)` reads."""
    out: dict[str, Any] = {"$schema": DRAFT}
    if title:
        out["title"] = title
    doc = (cls.__doc__ or "").strip()
    if doc:
        out["description"] = " ".join(doc.split())
    out.update(record_schema(cls))
    return out


def record_schema(cls: type) -> dict[str, Any]:
    types = resolved_types(cls)
    docs = field_docs(cls)
    properties: dict[str, Any] = {}
    required = []
    for key, f in fields_of(cls):
        prop = type_schema(types[f.name])
        if docs[f.name]:
            prop["description"] = " ".join(docs[f.name].split())
        default = default_of(f)
        if default is dataclasses.MISSING:
            required.append(key)
        elif (plain := _plain(default)) is not _NO_JSON:
            prop["default"] = plain
        properties[key] = prop
        term = TERMS_BY_NAME.get(f.name)
        for old in term.old_names if term else ():
            if old not in properties and old != key:
                properties[old] = {"deprecated": True, "description": f"The paraplan 0.1 name of '{key}'."}
    out: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": properties}
    if required:
        out["required"] = required
    return out


def type_schema(tp: FieldType) -> dict[str, Any]:
    if isinstance(tp, Scalar):
        kinds: dict[type, dict[str, Any]] = {
            int: {"type": "integer"}, float: {"type": "number"}, str: {"type": "string"},
            bool: {"type": "boolean"}, Path: {"type": "string", "minLength": 1},
        }
        base = dict(kinds[tp.kind])
        for b in tp.bounds:
            if isinstance(b, AtLeast):
                base["minimum"] = _number(b.low)
            elif isinstance(b, Above):
                base["exclusiveMinimum"] = _number(b.low)
            elif isinstance(b, AtMost):
                base["maximum"] = _number(b.high)
        return base
    if isinstance(tp, Choice):
        return {"enum": list(tp.values)}
    if isinstance(tp, ListOf):
        return {"type": "array", "items": type_schema(tp.item)}
    if isinstance(tp, TableOf):
        return {"type": "object", "additionalProperties": type_schema(tp.value)}
    if isinstance(tp, Nullable):
        return {"anyOf": [type_schema(tp.inner), {"type": "null"}]}
    if isinstance(tp, AnyOf):
        return {"anyOf": [type_schema(o) for o in tp.options]}
    if isinstance(tp, Record):
        return record_schema(tp.cls)
    if isinstance(tp, Raw):
        return {}
    if isinstance(tp, Parsed):
        return dict(tp.cls.SCHEMA)  # type: ignore[attr-defined]
    raise TypeError(tp)


def _number(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x


_NO_JSON = object()


def _plain(value: object) -> object:
    """A default as JSON, or _NO_JSON when it has no JSON form."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return value if math.isfinite(value) else _NO_JSON
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        items = [_plain(v) for v in value]
        return _NO_JSON if any(i is _NO_JSON for i in items) else items
    if isinstance(value, dict):
        entries = {str(k): _plain(v) for k, v in value.items()}
        return _NO_JSON if any(v is _NO_JSON for v in entries.values()) else entries
    if isinstance(type(value), ParsedValue):
        return str(value)  # a parsed value's text form parses back to it
    return _NO_JSON
