"""How layers split over pipeline stages: the even split every path shares.

It lives in `core` because `Strategy` and `RunSettings` (core types) split their
layers with it; the engine's builders (`paraplan.sim.builder`) and the planners call the
same two functions, so there is one rule: as even as possible, the first stages
taking one layer more when the layers do not divide."""

from __future__ import annotations

from collections.abc import Sequence


def even_layer_counts(num_layers: int, parts: int) -> list[int]:
    """Layers of each of `parts` consecutive parts, as even as possible: the first
    `num_layers mod parts` parts take one more (Megatron's default split)."""
    base, extra = divmod(num_layers, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def layer_ranges(counts: Sequence[int]) -> list[tuple[int, int]]:
    """[start, stop) of consecutive parts holding `counts` layers each."""
    ranges: list[tuple[int, int]] = []
    start = 0
    for n in counts:
        ranges.append((start, start + int(n)))
        start += int(n)
    return ranges


def even_layer_ranges(num_layers: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) of each part of the even split (`even_layer_counts`)."""
    return layer_ranges(even_layer_counts(num_layers, parts))
