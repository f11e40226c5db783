"""Command-line options of an input dataclass: one option per field, spelled as the
field's name in kebab case (`micro_batch_size` -> `--micro-batch-size`), its docstring
as the help, its choices from a `Literal`; the 0.1 spellings from the glossary stay
hidden aliases that warn. Values are collected as text and go through the same
`paraplan.typed.load` as a file, so errors read alike."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from paraplan.core.glossary import old_names
from paraplan.typed.source import option_name, say_deprecated
from paraplan.typed.types import (
    Choice,
    Nullable,
    Scalar,
    default_of,
    field_docs,
    fields_of,
    resolved_types,
)


class DeprecatedOption(argparse.Action):
    """An old option spelling: stores into the new option's destination and warns."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "",
                 convert: Callable[[Any], Any] | None = None, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new
        self.convert = convert

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        say_deprecated(f"{option_string or self.option_strings[0]} is deprecated, use {self.new}", parser.prog)
        value = self.const if self.nargs == 0 else values
        setattr(namespace, self.dest, self.convert(value) if self.convert else value)


def deprecated_option(parser: Any, old: str | Sequence[str], new: str, dest: str,
                      convert: Callable[[Any], Any] | None = None, flag: bool = False,
                      const: object = True) -> None:
    """Accept `old` (hidden from --help) as `new`, storing into `dest`."""
    names = [old] if isinstance(old, str) else list(old)
    if flag:
        parser.add_argument(*names, dest=dest, action=DeprecatedOption, new=new, nargs=0, const=const,
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    else:
        parser.add_argument(*names, dest=dest, action=DeprecatedOption, new=new, convert=convert,
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def add_options(parser: Any, cls: type, prefix: str, only: Iterable[str] | None = None,
                show_defaults: bool = True, metavars: dict[str, str] | None = None) -> None:
    """One option per field of `cls` (or of `only`), stored as text under
    `<prefix><field name>`; unset options stay absent (`given`). `metavars`: a field's
    placeholder in the usage line (default N, X, TEXT or LIST by its type)."""
    docs = field_docs(cls)
    types = resolved_types(cls)
    wanted = set(only) if only is not None else None
    for key, f in fields_of(cls):
        if wanted is not None and f.name not in wanted:
            continue
        tp = types[f.name]
        inner = tp.inner if isinstance(tp, Nullable) else tp
        help_text = docs[f.name].split("\n\n")[0].replace("%", "%%")
        default = default_of(f)
        if show_defaults and default is not dataclasses.MISSING and default not in (None, (), "", {}) \
                and not isinstance(default, bool):
            shown = ",".join(str(v) for v in default) if isinstance(default, tuple) else default
            help_text += f" (default: {shown})"
        dest = prefix + f.name
        flag = option_name(key)
        if isinstance(inner, Scalar) and inner.kind is bool:
            parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
        elif isinstance(inner, Choice):
            parser.add_argument(flag, dest=dest, choices=[str(v) for v in inner.values],
                                default=argparse.SUPPRESS, help=help_text)
        else:
            metavar = {int: "N", float: "X"}.get(inner.kind, "TEXT") if isinstance(inner, Scalar) else "LIST"
            metavar = (metavars or {}).get(f.name, metavar)
            parser.add_argument(flag, dest=dest, default=argparse.SUPPRESS, metavar=metavar, help=help_text)
        for old in old_names(f.name):
            if option_name(old) != flag:
                deprecated_option(parser, option_name(old), flag, dest)


def given(cls: type, args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    """The options of `cls` given on the command line, by file key."""
    out = {}
    for key, f in fields_of(cls):
        dest = prefix + f.name
        if hasattr(args, dest):
            out[key] = getattr(args, dest)
    return out
