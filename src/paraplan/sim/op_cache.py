"""A least-recently-used cache bounded by the pipeline operations it holds, not by its
number of entries: a calibration re-runs thousands of small pipelines (cached), while
a planner or a long run table meets pipelines of millions of operations, each of
which would otherwise stay in memory (1,024 entries of up to `MAX_SIMULATED_OPS`
operations: tens of GB).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")

CACHE_OPS = 2**20
"""Operations one cache holds at most (about a million: under 100 MB as op orders or
as the engine's lists); a value larger than an eighth of this is not cached."""


class OpsBoundedCache(Generic[V]):
    def __init__(self, budget_ops: int = CACHE_OPS) -> None:
        self.budget_ops = budget_ops
        self.held_ops = 0
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()

    def get(self, key: Hashable, make: Callable[[], tuple[V, int]]) -> V:
        """The value for `key`, made by `make()` (value, its operations) on a miss."""
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            return hit[0]
        value, ops = make()
        if ops <= self.budget_ops // 8:
            self._entries[key] = (value, ops)
            self.held_ops += ops
            while self.held_ops > self.budget_ops:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.held_ops -= dropped
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.held_ops = 0
