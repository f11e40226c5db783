"""Reading the user's files at the edge: UTF-8 text of bounded size, CSV tables with
bounded fields, and numbers that are finite, in range and of the right kind.

Every reader of an input file (nccl-tests and PARAM logs, PipeDream graphs, profile
CSVs and their meta JSON, bench CSVs) goes through these, so a bad byte, field or
number gets the same error everywhere: an `InputFileError` naming the file, the line,
the column or key, the value and what was expected. The ranges themselves belong to
each kind of file (`paraplan.comm.results.SWEEP_RULES`, `paraplan.profile.io.LAYER_RULES`).
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from paraplan.core import InputFileError

MAX_FILE_BYTES = 256 * 2**20  # no log, profile or sweep comes near; a bigger file is a mistake
_READ_PIECE_BYTES = 2**20
_SHOWN_CHARS = 40
_MAX_INT_DIGITS = 40  # longer digit strings are read as floats (int() refuses > 4300 digits)

# Plain ASCII decimal notation only: float() would also take '1_000', Arabic-Indic
# digits and surrounding whitespace, which no benchmark or profile prints.
_INT_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_NON_FINITE_RE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.ASCII | re.IGNORECASE)


def shown(text: str, limit: int = _SHOWN_CHARS) -> str:
    """`text` quoted for a message, shortened when longer than `limit`."""
    if len(text) <= limit:
        return f"'{text}'"
    return f"'{text[:limit // 2]}...' ({len(text)} characters)"


def _bound(value: float) -> str:
    if float(value).is_integer() and abs(value) >= 2**20 and math.log2(abs(value)).is_integer():
        return f"2^{int(math.log2(abs(value)))}"
    text = f"{value:g}"
    return text.replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


@dataclass(frozen=True)
class NumberRule:
    """What one numeric field may hold: finite, `low <= value <= high` (`low < value`
    when not `low_inclusive`), an integer when `integer`. `what` names the quantity with
    its unit; `why` explains the bounds in an error (a negative value is "negative")."""

    what: str
    low: float
    high: float
    integer: bool = False
    low_inclusive: bool = True
    why: str = ""

    @property
    def expected(self) -> str:
        low = f">= {_bound(self.low)}" if self.low_inclusive else f"> {_bound(self.low)}"
        kind = "an integer" if self.integer else "a number"
        return f"{self.what} ({kind} {low} and <= {_bound(self.high)})"

    def problem(self, value: float) -> str | None:
        """Why an already-numeric `value` does not qualify; None when it does."""
        if isinstance(value, float) and not math.isfinite(value):
            return "not a finite number"
        too_low = value < self.low if self.low_inclusive else value <= self.low
        if too_low and value < 0 <= self.low:
            return "negative"
        if self.integer and isinstance(value, float) and not value.is_integer():
            return "not an integer"
        if too_low or value > self.high:
            return self.why or "out of range"
        return None

    def parse(self, text: str) -> int | float:
        """The value written as `text`; a ValueError says what is wrong with it."""
        text = text.strip()
        if len(text) <= _MAX_INT_DIGITS and _INT_RE.fullmatch(text):
            value: int | float = int(text)  # exact: 2^60 + 1 must not round onto a bound of 2^60
        elif _FLOAT_RE.fullmatch(text):
            value = float(text)
            if self.integer and math.isfinite(value) and value.is_integer():
                value = int(value)
        elif _NON_FINITE_RE.fullmatch(text):
            value = math.nan
        else:
            raise ValueError(f"expected {self.expected}, got {shown(text)}")
        problem = self.problem(value)
        if problem:
            raise ValueError(f"expected {self.expected}, got {shown(text)}: {problem}")
        return value if self.integer else float(value)


def parse_number(path: str | Path, line: int | None, field: str, text: str, rule: NumberRule) -> int | float:
    """`rule.parse(text)`, or an `InputFileError` naming path, line and field."""
    try:
        return rule.parse(text)
    except ValueError as exc:
        raise InputFileError(path, str(exc), line=line, field=field) from None


def check_number(path: str | Path, line: int | None, field: str, value: float, rule: NumberRule) -> float:
    """An already-numeric value (a sum, a converted unit) checked against `rule`."""
    problem = rule.problem(value)
    if problem:
        raise InputFileError(path, f"expected {rule.expected}, got {value!r}: {problem}", line=line, field=field)
    return value


def _open_binary(path: Path, expected: str) -> IO[bytes]:
    """`path` opened for reading bytes; unreadable is an `InputFileError`."""
    try:
        return open(path, "rb")  # the callers close it
    except FileNotFoundError:
        raise InputFileError(path, f"file not found; expected {expected}") from None
    except IsADirectoryError:
        raise InputFileError(path, f"is a directory; expected {expected}") from None
    except OSError as exc:
        raise InputFileError(path, f"cannot read ({exc.strerror}); expected {expected}") from None


def read_bytes(path: str | Path, expected: str) -> bytes:
    """The file's bytes (at most `MAX_FILE_BYTES`); unreadable is an `InputFileError`."""
    path = Path(path)
    data = bytearray()
    with _open_binary(path, expected) as handle:
        # in pieces up to the bound: read(n) sets n bytes aside first, 256 MiB for a 4 kB file
        while len(data) <= MAX_FILE_BYTES and (piece := handle.read(_READ_PIECE_BYTES)):
            data += piece
    if len(data) > MAX_FILE_BYTES:
        raise InputFileError(path, f"larger than {MAX_FILE_BYTES // 2**20} MiB; expected {expected}")
    return bytes(data)


