"""Output paths a careless command line gets wrong, refused before a command starts:
an empty `-o ""` (an unset shell variable; it would write into the working folder or
fail with an unrelated message), and an output that is one of the command's own input
files (the atomic write would replace the run table or calibration it was made from)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

from paraplan.core import ConfigError

OUTPUT_DESTS = ("output", "a2av_output", "predictions")
"""Options that name a file a command writes (`--plots` is a folder of new files)."""
_NOT_PATHS = ("rule", "wildcards", "name")  # tags and names, never read as files


def output_path(text: str) -> Path:
    """`-o`'s argparse type: a path, never an empty one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path; expected a file or folder to write")
    return Path(text)


def _given(value: object) -> Iterator[Path]:
    if isinstance(value, str | os.PathLike) and str(value):
        yield Path(value)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _given(item)


def _is_file(path: Path) -> bool:
    """`path.is_file()`; False for a path the system refuses (a name too long): the
    command's own reader or writer says what is wrong with it."""
    try:
        return path.is_file()
    except OSError:
        return False


def _spelling(parser: argparse.ArgumentParser | None, dest: str) -> str:
    for action in getattr(parser, "_actions", ()):
        if action.dest == dest:
            return action.option_strings[-1] if action.option_strings else f"argument {action.metavar or dest}"
    return dest


def check_outputs_apart(args: argparse.Namespace) -> None:
    """A `ConfigError` naming the output option when it names an existing file that
    another argument of the same command reads."""
    outputs = {dest: Path(getattr(args, dest)) for dest in OUTPUT_DESTS if getattr(args, dest, None)}
    if not outputs:
        return
    parser = getattr(args, "_parser", None)
    for dest, value in vars(args).items():
        if dest in OUTPUT_DESTS or dest in _NOT_PATHS or dest.startswith("_"):
            continue
        for source in _given(value):
            if not _is_file(source):
                continue
            for out_dest, out in outputs.items():
                if _is_file(out) and os.path.samefile(out, source):
                    raise ConfigError(f"--{out_dest.replace('_', '-')}",
                                      f"'{out}' is also this command's input ({_spelling(parser, dest)}); expected "
                                      "another path, or writing would replace the input")
