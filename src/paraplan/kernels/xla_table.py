"""Read XLA's measured GEMM table (the matmul interpolator's `GemmPerfTable`, text
protobuf: `xla/service/gpu/model/default_matmul_perf_table.txtpb`, or the same text
inside `matmul_interpolator_data.h`) as GEMM rows.

    entries {
      key: "sm_90"
      value {
        entries {
          b: 1  m: 1024  n: 2048  k: 256          (one field a line)
          flops { key: "bf16xbf16->bf16" value: 139519467775467 }
        }
      }
    }

Each `flops` line is one measurement of the entry above it: `value` FLOP/s for
`b` independent (m x k) @ (k x n) products; a row's `time_us` is 2 b m n k / value.
Rows of one device key (`sm_90`, `sm_100_B200`, ...) and one operand type are kept.
"""

from __future__ import annotations

import re
from pathlib import Path

from paraplan.core.errors import InputFileError
from paraplan.inputs import read_text

DTYPE_KEYS: dict[str, str] = {"bf16xbf16->bf16": "bfloat16", "f32xf32->f32": "float32",
                              "f16xf16->f16": "float16"}
_DEVICE = re.compile(r'^\s*key:\s*"([^"]+)"\s*$')
_DIM = re.compile(r"^\s*([bmnk]):\s*(\d+)\s*$")
_FLOPS = re.compile(r'^\s*flops\s*\{\s*key:\s*"([^"]+)"\s*value:\s*(\d+)\s*\}\s*$')
_ENTRY = re.compile(r"^\s*entries\s*\{\s*$")


def read_xla_table(path: Path, device_key: str, dtype_key: str = "bf16xbf16->bf16") -> list[dict[str, object]]:
    """The rows of `device_key` and `dtype_key` (GEMM_COLUMNS less kind/device/source)."""
    text = read_text(path, "XLA's matmul perf table (text protobuf GemmPerfTable)")
    device = ""
    dims: dict[str, int] = {}
    devices: set[str] = set()
    rows: list[dict[str, object]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if found := _DEVICE.match(line):
            device = found.group(1)
            devices.add(device)
        elif _ENTRY.match(line):
            dims = {}
        elif dim := _DIM.match(line):
            dims[dim.group(1)] = int(dim.group(2))
        elif flops := _FLOPS.match(line):
            if flops.group(1) != dtype_key or device != device_key:
                continue
            if set(dims) != {"b", "m", "n", "k"} or min(dims.values()) < 1:
                raise InputFileError(path, f"a flops line without the b, m, n, k of its entry (got {dims})",
                                     line=number)
            value = int(flops.group(2))
            if value <= 0:
                raise InputFileError(path, f"expected positive FLOP/s, got {value}", line=number)
            b, m, n, k = dims["b"], dims["m"], dims["n"], dims["k"]
            rows.append({"dtype": DTYPE_KEYS.get(dtype_key, dtype_key), "m": m, "n": n, "k": k, "batch": b,
                         "time_us": 2.0 * b * m * n * k / value * 1e6, "time_p10_us": None, "time_p90_us": None,
                         "tflops": value / 1e12})
        elif line.strip().startswith("flops"):
            raise InputFileError(path, f"a flops line that cannot be read: {line.strip()[:120]!r}", line=number)
    if not rows:
        raise InputFileError(path, f"no '{dtype_key}' measurements of device key '{device_key}' (device keys in the "
                             f"file: {', '.join(sorted(devices)) or 'none'})")
    return rows
