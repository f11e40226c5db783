"""Read the log of the Maximum Achievable Matmul FLOPS finder (stas00/ml-engineering,
`compute/accelerator/benchmarks/mamf-finder.py`, its `--output_file`) as GEMM rows.

The log starts with a header (`** Dtype: torch.bfloat16`, the device's properties
`_CudaDeviceProperties(name='NVIDIA H100 80GB HBM3', ...)`), then one line per shape:

     12 |  751.3(mean)  752.0(median)  760.1(max) @ 4096x4096x4096        | best: ...

A row's `time_us` is the shape's median converted back to time (2 m n k / median);
the mean and max are throughput figures the finder prints, not percentiles, so the
p10/p90 columns stay empty. The summary at the end ("Tried N shapes ...") is skipped.
A line that starts like a shape line but cannot be read is an error naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from paraplan.core.errors import InputFileError
from paraplan.inputs import read_text

_SHAPE = re.compile(r"^\s*(\d+)\s*\|\s*([0-9.]+)\(mean\)\s+([0-9.]+)\(median\)\s+([0-9.]+)\(max\)\s*@\s*"
                    r"(\d+)x(\d+)x(\d+)\s*\|")
_STARTS_LIKE_SHAPE = re.compile(r"^\s*\d+\s*\|.*\(mean\)")
_DTYPE = re.compile(r"^\*\* Dtype:\s*(?:torch\.)?(\w+)")
_DEVICE = re.compile(r"name='([^']+)'")


@dataclass(frozen=True)
class MamfLog:
    dtype: str
    device: str  # as the log names it ('' when it does not)
    rows: tuple[dict[str, object], ...]  # GEMM_COLUMNS less kind/device/source


def read_mamf(path: Path) -> MamfLog:
    text = read_text(path, "a mamf-finder.py log (its --output_file)")
    dtype = device = ""
    rows: list[dict[str, object]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not dtype and (found := _DTYPE.match(line)):
            dtype = found.group(1)
            continue
        if not device and (named := _DEVICE.search(line)):
            device = named.group(1)
            continue
        shape = _SHAPE.match(line)
        if shape is None:
            if _STARTS_LIKE_SHAPE.match(line):
                raise InputFileError(path, f"a shape line that cannot be read: {line.strip()[:120]!r}", line=number)
            continue
        median_tflops = float(shape.group(3))
        m, n, k = (int(shape.group(i)) for i in (5, 6, 7))
        if median_tflops <= 0 or min(m, n, k) < 1:
            raise InputFileError(path, "expected a positive median TFLOPS and shape", line=number)
        rows.append({"dtype": dtype, "m": m, "n": n, "k": k, "batch": 1,
                     "time_us": 2.0 * m * n * k / (median_tflops * 1e12) * 1e6, "time_p10_us": None,
                     "time_p90_us": None, "tflops": median_tflops})
    if not rows:
        raise InputFileError(path, "no shape lines ('N | x(mean) y(median) z(max) @ MxNxK | ...'): not a mamf-finder "
                             "log?")
    if not dtype:
        raise InputFileError(path, "no '** Dtype:' line in the header")
    return MamfLog(dtype, device, tuple({**r, "dtype": dtype} for r in rows))