def _position(data: bytes, offset: int) -> tuple[int, int]:
    """1-based (line, byte column) of `offset` in `data`."""
    line = data.count(b"\n", 0, offset) + 1
    column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return line, column


def read_text(path: str | Path, expected: str) -> str:
    """The file as text: UTF-8 (a leading byte-order mark is dropped), no NUL bytes, at
    most `MAX_FILE_BYTES`. `expected` says what the file should be ("a PARAM log")."""
    data = read_bytes(path, expected)
    nul = data.find(b"\x00")
    if nul >= 0:
        line, column = _position(data, nul)
        raise InputFileError(path, f"NUL byte at column {column}: binary data; expected {expected}", line=line)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _position(data, exc.start)
        raise InputFileError(
            path, f"byte 0x{data[exc.start]:02x} at column {column} is not UTF-8; expected {expected} "
            "as UTF-8 text", line=line,
        ) from None
    return text.removeprefix("\ufeff")


_LONE_CR = re.compile(r"(?<=\r)(?=[^\n])")  # a line break of its own, as io.StringIO(newline="") splits


def iter_text_lines(path: str | Path, expected: str) -> Iterator[str]:
    """`read_text` one line at a time (the same checks and errors: at most
    `MAX_FILE_BYTES`, UTF-8, no NUL byte, a leading byte-order mark dropped), holding one
    line in memory, not the file. Line endings are kept, for the csv module."""
    path = Path(path)
    return _lines(_open_binary(path, expected), path, expected)  # the generator closes it


def _lines(handle: IO[bytes], path: Path, expected: str) -> Iterator[str]:
    too_large = InputFileError(path, f"larger than {MAX_FILE_BYTES // 2**20} MiB; expected {expected}")
    with handle:
        if os.fstat(handle.fileno()).st_size > MAX_FILE_BYTES:
            raise too_large
        size, number = 0, 0
        while data := handle.readline(MAX_FILE_BYTES - size + 1):  # one line, never past the bound
            size += len(data)
            number += 1
            if size > MAX_FILE_BYTES:
                raise too_large
            nul = data.find(b"\x00")
            if nul >= 0:
                raise InputFileError(path, f"NUL byte at column {nul + 1}: binary data; expected {expected}",
                                     line=number)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputFileError(
                    path, f"byte 0x{data[exc.start]:02x} at column {exc.start + 1} is not UTF-8; expected "
                    f"{expected} as UTF-8 text", line=number,
                ) from None
            if number == 1:
                text = text.removeprefix("\ufeff")
            yield from _LONE_CR.split(text)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's pairs as a dict; a key given twice (json's default keeps the last
    one silently) raises, and `_duplicate_json_key` then finds its lines."""
    out = dict(pairs)
    if len(out) < len(pairs):
        raise _DuplicateKey
    return out


def _duplicate_json_key(text: str) -> tuple[str, int, int] | None:
    """The first key of valid JSON `text` given twice in one object, with the lines of
    both (1-based); None when every object's keys differ. A scan of strings and
    brackets: json reports no positions to its hooks."""
    stack: list[dict[str, int] | None] = []  # a dict of key -> line per open object, None per array
    i, line, n = 0, 1, len(text)
    while i < n:
        char = text[i]
        if char == "\n":
            line += 1
        elif char in "{[":
            stack.append({} if char == "{" else None)
        elif char in "}]" and stack:
            stack.pop()
        elif char == '"':
            end = i + 1
            while end < n and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            after = end + 1
            while after < n and text[after] in " \t\r\n":
                after += 1
            keys = stack[-1] if stack else None
            if keys is not None and after < n and text[after] == ":":
                key = json.loads(text[i:end + 1])
                if key in keys:
                    return key, keys[key], line
                keys[key] = line
            i = end
        i += 1
    return None


def read_json_object(path: str | Path, expected: str) -> dict:
    """A JSON object from a UTF-8 file; NaN and Infinity (not JSON) are refused."""
    text = read_text(path, expected)
    if not text.strip():
        raise InputFileError(path, f"empty file; expected {expected} (a JSON object)")

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not a JSON value")

    try:
        value = json.loads(text, parse_constant=refuse, object_pairs_hook=_unique_keys)
    except _DuplicateKey:
        key, first, second = _duplicate_json_key(text) or ("?", 0, 0)
        raise InputFileError(path, f"key {shown(key)} appears twice (lines {first} and {second}); expected each key "
                             "once in an object", line=second) from None
    except json.JSONDecodeError as exc:
        raise InputFileError(path, f"not valid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno) from None
    except ValueError as exc:
        raise InputFileError(path, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise InputFileError(path, "not valid JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise InputFileError(path, f"expected {expected} (a JSON object), got a JSON {type(value).__name__}")
    return value


@dataclass(frozen=True)
class CsvTable:
    """A CSV's header and its non-blank records, each with the line it starts on."""

    header: tuple[str, ...]
    records: tuple[tuple[int, Mapping[str, str]], ...]


