"""The sustained GEMM ceiling: how much of a burst GEMM ceiling a device holds when it
runs GEMMs back to back at its power limit, as in a training step.

Burst GEMM benchmarks (XLA's matmul table, the MAMF finder up to its v2) time a shape for
a fraction of a second, at the boost clock. Run for seconds, a dense GEMM draws the
board's power limit and the governor settles the SM clock below boost (an H200 at 700 W:
1,980 MHz in a burst, 1,405-1,527 MHz saturated). A sustained-GEMM CSV holds, per
device, dtype and measurement setup, the best burst and the best sustained throughput
measured in the same run (MAMF and MSMF of the MAMF finder v3):

    kind, device, dtype, setup, runs, burst_tflops, burst_m, burst_n, burst_k,
    burst_clock_mhz, burst_power_w, sustained_tflops, sustained_m, sustained_n, sustained_k,
    sustained_clock_min_mhz, sustained_clock_max_mhz, sustained_power_w, power_limit_w,
    torch_version, source

(`kind` is `gemm_sustained`; shapes, clocks and power may be empty where the source
gives none.) The sustained factor of a device and dtype is the geometric mean over its
rows of sustained_tflops / burst_tflops; `paraplan fit --kind kernels` multiplies the
burst fit's `gemm_efficiency` by it (docs/kernels.md). A device with no rows of its own
may take another's with `--sustained-from`: only a device of the same die at the same
power limit (the H100 SXM from the H200 SXM: GH100, 700 W).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from paraplan.core.errors import InputFileError
from paraplan.inputs import read_csv_table, read_text

SUSTAINED_COLUMNS: tuple[str, ...] = (
    "kind", "device", "dtype", "setup", "runs", "burst_tflops", "burst_m", "burst_n", "burst_k", "burst_clock_mhz",
    "burst_power_w", "sustained_tflops", "sustained_m", "sustained_n", "sustained_k", "sustained_clock_min_mhz",
    "sustained_clock_max_mhz", "sustained_power_w", "power_limit_w", "torch_version", "source")
_TEXT = ("kind", "device", "dtype", "setup", "torch_version", "source")
_REQUIRED_NUMBERS = ("runs", "burst_tflops", "sustained_tflops", "power_limit_w")
KIND = "gemm_sustained"


def is_sustained_csv(path: Path) -> bool:
    """A sustained-GEMM CSV (its header names `sustained_tflops`), not a kernel CSV."""
    return "sustained_tflops" in read_text(path, "a kernel CSV").split("\n", 1)[0]


@dataclass(frozen=True)
class SustainedRow:
    path: str
    line: int
    device: str
    dtype: str
    setup: str
    runs: int
    burst_tflops: float
    sustained_tflops: float
    power_limit_w: float

    @property
    def ratio(self) -> float:
        return self.sustained_tflops / self.burst_tflops


@dataclass(frozen=True)
class SustainedFactor:
    """sustained / burst of one device and dtype, from `rows` of the inputs."""

    device: str
    dtype: str
    factor: float
    rows: tuple[SustainedRow, ...]

    def as_dict(self, data: list[dict[str, object]]) -> dict[str, object]:
        ratios = [r.ratio for r in self.rows]
        return {"factor": self.factor, "from_device": self.device, "dtype": self.dtype,
                "power_limit_w": self.rows[0].power_limit_w, "n_rows": len(self.rows),
                "min_ratio": min(ratios), "max_ratio": max(ratios),
                "setups": [r.setup for r in self.rows], "data": data,
                "rule": "geometric mean over the rows of sustained_tflops / burst_tflops"}


def _number(path: Path, line: int, column: str, text: str) -> float | None:
    if not text and column not in _REQUIRED_NUMBERS:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InputFileError(path, f"expected a number, got {text!r}", line=line, field=f"column '{column}'") from None
    if not math.isfinite(value) or value <= 0:
        raise InputFileError(path, f"expected a positive number, got {text!r}", line=line, field=f"column '{column}'")
    return value


def read_sustained_csvs(paths: Sequence[Path]) -> tuple[SustainedRow, ...]:
    """The rows of sustained-GEMM CSVs, checked (see the module doc); a cell that is
    not what its column promises is an `InputFileError` naming it."""
    rows: list[SustainedRow] = []
    for path in paths:
        table = read_csv_table(read_text(path, "a sustained-GEMM CSV"), path, SUSTAINED_COLUMNS, SUSTAINED_COLUMNS)
        if not table.records:
            raise InputFileError(path, "no rows after the header")
        for line, record in table.records:
            for column in ("kind", "device", "dtype", "setup", "source"):
                if not record[column]:
                    raise InputFileError(path, "expected a value, got an empty cell", line=line,
                                         field=f"column '{column}'")
            if record["kind"] != KIND:
                raise InputFileError(path, f"expected '{KIND}', got {record['kind']!r}", line=line,
                                     field="column 'kind'")
            values = {c: _number(Path(path), line, c, record[c]) for c in SUSTAINED_COLUMNS if c not in _TEXT}
            if values["sustained_tflops"] > values["burst_tflops"]:  # type: ignore[operator]
                raise InputFileError(path, f"sustained_tflops {values['sustained_tflops']:g} above burst_tflops "
                                     f"{values['burst_tflops']:g}; expected a sustained rate no higher than the "
                                     "burst of the same run", line=line, field="column 'sustained_tflops'")
            rows.append(SustainedRow(str(path), line, record["device"], record["dtype"], record["setup"],
                                     int(values["runs"] or 0), float(values["burst_tflops"] or 0),
                                     float(values["sustained_tflops"] or 0), float(values["power_limit_w"] or 0)))
    return tuple(rows)


def sustained_factor(rows: Sequence[SustainedRow], device: str, dtype: str) -> SustainedFactor | None:
    """The sustained factor of `device` in `dtype` (None when the rows hold none of it).
    Rows of one device at two power limits are an error: the factor belongs to one."""
    mine = tuple(r for r in rows if r.device == device and r.dtype == dtype)
    if not mine:
        return None
    limits = sorted({r.power_limit_w for r in mine})
    if len(limits) > 1:
        raise InputFileError(mine[0].path, f"rows of {device} ({dtype}) at power limits "
                             f"{', '.join(f'{w:g} W' for w in limits)}; expected one")
    factor = math.exp(sum(math.log(r.ratio) for r in mine) / len(mine))
    return SustainedFactor(device, dtype, factor, mine)
