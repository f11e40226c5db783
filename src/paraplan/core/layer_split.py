"""How layers split over pipeline stages: the even split every path shares.

It lives in `core` because `Strategy` and `RunSettings` (core types) split their
layers with it; the engine's builders (`paraplan.sim.builder`) and the planners call the
same two functions, so there is one rule: as even as possible, the first stages
taking one layer more when the layers do not divide."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def even_layer_counts(num_layers: int, parts: int) -> list[int]:
    """Layers of each of `parts` consecutive parts, as even as possible: the first
    `num_layers mod parts` parts take one more (Megatron's default split)."""
    big, small, count_big = (int(x) for x in even_split_sizes(np.asarray(num_layers), np.asarray(parts)))
    return [big if i < count_big else small for i in range(parts)]


def even_split_sizes(num_layers: np.ndarray, parts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The even split as arrays (the planner prices many splits at once): the larger
    part's layers ceil(L / p), the smaller's floor(L / p), and how many parts take the
    larger (L mod p, or all p when the layers divide)."""
    big = -(-num_layers // parts)
    small = num_layers // parts
    remainder = num_layers % parts
    return big, small, np.where(remainder == 0, parts, remainder)


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
