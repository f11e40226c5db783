"""One error type per kind of user mistake; the CLI catches `ParaplanError` once and
prints its message without a traceback."""

from __future__ import annotations

from pathlib import Path


class ParaplanError(Exception):
    """Base of every error that is the user's to fix (bad config, file, strategy)."""


class ConfigError(ParaplanError):
    """A config key or command-line value is missing, unknown or out of range.

    `key` names it as its author wrote it: an option (`--gpus`, or several joined by
    ", ") reads `option --gpus: <reason>`; anything else is a key of the workflow
    config, `config key 'bench.min_bytes': <reason>`. `reason`: the message alone."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.reason = message
        super().__init__(f"{_named(key)}: {message}")

    def as_option(self, option: str) -> ConfigError:
        """The same problem, named as the command-line option that gave the value."""
        return ConfigError(option, self.reason)


def _named(key: str) -> str:
    if key.startswith("--"):
        return f"option{'s' if ', --' in key else ''} {key}"
    return f"config key '{key}'"


class InputFileError(ParaplanError):
    """An input file (log, profile, CSV) cannot be read as promised.

    The message reads `path:line: field: message`, e.g. `a.csv:7: column 'time_us':
    expected ..., got 'nan'`; `field` (a column or key) and `line` are optional."""

    def __init__(self, path: str | Path, message: str, line: int | None = None, field: str | None = None):
        self.path = str(path)
        self.line = line
        self.field = field
        where = f"{path}:{line}" if line is not None else f"{path}"
        what = f"{field}: {message}" if field else message
        super().__init__(f"{where}: {what}")


class OutputError(ParaplanError):
    """An output cannot be written where it was asked for (a directory in the way, no
    permission, a full disk); nothing half-written is left behind."""

    def __init__(self, path: str | Path, message: str):
        self.path = str(path)
        super().__init__(f"cannot write '{path}': {message}")


class StrategyError(ParaplanError):
    """A parallelisation strategy that cannot run (e.g. 2BW with more stages than
    micro-batches); the message says why."""


class TrackingError(ParaplanError):
    """The MLflow store could not be reached or written; results on disk stay intact."""

    def __init__(self, store: str, message: str):
        self.store = store
        self.detail = message
        super().__init__(f"MLflow tracking store '{store}': {message}")