def read_csv_table(
    text: str, path: str | Path, required: Sequence[str], known: Sequence[str] | None = None
) -> CsvTable:
    """Parse CSV `text` with a header row holding every `required` column (and, when
    `known` is given, nothing else). Cells are stripped of surrounding blanks. A field
    over the csv module's limit (128 KiB), bad quoting, a duplicate column or a record of
    the wrong width is an `InputFileError` naming the line."""
    header, records = csv_records(io.StringIO(text, newline=""), path, required, known)
    return CsvTable(header, tuple(records))


def csv_records(
    lines: Iterable[str], path: str | Path, required: Sequence[str], known: Sequence[str] | None = None,
    columns_listed_by: str = "",
) -> tuple[tuple[str, ...], Iterator[tuple[int, dict[str, str]]]]:
    """`read_csv_table` one record at a time: the header, checked now, and an iterator
    over the records (line, cells), each checked as it is read. `lines` is any iterable
    of text lines (`iter_text_lines` for a file of any length). An unknown column is
    named with the known one it most resembles; `columns_listed_by` (e.g. "`paraplan
    predict --help`") says where the known columns are listed, for tables with too many
    to print in one error line."""
    reader = csv.reader(lines, strict=True)
    position = [1]  # the line the next record starts on

    def rows() -> Iterator[tuple[int, list[str]]]:
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                limit = csv.field_size_limit()
                reason = f"a field longer than {limit} characters" if "field limit" in str(exc) else str(exc)
                raise InputFileError(path, f"not a readable CSV record: {reason}", line=position[0]) from None
            start = position[0]
            position[0] = reader.line_num + 1
            if any(cell.strip() for cell in row):
                yield start, row

    source = rows()
    first = next(source, None)
    if first is None:
        expected = (f"a header row with {', '.join(required)}" if required
                    else f"a header row of the columns {columns_listed_by} lists" if columns_listed_by
                    else "a header row of column names")
        raise InputFileError(path, f"empty file; expected {expected}")
    header_line, raw_header = first
    header = tuple(cell.strip() for cell in raw_header)
    duplicated = sorted({c for c in header if header.count(c) > 1})
    if duplicated:
        raise InputFileError(path, f"column '{duplicated[0]}' appears twice in the header", line=header_line)
    missing = [c for c in required if c not in header]
    if missing:
        raise InputFileError(
            path, f"missing column(s) {', '.join(missing)}; expected {', '.join(required)}", line=header_line
        )
    if known is not None:
        unknown = [c for c in header if c not in known]
        if unknown:
            close = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.8)
            guess = f" (did you mean '{close[0]}'?)" if close else ""
            expected = (f"one of the columns {columns_listed_by} lists" if columns_listed_by
                        else f"columns among {', '.join(known)}")
            raise InputFileError(path, f"unknown column {shown(unknown[0])}{guess}; expected {expected}",
                                 line=header_line)

    def records() -> Iterator[tuple[int, dict[str, str]]]:
        for line, row in source:
            if len(row) != len(header):
                raise InputFileError(path, f"expected {len(header)} fields (as in the header), got {len(row)}",
                                     line=line)
            yield line, dict(zip(header, (cell.strip() for cell in row), strict=True))

    return header, records()
