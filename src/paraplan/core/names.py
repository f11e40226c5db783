"""Names that become file and folder names, and text a spreadsheet would run.

One rule for every name a user gives that paraplan turns into a path: workflow config
keys (`predict.tables`, `plan.llm`, `profile.models`, ...), study names, series names,
the names of `simulate --runs` (as their file stems) and run-table names:

- letters, digits, `_`, `.` and `-`, the first one a letter, digit or `_`, so `.`,
  `..`, hidden files, separators and option-like names (`-x`) never arise;
- at most `MAX_NAME_CHARS` characters: output names add a suffix or a second name
  (`<model>__<cluster>.csv`, `<name>.meta.json`) and must stay far below the 255
  bytes a file name may have.

`NAME_PATTERN` is the same rule as a regular expression; the workflow's config schema
(workflow/schemas/config.schema.yaml) carries it verbatim and a test keeps them equal.

Free text that is written back into a CSV (a run table's `name` column) may not start
with `=`, `+`, `-` or `@`: a spreadsheet opening the CSV would run it as a formula.
Numbers are no text: -1.5 stays a number.

Pure functions: each returns what is wrong (or the stems), callers raise the error
type of their input (a config key, a file and line).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_NAME_CHARS = 64
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
NAME_RULE = (f"letters, digits, '_', '.' or '-', starting with a letter, digit or '_', "
             f"at most {MAX_NAME_CHARS} characters")
_NAME_RE = re.compile(NAME_PATTERN, re.ASCII)
_NOT_STEM_CHAR = re.compile(r"[^A-Za-z0-9_-]", re.ASCII)

FORMULA_STARTS = ("=", "+", "-", "@")
"""Leading characters that make a spreadsheet read a CSV cell as a formula."""
_SHOWN = 40


def _shown(text: str) -> str:
    return f"'{text}'" if len(text) <= _SHOWN else f"'{text[:_SHOWN // 2]}...' ({len(text)} characters)"


def name_problem(name: object) -> str | None:
    """Why `name` cannot be a file name under the rule above; None when it can."""
    if not isinstance(name, str):
        return f"expected a name ({NAME_RULE}), got {name!r}"
    if _NAME_RE.fullmatch(name):
        return None
    if len(name) > MAX_NAME_CHARS:
        return f"{_shown(name)} is longer than {MAX_NAME_CHARS} characters; expected {NAME_RULE}"
    return f"{_shown(name)} is not a usable name; expected {NAME_RULE}"


def formula_problem(text: str) -> str | None:
    """Why free text `text` may not be written into a CSV cell; None when it may."""
    if text.startswith(FORMULA_STARTS):
        return (f"{_shown(text)} starts with '{text[0]}', which a spreadsheet runs as a formula; expected text "
                f"starting with none of {' '.join(FORMULA_STARTS)}")
    return None


def file_stem(text: str) -> str:
    """`text` made a name: each character other than a letter, digit, `_` or `-` becomes
    `_` (a dot too: it would read as a file suffix), a leading `-` too, cut to
    `MAX_NAME_CHARS`. Different texts may give one stem: see `file_stems`."""
    stem = _NOT_STEM_CHAR.sub("_", text)[:MAX_NAME_CHARS] or "_"
    return "_" + stem[1:] if stem[0] == "-" else stem


def file_stems(texts: Iterable[str]) -> tuple[list[str], str | None]:
    """The stem of each text (`file_stem`), and what is wrong when two different texts
    share one (`a/b` and `a_b` would write one file); the same text twice is a
    collision too (its second file would overwrite the first)."""
    stems: list[str] = []
    first: dict[str, str] = {}
    for text in texts:
        stem = file_stem(text)
        if stem in first:
            other = first[stem]
            what = f"{_shown(text)} appears twice" if other == text else f"{_shown(other)} and {_shown(text)}"
            return stems, f"{what}: both would be written as '{stem}'; expected names that differ as file names"
        first[stem] = text
        stems.append(stem)
    return stems, None
