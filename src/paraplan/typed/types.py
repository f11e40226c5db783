"""What a field of an input dataclass holds, read once from its annotation: the loader,
the JSON schema and the command line all work from this description.

Supported annotations: `int`, `float`, `str`, `bool`, `Path`, `Literal[...]`,
`tuple[X, ...]`, `dict[str, X]`, `X | None`, unions of these, nested frozen
dataclasses, and value types that parse themselves (`ParsedValue`). `Annotated[X,
AtLeast(1), ...]` adds bounds to a number.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from paraplan.typed.constraints import Bound, describe


@runtime_checkable
class ParsedValue(Protocol):
    """A value type with its own text form (e.g. a cluster shape `2x8`): `parse` turns
    a file or command-line value into it, raising `ValueError` with what was expected;
    `SCHEMA` is its JSON schema; `EXPECTED` says what it accepts."""

    SCHEMA: ClassVar[dict[str, Any]]
    EXPECTED: ClassVar[str]

    @classmethod
    def parse(cls, value: object) -> Any: ...


@dataclass(frozen=True)
class Scalar:
    kind: type  # int, float, str, bool or Path
    bounds: tuple[Bound, ...] = ()


@dataclass(frozen=True)
class Choice:
    values: tuple[object, ...]


@dataclass(frozen=True)
class ListOf:
    item: FieldType


@dataclass(frozen=True)
class TableOf:
    """dict[str, X]: named entries."""

    value: FieldType


@dataclass(frozen=True)
class Nullable:
    inner: FieldType


@dataclass(frozen=True)
class AnyOf:
    options: tuple[FieldType, ...]


@dataclass(frozen=True)
class Record:
    cls: type


@dataclass(frozen=True)
class Parsed:
    cls: type


@dataclass(frozen=True)
class Raw:
    """`Any`: taken as written, checked by whoever reads it (e.g. a model's settings,
    whose fields depend on the model)."""


FieldType = Scalar | Choice | ListOf | TableOf | Nullable | AnyOf | Record | Parsed | Raw


def field_type(annotation: object) -> FieldType:
    """The description of a resolved annotation (see the module doc)."""
    if annotation is Any:
        return Raw()
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        inner = field_type(args[0])
        bounds = tuple(a for a in args[1:] if isinstance(a, Bound))
        if not isinstance(inner, Scalar) or inner.kind not in (int, float):
            raise TypeError(f"bounds apply to int or float fields, not {args[0]}")
        return Scalar(inner.kind, inner.bounds + bounds)
    if origin is typing.Literal:
        return Choice(tuple(args))
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) < len(args):
            rest = field_type(options[0]) if len(options) == 1 else AnyOf(tuple(field_type(a) for a in options))
            return Nullable(rest)
        return AnyOf(tuple(field_type(a) for a in options))
    if origin is tuple:
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"only tuple[X, ...] is supported, not {annotation}")
        return ListOf(field_type(args[0]))
    if origin in (dict, Mapping):
        if args[0] is not str:
            raise TypeError(f"only dict[str, X] is supported, not {annotation}")
        return TableOf(field_type(args[1]))
    if annotation in (int, float, str, bool, Path):
        return Scalar(typing.cast(type, annotation))
    if isinstance(annotation, type) and isinstance(annotation, ParsedValue):
        return Parsed(annotation)  # before Record: a parsed value may be a dataclass too
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return Record(annotation)
    raise TypeError(f"unsupported field type {annotation!r}")


def expected(tp: FieldType) -> str:
    """What a value of this type looks like, for messages ("an integer >= 1")."""
    if isinstance(tp, Scalar):
        names = {int: "an integer", float: "a number", str: "text", bool: "true or false", Path: "a path"}
        return names[tp.kind] + describe(tp.bounds)
    if isinstance(tp, Choice):
        return "one of " + ", ".join(str(v) for v in tp.values)
    if isinstance(tp, ListOf):
        return f"a list of {_plural(expected(tp.item))}"
    if isinstance(tp, TableOf):
        return f"a mapping of names to {_plural(expected(tp.value))}"
    if isinstance(tp, Nullable):
        return f"{expected(tp.inner)} or null"
    if isinstance(tp, AnyOf):
        return " or ".join(expected(o) for o in tp.options)
    if isinstance(tp, Record):
        return f"a mapping ({', '.join(k for k, _ in fields_of(tp.cls))})"
    if isinstance(tp, Raw):
        return "any value"
    return tp.cls.EXPECTED  # type: ignore[attr-defined]


def _plural(text: str) -> str:
    for article in ("an ", "a "):
        if text.startswith(article):
            word, _, rest = text[len(article):].partition(" ")
            return f"{word}s {rest}".strip()
    return text


def key_of(f: dataclasses.Field) -> str:
    """The key a field has in files (its name, unless `metadata["key"]` says otherwise,
    e.g. `distir-v0.1`, which is no Python name)."""
    return str(f.metadata.get("key", f.name))


@cache
def fields_of(cls: type) -> tuple[tuple[str, dataclasses.Field], ...]:
    """(key, field) of every init field, in declaration order."""
    return tuple((key_of(f), f) for f in dataclasses.fields(cls) if f.init)


@cache
def resolved_types(cls: type) -> dict[str, FieldType]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: field_type(hints[f.name]) for _, f in fields_of(cls)}


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field (`x: int = 1` then `\"\"\"...\"\"\"`), from the
    class source and its dataclass bases; "" for an undocumented field."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        if not isinstance(body, ast.ClassDef):
            continue
        statements = body.body
        for stmt, after in zip(statements, [*statements[1:], None], strict=True):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return {f.name: docs.get(f.name, "") for _, f in fields_of(cls)}


def default_of(f: dataclasses.Field) -> object:
    """The field's default value, or `dataclasses.MISSING` when it is required."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING
