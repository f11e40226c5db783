"""Bounds a field's value must respect, written into its type with `Annotated` so the
loader, the JSON schema and the command line read them from one place:

    num_layers: Annotated[int, AtLeast(1)] = 4
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated


def number_text(x: float) -> str:
    """A bound as people read it: 2^40 for large powers of two, whole numbers below ten
    million in full, else the shortest form (1e+06 reads as 1e6)."""
    if float(x).is_integer() and abs(x) >= 2**20 and math.log2(abs(x)).is_integer():
        return f"2^{int(math.log2(abs(x)))}"
    if float(x).is_integer() and abs(x) < 1e7:
        return str(int(x))
    return f"{x:g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


@dataclass(frozen=True)
class AtLeast:
    """value >= low; `why` explains the bound in an error."""

    low: float
    why: str = ""

    def problem(self, value: float) -> str | None:
        return None if value >= self.low else f">= {number_text(self.low)}"


@dataclass(frozen=True)
class Above:
    """value > low."""

    low: float
    why: str = ""

    def problem(self, value: float) -> str | None:
        return None if value > self.low else f"> {number_text(self.low)}"


@dataclass(frozen=True)
class AtMost:
    """value <= high; `why` explains the bound in an error (e.g. "wrong unit?")."""

    high: float
    why: str = ""

    def problem(self, value: float) -> str | None:
        return None if value <= self.high else f"<= {number_text(self.high)}"


Bound = AtLeast | Above | AtMost


def describe(bounds: tuple[Bound, ...]) -> str:
    """" >= 1" / " > 0 and <= 1" for a message ("" without bounds)."""
    parts = []
    for b in bounds:
        if isinstance(b, AtLeast):
            parts.append(f">= {number_text(b.low)}")
        elif isinstance(b, Above):
            parts.append(f"> {number_text(b.low)}")
        else:
            parts.append(f"<= {number_text(b.high)}")
    return (" " + " and ".join(parts)) if parts else ""


def violated(value: float, bounds: tuple[Bound, ...]) -> bool:
    return (isinstance(value, float) and not math.isfinite(value)) or any(b.problem(value) for b in bounds)


def reason(value: float, bounds: tuple[Bound, ...]) -> str:
    """Why `value` breaks `bounds`: the first broken bound's `why` ("" when it has none,
    and "negative" for a negative value below a bound of 0 or more)."""
    for b in bounds:
        if b.problem(value):
            if isinstance(b, AtLeast | Above) and b.low >= 0 and value <= 0:
                return "negative" if value < 0 else ""  # a unit cannot make these right
            return b.why
    return ""


Count = Annotated[int, AtLeast(1)]
"""A whole number >= 1 (layers, devices, micro-batches)."""
NonNegativeInt = Annotated[int, AtLeast(0)]
PositiveFloat = Annotated[float, Above(0)]
NonNegativeFloat = Annotated[float, AtLeast(0)]
