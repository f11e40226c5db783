"""Message sizes and element counts of a collective sweep, following nccl-tests.

`size_bytes` is the larger per-rank buffer (all_gather: the gathered output;
reduce_scatter: the input; all_to_all: the per-rank total). The printed `count` is
the element count handed to the collective call (nccl-tests' `paramcount`): the
whole buffer for all_reduce, broadcast and reduce, one rank's share for
all_gather (its input), reduce_scatter (its output) and all_to_all (one peer's block).
The uneven all_to_allv has no nccl-tests counterpart: its count is the element
count of the largest rank's input buffer (its `size_bytes`, see `a2av`).
"""

from __future__ import annotations

from paraplan.core import ConfigError

# Bytes per element of the dtypes the harness can allocate (torch names).
ELEMENT_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "uint8": 1,
}

# Collectives whose count is one rank's share of `size_bytes`.
_SHARED_COUNT = frozenset({"all_gather", "reduce_scatter", "all_to_all"})
_WHOLE_COUNT = frozenset({"all_reduce", "broadcast", "reduce", "all_to_allv"})


def element_bytes(dtype: str) -> int:
    """Bytes per element of `dtype`; an unknown name is a `ConfigError` on --dtype."""
    try:
        return ELEMENT_BYTES[dtype]
    except KeyError:
        known = ", ".join(ELEMENT_BYTES)
        raise ConfigError("dtype", f"unknown dtype '{dtype}'; expected one of {known}") from None


def message_sizes(
    min_bytes: int, max_bytes: int, factor: int, world_size: int, elem_bytes: int
) -> list[int]:
    """The sweep min_bytes, min_bytes x factor, ... while <= max_bytes (nccl-tests'
    loop), each size rounded up to a multiple of elem_bytes x world_size so every
    rank's share is whole, duplicates (from rounding) dropped, ascending."""
    if min_bytes < 1:
        raise ConfigError("min_bytes", f"must be at least 1, got {min_bytes}")
    if max_bytes < min_bytes:
        raise ConfigError("max_bytes", f"must be >= min_bytes ({min_bytes}), got {max_bytes}")
    if factor < 2:
        raise ConfigError("factor", f"must be an integer >= 2, got {factor}")
    if world_size < 1:
        raise ConfigError("world_size", f"must be at least 1, got {world_size}")
    quantum = elem_bytes * world_size
    sizes: list[int] = []
    raw = min_bytes
    while raw <= max_bytes:
        rounded = -(-raw // quantum) * quantum
        if not sizes or rounded > sizes[-1]:
            sizes.append(rounded)
        raw *= factor
    return sizes


def element_count(collective: str, size_bytes: int, world_size: int, elem_bytes: int) -> int:
    """nccl-tests' printed `count` for a buffer of `size_bytes` (see module docstring)."""
    total = size_bytes // elem_bytes
    if collective in _WHOLE_COUNT:
        return total
    if collective in _SHARED_COUNT:
        return total // world_size
    raise ValueError(f"no element-count convention for collective '{collective}'")
