"""The kernel benchmark CSVs: one row per measured shape, the same tidy shape as the
collective sweeps (`time_us` the median, `time_p10_us`/`time_p90_us` the spread,
empty where a published table states none).

GEMM: `kind, device, dtype, m, n, k, batch, time_us, time_p10_us, time_p90_us, tflops,
source`; `batch` independent (m x k) @ (k x n) products, 2 m n k batch FLOPs.

Attention: `kind, device, dtype, pass, batch, heads, seq_length, head_dim, causal,
time_us, time_p10_us, time_p90_us, tflops, source`; `pass` is fwd, bwd or fwd_bwd. The
FLOPs are FlashAttention's convention (and the device model's): 4 batch heads s^2 d
for the forward, halved when causal; the backward 2.5 times the forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paraplan.core.errors import InputFileError
from paraplan.inputs import read_csv_table, read_text

GEMM_COLUMNS: tuple[str, ...] = ("kind", "device", "dtype", "m", "n", "k", "batch", "time_us", "time_p10_us",
                                 "time_p90_us", "tflops", "source")
ATTENTION_COLUMNS: tuple[str, ...] = ("kind", "device", "dtype", "pass", "batch", "heads", "seq_length", "head_dim",
                                      "causal", "time_us", "time_p10_us", "time_p90_us", "tflops", "source")
PASSES: tuple[str, ...] = ("fwd", "bwd", "fwd_bwd")
BACKWARD_FLOPS = 2.5  # flash attention's backward runs 5 products to the forward's 2


def gemm_flops(m: float, n: float, k: float, batch: float = 1) -> float:
    return 2.0 * m * n * k * batch


def attention_flops(batch: float, heads: float, seq_length: float, head_dim: float, causal: bool,
                    attention_pass: str) -> float:
    """FLOPs of one attention pass (see the module doc)."""
    forward = 4.0 * batch * heads * seq_length * seq_length * head_dim * (0.5 if causal else 1.0)
    return forward * {"fwd": 1.0, "bwd": BACKWARD_FLOPS, "fwd_bwd": 1.0 + BACKWARD_FLOPS}[attention_pass]


@dataclass(frozen=True)
class GemmTimes:
    """Measured GEMMs of one device and dtype, aligned columns."""

    device: str
    dtype: str
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    batch: np.ndarray
    time_s: np.ndarray

    def __len__(self) -> int:
        return int(self.m.shape[0])

    @property
    def flops(self) -> np.ndarray:
        return 2.0 * self.m * self.n * self.k * self.batch

    def subset(self, keep: np.ndarray) -> GemmTimes:
        return GemmTimes(self.device, self.dtype, self.m[keep], self.n[keep], self.k[keep], self.batch[keep],
                         self.time_s[keep])


@dataclass(frozen=True)
class AttentionTimes:
    """Measured attention passes of one device and dtype, aligned columns."""

    device: str
    dtype: str
    attention_pass: np.ndarray  # str: fwd, bwd, fwd_bwd
    batch: np.ndarray
    heads: np.ndarray
    seq_length: np.ndarray
    head_dim: np.ndarray
    causal: np.ndarray  # bool
    time_s: np.ndarray

    def __len__(self) -> int:
        return int(self.seq_length.shape[0])

    def subset(self, keep: np.ndarray) -> AttentionTimes:
        return AttentionTimes(self.device, self.dtype, self.attention_pass[keep], self.batch[keep], self.heads[keep],
                              self.seq_length[keep], self.head_dim[keep], self.causal[keep], self.time_s[keep])

    @property
    def flops(self) -> np.ndarray:
        return np.array([attention_flops(b, h, s, d, bool(c), p) for b, h, s, d, c, p in zip(
            self.batch, self.heads, self.seq_length, self.head_dim, self.causal, self.attention_pass, strict=True)])


@dataclass(frozen=True)
class KernelRows:
    """Every row of some kernel CSVs, checked, with the file and line each came from."""

    gemm: tuple[tuple[str, int, dict[str, object]], ...]
    attention: tuple[tuple[str, int, dict[str, object]], ...]

    def held_first(self) -> tuple[KernelRows, int]:
        """These rows less the burst-timed rows of every group that also has rows timed
        held at the power limit (`paraplan bench --hold-s`: `held` in the source), and how
        many were left out. A group: a device's GEMMs in one dtype; a device's attention
        rows of one kernel (the source's last part) and head dimension. Held timings are
        what a training step runs at; burst ones need a sustained factor (docs/kernels.md)."""
        def key(kind: str, r: dict[str, object]) -> tuple[object, ...]:
            if kind == "gemm":
                return (r["device"], r["dtype"])
            return (r["device"], str(r["source"]).rsplit(":", 1)[-1], r["head_dim"])

        def keep(kind: str, rows: tuple[tuple[str, int, dict[str, object]], ...]):
            held = {key(kind, r) for _, _, r in rows if is_held(str(r["source"]))}
            return tuple(x for x in rows if is_held(str(x[2]["source"])) or key(kind, x[2]) not in held)

        gemm, attention = keep("gemm", self.gemm), keep("attention", self.attention)
        return (KernelRows(gemm, attention),
                len(self.gemm) + len(self.attention) - len(gemm) - len(attention))

    def devices(self) -> list[str]:
        return sorted({str(r["device"]) for _, _, r in (*self.gemm, *self.attention)})

    def gemm_times(self, device: str, dtype: str, fast_accum: bool | None = None) -> GemmTimes:
        """The GEMMs of `device` in `dtype`; with `fast_accum` True or False, only the FP8
        rows timed with (source `...:fast-accum`) or without cuBLASLt's fast accumulation."""
        rows = [r for _, _, r in self.gemm if r["device"] == device and r["dtype"] == dtype
                and (fast_accum is None or ("fast-accum" in str(r["source"]).split(":")) == fast_accum)]
        col = {c: np.array([float(r[c]) for r in rows]) for c in ("m", "n", "k", "batch", "time_us")}  # type: ignore[arg-type]
        return GemmTimes(device, dtype, col["m"], col["n"], col["k"], col["batch"], col["time_us"] * 1e-6)

    def attention_times(self, device: str, dtype: str | None = None, source: str | None = None) -> AttentionTimes:
        rows = [r for _, _, r in self.attention if r["device"] == device and (dtype is None or r["dtype"] == dtype)
                and (source is None or str(r["source"]).endswith(source))]
        num = {c: np.array([float(r[c]) for r in rows]) for c in  # type: ignore[arg-type]
               ("batch", "heads", "seq_length", "head_dim", "time_us")}
        return AttentionTimes(device, dtype or "", np.array([r["pass"] for r in rows], dtype=object), num["batch"],
                              num["heads"], num["seq_length"], num["head_dim"],
                              np.array([bool(r["causal"]) for r in rows]), num["time_us"] * 1e-6)


def transformer_engine_fp8_mix(fast: GemmTimes, split: GemmTimes) -> GemmTimes:
    """The FP8 GEMMs of a Transformer Engine linear layer at one ceiling: its recipes run
    the forward GEMM with fast accumulation and the dgrad and wgrad GEMMs split
    (`use_split_accumulator`), so each shape measured both ways is timed as the mean of
    the three, (t_fast + 2 t_split) / 3. Shapes measured one way only are left out."""
    def by_shape(times: GemmTimes) -> dict[tuple[float, ...], float]:
        return {(m, n, k, b): t for m, n, k, b, t in zip(times.m, times.n, times.k, times.batch, times.time_s,
                                                          strict=True)}

    fast_s, split_s = by_shape(fast), by_shape(split)
    shapes = sorted(set(fast_s) & set(split_s))
    col = np.array(shapes, dtype=float).reshape(-1, 4)
    mixed = np.array([(fast_s[s] + 2.0 * split_s[s]) / 3.0 for s in shapes])
    return GemmTimes(fast.device, fast.dtype, col[:, 0], col[:, 1], col[:, 2], col[:, 3], mixed)


def is_held(source: str) -> bool:
    """A row timed held at the power limit (`paraplan bench --hold-s`): `held` among the
    source's colon-separated parts."""
    return "held" in source.split(":")


_POSITIVE_INT = ("m", "n", "k", "batch", "heads", "seq_length", "head_dim")


def _cell(path: Path, line: int, column: str, text: str) -> object:
    if column in ("kind", "device", "dtype", "pass", "source"):
        if not text and column != "source":
            raise InputFileError(path, "expected a value, got an empty cell", line=line, field=f"column '{column}'")
        return text
    if column == "causal":
        if text not in ("0", "1"):
            raise InputFileError(path, f"expected 0 or 1, got {text!r}", line=line, field="column 'causal'")
        return text == "1"
    if column in ("time_p10_us", "time_p90_us") and not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InputFileError(path, f"expected a number, got {text!r}", line=line, field=f"column '{column}'") from None
    if not np.isfinite(value) or value <= 0:
        raise InputFileError(path, f"expected a positive number, got {text!r}", line=line, field=f"column '{column}'")
    if column in _POSITIVE_INT and value != int(value):
        raise InputFileError(path, f"expected a whole number, got {text!r}", line=line, field=f"column '{column}'")
    return value


def read_kernel_csvs(paths: Sequence[Path]) -> KernelRows:
    """The rows of GEMM and attention CSVs (a file holds one kind, named by its header);
    a cell that is not what its column promises is an `InputFileError` naming it."""
    gemm: list[tuple[str, int, dict[str, object]]] = []
    attention: list[tuple[str, int, dict[str, object]]] = []
    for path in paths:
        text = read_text(path, "a kernel benchmark CSV (paraplan bench --kind gemm|attention)")
        first = text.split("\n", 1)[0]
        columns = ATTENTION_COLUMNS if "seq_length" in first else GEMM_COLUMNS
        table = read_csv_table(text, path, columns, columns)
        kind = "attention" if columns is ATTENTION_COLUMNS else "gemm"
        if not table.records:
            raise InputFileError(path, "no rows after the header")
        for line, record in table.records:
            row = {c: _cell(Path(path), line, c, record[c]) for c in columns}
            if row["kind"] != kind:
                raise InputFileError(path, f"expected '{kind}' (the header is a {kind} CSV's), got {row['kind']!r}",
                                     line=line, field="column 'kind'")
            if kind == "attention" and row["pass"] not in PASSES:
                raise InputFileError(path, f"expected one of {', '.join(PASSES)}, got {row['pass']!r}", line=line,
                                     field="column 'pass'")
            (attention if kind == "attention" else gemm).append((str(path), line, row))
    return KernelRows(tuple(gemm), tuple(attention))
