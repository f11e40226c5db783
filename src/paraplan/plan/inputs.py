"""Parsing of the plan command's small value languages (pure; errors name the option)."""

from __future__ import annotations

import re

from paraplan.core import ConfigError

_SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_gbs_range(text: str, key: str = "gbs-range") -> list[int]:
    """`A:B:S`: A, then every multiple of S in (A, B]. 32:4096:64 -> 32, 64, 128, ..., 4096
    (65 sizes, the DAPPLE sweep)."""
    parts = text.split(":")
    try:
        start, stop, step = (int(p) for p in parts)
    except ValueError:
        raise ConfigError(key, f"expected A:B:S with three integers, got '{text}'") from None
    if start < 1 or step < 1 or stop < start:
        raise ConfigError(key, f"expected 1 <= A <= B and S >= 1, got '{text}'")
    first_multiple = (start // step + 1) * step
    return [start, *range(first_multiple, stop + 1, step)]


def parse_gbs_list(text: str, key: str = "gbs") -> list[int]:
    """`32,64,128` -> [32, 64, 128] (sorted, duplicates dropped)."""
    try:
        values = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(key, f"expected comma-separated integers, got '{text}'") from None
    if not values or min(values) < 1:
        raise ConfigError(key, f"expected integers >= 1, got '{text}'")
    return sorted(set(values))


def parse_cluster_shape(text: str, key: str = "cluster") -> tuple[int, int]:
    """`2x8` -> (2 nodes, 8 devices per node); `16x1` is flat."""
    found = _SHAPE.match(text)
    if not found:
        raise ConfigError(key, f"expected NODESxDEVICES such as 2x8 or 16x1, got '{text}'")
    nodes, per_node = int(found.group(1)), int(found.group(2))
    if nodes < 1 or per_node < 1:
        raise ConfigError(key, f"nodes and devices per node must be >= 1, got '{text}'")
    return nodes, per_node
