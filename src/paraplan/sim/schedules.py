"""Pipeline schedules: each one a small object that orders every stage's operations.

A schedule answers one question: in which order does pipeline device `s` run its
forwards (F), backwards (B) and, for split-backward schedules, weight-gradient
passes (W)? The engine (`paraplan.sim.engine`) then runs those orders as soon as
dependencies allow, so a schedule carries no timing at all.

Conventions: `p` devices (pipeline stages), `M` micro-batches per iteration, `v`
model chunks per device (virtual stages, interleaved only). Micro-batches are
numbered across iterations: iteration e, index i -> e x M + i. Chunk c on device s
is virtual stage c x p + s (Megatron's interleaving).

Flushed schedules (gpipe, 1f1b, eager_1f1b, interleaved_1f1b, zb_h1,
distir_greedy) repeat one iteration's order; the engine's in-order execution then
reproduces the flush (the next iteration's first forward on stage 0 waits for that
stage's last backward). The no-flush schedules (2bw, eager_1f1b_noflush) order all
iterations as one long 1F1B stream, as PipeDream-2BW does with double-buffered
weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import numpy as np

from paraplan.core.errors import StrategyError
from paraplan.core.glossary import SCHEDULES, PipelineOp, ScheduleName
from paraplan.sim.op_cache import OpsBoundedCache

FWD, BWD, WGT = PipelineOp.FWD, PipelineOp.BWD, PipelineOp.WGT
OP_LETTERS = tuple(op.letter for op in PipelineOp)


@dataclass(frozen=True, eq=False)
class OpOrder:
    """The ordered operations of one pipeline device (three aligned int arrays)."""

    kind: np.ndarray  # FWD, BWD or WGT
    microbatch: np.ndarray  # across iterations: e x M + i
    chunk: np.ndarray  # model chunk on this device (0 unless interleaved)

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    def labels(self) -> list[str]:
        """Readable form, e.g. ['F0', 'F1', 'B0', ...] (chunk suffix when interleaved)."""
        multi = bool(self.chunk.size and self.chunk.max() > 0)
        return [
            f"{OP_LETTERS[k]}{m}" + (f".{c}" if multi else "")
            for k, m, c in zip(self.kind.tolist(), self.microbatch.tolist(), self.chunk.tolist(), strict=True)
        ]


def _order(kinds: np.ndarray, mbs: np.ndarray, chunks: np.ndarray | None = None) -> OpOrder:
    kinds = np.asarray(kinds, dtype=np.int8)
    mbs = np.asarray(mbs, dtype=np.int64)
    chunks = np.zeros_like(mbs) if chunks is None else np.asarray(chunks, dtype=np.int64)
    return OpOrder(kinds, mbs, chunks)


def _concat(orders: list[OpOrder]) -> OpOrder:
    return OpOrder(
        np.concatenate([o.kind for o in orders]),
        np.concatenate([o.microbatch for o in orders]),
        np.concatenate([o.chunk for o in orders]),
    )


def one_f_one_b_order(num_microbatches: int, warmup: int) -> OpOrder:
    """`warmup` forwards, then alternate one forward and one backward, then drain the
    remaining backwards (micro-batches 0..n-1 in order)."""
    n = num_microbatches
    w = min(warmup, n)
    steady = n - w
    kinds = np.empty(2 * n, dtype=np.int8)
    mbs = np.empty(2 * n, dtype=np.int64)
    kinds[:w] = FWD
    mbs[:w] = np.arange(w)
    # steady state: F(w + i), B(i) for i < steady
    kinds[w : w + 2 * steady : 2] = FWD
    mbs[w : w + 2 * steady : 2] = np.arange(w, n)
    kinds[w + 1 : w + 2 * steady : 2] = BWD
    mbs[w + 1 : w + 2 * steady : 2] = np.arange(steady)
    kinds[w + 2 * steady :] = BWD
    mbs[w + 2 * steady :] = np.arange(steady, n)
    return _order(kinds, mbs)


def _repeat_iterations(one: OpOrder, num_microbatches: int, iterations: int) -> OpOrder:
    """Repeat one iteration's order, shifting micro-batch numbers by e x M."""
    if iterations == 1:
        return one
    return _concat(
        [OpOrder(one.kind, one.microbatch + e * num_microbatches, one.chunk) for e in range(iterations)]
    )


