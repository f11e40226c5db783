"""Bounds a field's value must respect, written into its type with `Annotated` so the
loader, the JSON schema and the command line read them from one place:

    num_layers: Annotated[int, AtLeast(1)] = 4
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated


@dataclass(frozen=True)
class AtLeast:
    """value >= low."""

    low: float

    def problem(self, value: float) -> str | None:
        return None if value >= self.low else f">= {self.low:g}"


@dataclass(frozen=True)
class Above:
    """value > low."""

    low: float

    def problem(self, value: float) -> str | None:
        return None if value > self.low else f"> {self.low:g}"


@dataclass(frozen=True)
class AtMost:
    """value <= high."""

    high: float

    def problem(self, value: float) -> str | None:
        return None if value <= self.high else f"<= {self.high:g}"


Bound = AtLeast | Above | AtMost


def describe(bounds: tuple[Bound, ...]) -> str:
    """" >= 1" / " > 0 and <= 1" for a message ("" without bounds)."""
    parts = []
    for b in bounds:
        if isinstance(b, AtLeast):
            parts.append(f">= {b.low:g}")
        elif isinstance(b, Above):
            parts.append(f"> {b.low:g}")
        else:
            parts.append(f"<= {b.high:g}")
    return (" " + " and ".join(parts)) if parts else ""


def violated(value: float, bounds: tuple[Bound, ...]) -> bool:
    return (isinstance(value, float) and not math.isfinite(value)) or any(b.problem(value) for b in bounds)


Count = Annotated[int, AtLeast(1)]
"""A whole number >= 1 (layers, devices, micro-batches)."""
NonNegativeInt = Annotated[int, AtLeast(0)]
PositiveFloat = Annotated[float, Above(0)]
NonNegativeFloat = Annotated[float, AtLeast(0)]
