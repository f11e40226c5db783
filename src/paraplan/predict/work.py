"""The work of one pass before any device prices it: its kernels (`Kernels`, one row per
kernel: kind, FLOPs, bytes, GEMM shape) and its collectives (`Collective`), as
`paraplan.predict.ops` and the other `*_ops` modules build them (`_Builder`), and a
layer's three passes with its activations (`LayerWork`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np


class KernelKind(IntEnum):
    """What prices a kernel (`Kernels.kind`, int8): the GEMM model, the attention
    model, memory bandwidth, or the GEMM model at the FP8 ceiling (a linear layer's GEMM
    in an fp8 run; `paraplan.predict.device_model`, `paraplan.predict.fp8_ops`)."""

    GEMM = 0
    ATTENTION = 1
    MEMORY = 2
    FP8_GEMM = 3


GEMM, ATTENTION, MEMORY, FP8_GEMM = KernelKind.GEMM, KernelKind.ATTENTION, KernelKind.MEMORY, KernelKind.FP8_GEMM
FP8_OPERAND_BYTES = 1  # an FP8 GEMM's input element (`DTYPE_BYTES["fp8"]`)
NOT_HIDDEN = -1
"""`Collective.hidden_by` of a collective the compute stream waits for (no kernel beside it)."""
# `Kernels`' columns, in order
KERNEL_FIELDS_ORDER = ("kind", "flops", "bytes", "m", "n", "k", "batch", "weight_grad", "launches")


@dataclass(frozen=True, eq=False)
class Kernels:
    """Aligned columns, one entry per kernel. A GEMM is `batch` independent
    (m x k) @ (k x n) products; a fused attention kernel has m = its sequence length
    and n = 1 for the backward pass (0 forward); other kernels have m = n = k = 0 and
    batch 1. `launches`: the device launches of the row, each paying the kernel latency:
    1, but a grouped GEMM's `batch` (one GEMM per local expert, `paraplan.predict.moe_ops`)
    and a framework call that launches several memory kernels (the FP8 casts of a grouped
    GEMM's splits, `paraplan.predict.fp8_ops`)."""

    kind: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray  # read + written
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    batch: np.ndarray
    weight_grad: np.ndarray  # bool: computes a weight gradient (deferrable in split-backward schedules)
    launches: np.ndarray

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    @property
    def total_flops(self) -> float:
        return float(self.flops.sum())


@dataclass(frozen=True)
class Collective:
    """One collective; `nbytes` in nccl-tests' convention (all_gather: the gathered
    output; reduce_scatter: the input; all_to_all: the per-rank total). `hidden_by` is
    the index of the kernel of the same pass it runs beside (`NOT_HIDDEN`: the compute
    stream waits for it), `hidden_span` how many consecutive kernels from there it runs
    beside (1: that kernel alone; a MoE all-to-all beside a whole module). `group`: `tp`,
    the tensor-parallel group; `cp` / `cp_ring`, the context-parallel group / one of its
    ring hops (`paraplan.predict.cp_ops`); `ep` / `etp`, the expert-parallel /
    expert-tensor-parallel group (`paraplan.predict.moe_ops`)."""

    collective: str
    nbytes: float
    hidden_by: int = NOT_HIDDEN
    group: str = "tp"
    hidden_span: int = 1


@dataclass(frozen=True)
class PassWork:
    """The kernels and collectives of one pass."""

    kernels: Kernels
    collectives: tuple[Collective, ...] = ()
    host_syncs: tuple[tuple[int, int], ...] = ()
    """Each time the host waits for the device inside the pass (`paraplan.predict.moe_host`):
    the kernels [first, end) still queued on the device when the wait ends."""


@dataclass
class _Builder:
    """Accumulates kernels and collectives of one pass."""

    gemm_bytes: int  # bytes per GEMM operand element
    accumulate_bytes_per_param: float = 0.0  # unfused gradient accumulation after each weight gradient
    rows: list[tuple[int, float, float, float, float, float, float, bool, float]] = field(default_factory=list)
    collectives: list[Collective] = field(default_factory=list)
    host_syncs: list[tuple[int, int]] = field(default_factory=list)

    def gemm(self, m: float, k: float, n: float, batch: float = 1.0, weight_grad: bool = False,
             high_precision: bool = False, grouped: bool = False) -> int:
        """(m x k) @ (k x n), `batch` times; returns its kernel index. `grouped`: the `batch`
        products are a grouped GEMM's groups, one launch each (`Kernels.launches`); else one
        batched kernel. In an fp8 run (1-byte
        operands) a linear layer's GEMM is an `FP8_GEMM` (FP8 inputs, BF16 output); one
        that Transformer Engine keeps in 16 bits (`high_precision`: attention core, LM
        head, router) has 2-byte operands (`paraplan.predict.fp8_ops`)."""
        flops = 2.0 * m * k * n * batch
        kind, nbytes = GEMM, self.gemm_bytes * (m * k + k * n + m * n) * batch
        if self.gemm_bytes == FP8_OPERAND_BYTES:
            kind, nbytes = ((GEMM, 2 * (m * k + k * n + m * n) * batch) if high_precision
                            else (FP8_GEMM, (m * k + k * n + 2 * m * n) * batch))
        self.rows.append((kind, flops, nbytes, m, n, k, batch, weight_grad, batch if grouped else 1.0))
        index = len(self.rows) - 1
        if weight_grad and self.accumulate_bytes_per_param:
            self.rows.append((MEMORY, 0.0, self.accumulate_bytes_per_param * m * n * batch, 0.0, 0.0, 0.0, 1.0,
                              True, 1.0))
        return index

    def attention(self, flops: float, nbytes: float, seq_length: float, backward: bool) -> int:
        self.rows.append((ATTENTION, flops, nbytes, seq_length, 1.0 if backward else 0.0, 0.0, 1.0, False, 1.0))
        return len(self.rows) - 1

    def memory(self, nbytes: float) -> int:
        self.rows.append((MEMORY, 0.0, nbytes, 0.0, 0.0, 0.0, 1.0, False, 1.0))
        return len(self.rows) - 1

    def comm(self, collective: str, nbytes: float, hidden_by: int = NOT_HIDDEN, group: str = "tp") -> None:
        self.collectives.append(Collective(collective, float(nbytes), hidden_by, group))

    def build(self) -> PassWork:
        cols = np.array(self.rows, dtype=float).T if self.rows else np.zeros((len(KERNEL_FIELDS_ORDER), 0))
        kernels = Kernels(cols[0].astype(np.int8), cols[1], cols[2], cols[3], cols[4], cols[5], cols[6],
                          cols[7].astype(bool), cols[8])
        return PassWork(kernels, tuple(self.collectives), tuple(self.host_syncs))


@dataclass(frozen=True)
class LayerWork:
    """One transformer layer, one micro-batch, one tensor-parallel rank."""

    forward: PassWork
    backward: PassWork  # input and weight gradients
    recompute: PassWork  # forward work redone during backward (empty without recomputation)
    activation_bytes: float  # held from the forward until the backward, per micro-batch