class Schedule:
    """One interface for every schedule: `check` rejects impossible requests with a
    `StrategyError` saying why; `orders` gives each device's ordered ops."""

    name: ClassVar[ScheduleName]
    split_backward: ClassVar[bool] = False  # backward split into B (input grad) and W (weight grad)
    flush: ClassVar[bool] = True  # False: iterations run as one stream (stale weights)
    weight_versions: ClassVar[int] = 1  # copies of the weights held (2BW keeps two)

    def check(self, num_stages: int, num_microbatches: int, virtual_stages: int = 1) -> None:
        if num_stages < 1 or num_microbatches < 1:
            raise StrategyError(
                f"schedule '{self.name}' needs >= 1 stage and >= 1 micro-batch, "
                f"got {num_stages} stages and {num_microbatches} micro-batches"
            )
        if virtual_stages != 1:
            raise StrategyError(
                f"schedule '{self.name}' runs one model chunk per device; virtual_pipeline_model_parallel_size="
                f"{virtual_stages} needs schedule 'interleaved_1f1b'"
            )

    def orders(
        self, num_stages: int, num_microbatches: int, iterations: int = 1, virtual_stages: int = 1
    ) -> list[OpOrder]:
        self.check(num_stages, num_microbatches, virtual_stages)
        if iterations < 1:
            raise StrategyError(f"iterations must be >= 1, got {iterations}")
        return self.device_orders(num_stages, num_microbatches, iterations, virtual_stages)

    def device_orders(
        self, num_stages: int, num_microbatches: int, iterations: int, virtual_stages: int
    ) -> list[OpOrder]:
        """Each device's ops for a checked request; flushed schedules repeat one iteration."""
        return [
            _repeat_iterations(self.iteration_order(num_stages, num_microbatches, s), num_microbatches, iterations)
            for s in range(num_stages)
        ]

    def iteration_order(self, num_stages: int, num_microbatches: int, stage: int) -> OpOrder:
        raise NotImplementedError

    def stage_order(self, num_stages: int, num_microbatches: int, virtual_stages: int, stage: int) -> OpOrder:
        """One iteration's ops of one device alone (what `orders` gives that device at
        iterations=1), without building the other devices' orders: memory in the
        micro-batches, not in the stages times the micro-batches. Schedules that order
        their devices together (no flush, DistIR's rounds) build them all."""
        if type(self).device_orders is not Schedule.device_orders:
            return self.orders(num_stages, num_microbatches, 1, virtual_stages)[stage]
        self.check(num_stages, num_microbatches, virtual_stages)
        return self.iteration_order(num_stages, num_microbatches, stage)


class GPipe(Schedule):
    """F-then-B: all M forwards, then all M backwards; flush."""

    name: ClassVar[ScheduleName] = "gpipe"

    def iteration_order(self, num_stages: int, num_microbatches: int, stage: int) -> OpOrder:
        m = np.arange(num_microbatches)
        return _order(
            np.repeat(np.array([FWD, BWD], dtype=np.int8), num_microbatches), np.concatenate([m, m])
        )


class OneFOneB(Schedule):
    """PipeDream-Flush: min(p - s - 1, M) warm-up forwards, then 1F1B, then drain; flush."""

    name: ClassVar[ScheduleName] = "1f1b"

    def warmup(self, num_stages: int, num_microbatches: int, stage: int) -> int:
        return min(num_stages - stage - 1, num_microbatches)

    def iteration_order(self, num_stages: int, num_microbatches: int, stage: int) -> OpOrder:
        return one_f_one_b_order(num_microbatches, self.warmup(num_stages, num_microbatches, stage))


class EagerOneFOneB(OneFOneB):
    """Eager 1F1B: min(2 (p - s - 1), M) warm-up forwards, so a forward can overlap the
    previous step's communication; more activation memory; flush."""

    name: ClassVar[ScheduleName] = "eager_1f1b"

    def warmup(self, num_stages: int, num_microbatches: int, stage: int) -> int:
        return min(2 * (num_stages - stage - 1), num_microbatches)


class TwoBW(OneFOneB):
    """PipeDream-2BW: 1F1B without flushes; all iterations form one 1F1B stream (the
    warm-up still counts the micro-batches of one iteration). Needs p <= M."""

    name: ClassVar[ScheduleName] = "2bw"
    flush = False
    weight_versions = 2

    def check(self, num_stages: int, num_microbatches: int, virtual_stages: int = 1) -> None:
        super().check(num_stages, num_microbatches, virtual_stages)
        if num_stages > num_microbatches:
            raise StrategyError(
                f"schedule '{self.name}' (1F1B without flushes) needs at least as many micro-batches "
                f"per iteration as pipeline stages: {num_stages} stages > {num_microbatches} micro-batches"
            )

    def device_orders(
        self, num_stages: int, num_microbatches: int, iterations: int, virtual_stages: int
    ) -> list[OpOrder]:
        total = num_microbatches * iterations
        return [
            one_f_one_b_order(total, self.warmup(num_stages, num_microbatches, s)) for s in range(num_stages)
        ]


