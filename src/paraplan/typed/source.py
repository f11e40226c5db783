"""Where a value came from, so an error names it the way its author wrote it: a key
path in a file (`series[0].global_batch_sizes` of `fig3.yaml`), a command-line option
(`--micro-batch-size`) or a workflow config key (`profile.models.mlp.settings`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Literal

from paraplan.core.errors import ConfigError, InputFileError, ParaplanError
from paraplan.core.glossary import DEPRECATED_UNTIL

Path_ = tuple[str | int, ...]


def say_deprecated(text: str, prog: str = "paraplan") -> None:
    """One line on stderr for a 0.1 name (a file key or an option) that still works:
    `<prog>: warning: <text> (the old name goes away after paraplan 0.2)`."""
    print(f"{prog}: warning: {text} (the old name goes away after paraplan {DEPRECATED_UNTIL})", file=sys.stderr)


def warn_renamed(where: str, old: str, new: str, prog: str = "paraplan") -> None:
    """`where: 'old' is deprecated, use 'new'` (see `say_deprecated`)."""
    say_deprecated(f"{where}: '{old}' is deprecated, use '{new}'", prog)


def option_name(key: str) -> str:
    """`micro_batch_size` -> `--micro-batch-size` (options are lower case)."""
    return "--" + key.lower().replace("_", "-")


def dotted(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


@dataclass(frozen=True)
class Source:
    """`kind` `file` (`name` is its path), `command line`, or `config` (the workflow
    config; `name` is the key prefix). `command_line_keys`: top-level keys of a merged
    mapping that came from options (a study file overridden on the command line)."""

    kind: Literal["file", "command line", "config"]
    name: str = ""
    command_line_keys: frozenset[str] = field(default_factory=frozenset)

    @staticmethod
    def file(path: object) -> Source:
        return Source("file", str(path))

    @staticmethod
    def command_line() -> Source:
        return Source("command line")

    @staticmethod
    def config(prefix: str) -> Source:
        return Source("config", prefix)

    def text_values(self, path: Path_) -> bool:
        """Whether values at `path` arrive as text (from options) and may be parsed."""
        return self.kind == "command line" or bool(path and path[0] in self.command_line_keys)

    def key_name(self, path: Path_, key: str) -> str:
        """How the author spells `key` at `path` (an option on the command line)."""
        return option_name(key) if self.text_values((*path, key)) else key

    def where(self, path: Path_) -> str:
        if self.text_values(path) and not path:
            return "command line"
        if self.text_values(path):
            rest = path[1:]
            inner = f"item {rest[0] + 1}" if len(rest) == 1 and isinstance(rest[0], int) else dotted(rest)
            return option_name(str(path[0])) + (f" ({inner})" if rest else "")
        if self.kind == "config":
            return dotted((self.name, *path)) if self.name else dotted(path)
        return f"{self.name}: key '{dotted(path)}'" if path else self.name

    def error(self, path: Path_, message: str, keys: tuple[str, ...] = ()) -> ParaplanError:
        """The error for `path`; `keys`: the keys of the mapping at `path`, which name a
        whole-record problem on the command line (the options involved)."""
        if self.text_values(path) and not path and keys:
            return ConfigError(", ".join(option_name(k) for k in keys), message)
        if self.text_values(path):
            return ConfigError(self.where(path), message)
        if self.kind == "config":
            return ConfigError(self.where(path) or "<config>", message)
        return InputFileError(self.name, f"key '{dotted(path)}': {message}" if path else message)

    def renamed(self, path: Path_, old: str, new: str) -> None:
        """Say that `old` (at `path`) is the 0.1 name of `new`."""
        if self.text_values(path):
            say_deprecated(f"{option_name(old)} is deprecated, use {option_name(new)}")
        else:
            warn_renamed(self.where(path[:-1]) if path[:-1] else (self.name or "config"), old, new)