class EagerNoFlush(TwoBW):
    """Eager 1F1B without flushes (eager warm-up + 2BW). Needs p < M."""

    name: ClassVar[ScheduleName] = "eager_1f1b_noflush"

    def warmup(self, num_stages: int, num_microbatches: int, stage: int) -> int:
        return min(2 * (num_stages - stage - 1), num_microbatches)

    def check(self, num_stages: int, num_microbatches: int, virtual_stages: int = 1) -> None:
        Schedule.check(self, num_stages, num_microbatches, virtual_stages)
        if num_stages >= num_microbatches:
            raise StrategyError(
                f"schedule '{self.name}' (eager 1F1B without flushes) needs more micro-batches per "
                f"iteration than pipeline stages: {num_stages} stages >= {num_microbatches} micro-batches"
            )


class Interleaved(Schedule):
    """Megatron's interleaved 1F1B: v model chunks per device (virtual stage c x p + s).
    Forwards go in groups of p micro-batches per chunk; warm-up (p - s - 1) x 2 +
    (v - 1) x p ops; bubble / ideal = (p - 1) / (v M). Needs M divisible by p (when
    v > 1); v = 1 is plain 1F1B."""

    name: ClassVar[ScheduleName] = "interleaved_1f1b"

    def check(self, num_stages: int, num_microbatches: int, virtual_stages: int = 1) -> None:
        if virtual_stages < 1:
            raise StrategyError(f"virtual_stages must be >= 1, got {virtual_stages}")
        Schedule.check(self, num_stages, num_microbatches, 1)
        if virtual_stages > 1 and num_microbatches % num_stages != 0:
            raise StrategyError(
                f"schedule '{self.name}' needs the micro-batch count divisible by the pipeline "
                f"degree: {num_microbatches} micro-batches over {num_stages} stages"
            )

    def device_orders(
        self, num_stages: int, num_microbatches: int, iterations: int, virtual_stages: int
    ) -> list[OpOrder]:
        return [
            _repeat_iterations(
                self.device_order(num_stages, num_microbatches, virtual_stages, s), num_microbatches, iterations
            )
            for s in range(num_stages)
        ]

    def stage_order(self, num_stages: int, num_microbatches: int, virtual_stages: int, stage: int) -> OpOrder:
        self.check(num_stages, num_microbatches, virtual_stages)
        return self.device_order(num_stages, num_microbatches, virtual_stages, stage)

    def device_order(self, p: int, n_mb: int, v: int, stage: int) -> OpOrder:
        if v == 1:
            return one_f_one_b_order(n_mb, min(p - stage - 1, n_mb))
        total = v * n_mb
        k = np.arange(total)
        mb_of = (k // (p * v)) * p + (k % p)
        fwd_chunk = (k // p) % v
        bwd_chunk = v - 1 - fwd_chunk
        warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
        steady = total - warm
        kinds = np.empty(2 * total, dtype=np.int8)
        mbs = np.empty(2 * total, dtype=np.int64)
        chunks = np.empty(2 * total, dtype=np.int64)
        kinds[:warm], mbs[:warm], chunks[:warm] = FWD, mb_of[:warm], fwd_chunk[:warm]
        sl_f = slice(warm, warm + 2 * steady, 2)
        sl_b = slice(warm + 1, warm + 2 * steady, 2)
        kinds[sl_f], mbs[sl_f], chunks[sl_f] = FWD, mb_of[warm:], fwd_chunk[warm:]
        kinds[sl_b], mbs[sl_b], chunks[sl_b] = BWD, mb_of[:steady], bwd_chunk[:steady]
        tail = slice(warm + 2 * steady, None)
        kinds[tail], mbs[tail], chunks[tail] = BWD, mb_of[steady:], bwd_chunk[steady:]
        return _order(kinds, mbs, chunks)


class ZeroBubbleH1(Schedule):
    """ZB-H1 (Qi et al.): backward split into B (input gradient, on the critical path)
    and W (weight gradient, deferrable). Stage s runs 1F1B's warm-up of p - s - 1
    forwards, then F, B and the W of micro-batch i - s, so at most p micro-batches
    are in flight on any stage (1F1B's peak), and the deferred Ws fill the drain.
    Bubble with F = B = W: (p - 1)(t_F + t_B - t_W), a third of 1F1B's."""

    name: ClassVar[ScheduleName] = "zb_h1"
    split_backward = True

    def iteration_order(self, num_stages: int, num_microbatches: int, stage: int) -> OpOrder:
        p, n = num_stages, num_microbatches
        w = min(p - stage - 1, n)
        delay = stage
        kinds: list[int] = [FWD] * w
        mbs: list[int] = list(range(w))
        next_w = 0
        for i in range(n):
            if w + i < n:
                kinds.append(FWD)
                mbs.append(w + i)
            kinds.append(BWD)
            mbs.append(i)
            if i - delay >= 0:
                kinds.append(WGT)
                mbs.append(next_w)
                next_w += 1
        kinds.extend([WGT] * (n - next_w))
        mbs.extend(range(next_w, n))
        return _order(np.array(kinds), np.array(mbs))


@lru_cache(maxsize=256)
def distir_greedy_rounds(num_stages: int, num_microbatches: int) -> tuple[tuple[tuple[int, bool, int], ...], ...]:
    """DistIR's PipeDream scheduler (docs/distir-cost-model.md): per round, each stage with a ready unit
    runs one; after a forward it prefers a backward, otherwise a forward, lowest
    micro-batch first; readiness counts only units of earlier rounds; no warm-up limit.

    Returns the rounds, each a tuple of (stage, is_forward, micro-batch), stages ascending.
    """
    p, n = num_stages, num_microbatches
    next_f = [0] * p  # forwards and backwards of a stage run in micro-batch order
    next_b = [0] * p
    last_was_f = [False] * p
    rounds = []
    while next_b[0] < n:
        done_f, done_b = list(next_f), list(next_b)  # state at the start of the round
        units = []
        for s in range(p):
            f_ready = next_f[s] < n and (s == 0 or done_f[s - 1] > next_f[s])
            b_ready = next_b[s] < done_f[s] and (s == p - 1 or done_b[s + 1] > next_b[s])
            if not (f_ready or b_ready):
                continue
            take_f = f_ready if not last_was_f[s] else not b_ready
            if take_f:
                units.append((s, True, next_f[s]))
                next_f[s] += 1
            else:
                units.append((s, False, next_b[s]))
                next_b[s] += 1
            last_was_f[s] = take_f
        rounds.append(tuple(units))
    return tuple(rounds)


class DistIRGreedy(Schedule):
    """DistIR's greedy rounds (`distir_greedy_rounds`), each stage's units in the order
    it picks them; flush."""

    name: ClassVar[ScheduleName] = "distir_greedy"

    def device_orders(
        self, num_stages: int, num_microbatches: int, iterations: int, virtual_stages: int
    ) -> list[OpOrder]:
        kinds: list[list[int]] = [[] for _ in range(num_stages)]
        mbs: list[list[int]] = [[] for _ in range(num_stages)]
        for units in distir_greedy_rounds(num_stages, num_microbatches):
            for stage, is_forward, mb in units:
                kinds[stage].append(FWD if is_forward else BWD)
                mbs[stage].append(mb)
        return [
            _repeat_iterations(_order(np.array(k), np.array(m)), num_microbatches, iterations)
            for k, m in zip(kinds, mbs, strict=True)
        ]


_REGISTRY: dict[str, Schedule] = {
    cls.name: cls()
    for cls in (GPipe, OneFOneB, TwoBW, EagerOneFOneB, EagerNoFlush, Interleaved, ZeroBubbleH1, DistIRGreedy)
}
assert tuple(_REGISTRY) == SCHEDULES, "schedule registry must list paraplan.core.SCHEDULES in order"


_ORDERS: OpsBoundedCache[tuple[OpOrder, ...]] = OpsBoundedCache()


def cached_orders(name: str, num_stages: int, num_microbatches: int, iterations: int = 1,
                  virtual_stages: int = 1) -> tuple[OpOrder, ...]:
    """`get_schedule(name).orders(...)` as a tuple, computed once per request while it
    stays in a cache bounded by operations (`paraplan.sim.op_cache`); the orders are
    never modified, and the engine caches its own preparation of them the same way."""
    def make() -> tuple[tuple[OpOrder, ...], int]:
        orders = tuple(get_schedule(name).orders(num_stages, num_microbatches, iterations, virtual_stages))
        return orders, sum(len(o) for o in orders)

    return _ORDERS.get((name, num_stages, num_microbatches, iterations, virtual_stages), make)


def get_schedule(name: str) -> Schedule:
    """The schedule named `name` (names as in `paraplan.core.SCHEDULES`)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise StrategyError(f"unknown schedule '{name}'; known: {', '.join(SCHEDULES)}") from None
