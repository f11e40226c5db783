"""`paraplan ingest --format xla-matmul`: XLA's GemmPerfTable text (here its first
three sm_90 entries, as published) gives back the rows of the transcribed
data/published/gemm/xla_h100_sm90_bf16.csv; other device keys and types are skipped."""

from __future__ import annotations

import pytest

from paraplan.cli.main import main
from paraplan.core import InputFileError
from paraplan.kernels.results import read_kernel_csvs
from paraplan.kernels.xla_table import read_xla_table

TABLE = """
constexpr char kDefaultMatmulPTable[] = R"pb(
  entries {
    key: "sm_90"
    value {
      entries {
        b: 1
        m: 1024
        n: 2048
        k: 256
        flops { key: "bf16xbf16->bf16" value: 139519467775467 }
        flops { key: "f32xf32->f32" value: 82342164417177 }
      }
      entries {
        b: 2
        m: 256
        n: 2048
        k: 2048
        flops { key: "bf16xbf16->bf16" value: 332247798870580 }
        flops { key: "f32xf32->f32" value: 147979854465270 }
      }
      entries {
        b: 1
        m: 256
        n: 2048
        k: 256
        flops { key: "bf16xbf16->bf16" value: 41838443890274 }
        flops { key: "f32xf32->f32" value: 32140260536398 }
      }
    }
  }
  entries {
    key: "sm_100"
    value {
      entries {
        b: 1
        m: 256
        n: 256
        k: 256
        flops { key: "bf16xbf16->bf16" value: 6765006451612 }
      }
    }
  }
)pb";
"""


def test_the_table_gives_back_the_transcribed_rows(tmp_path, repo_root):
    path = tmp_path / "table.h"
    path.write_text(TABLE)
    out = tmp_path / "h100.csv"
    assert main(["ingest", "--format", "xla-matmul", str(path), "--device-key", "sm_90", "--device",
                 "H100-SXM5-80GB", "-o", str(out), "--no-track"]) == 0
    ours = read_kernel_csvs([out]).gemm_times("H100-SXM5-80GB", "bfloat16")
    shipped = read_kernel_csvs([repo_root / "data/published/gemm/xla_h100_sm90_bf16.csv"]).gemm_times(
        "H100-SXM5-80GB", "bfloat16")
    assert len(ours) == 3
    for field in ("m", "n", "k", "batch"):
        assert list(getattr(ours, field)) == list(getattr(shipped, field)[:3])
    assert list(ours.time_s) == pytest.approx(list(shipped.time_s[:3]), rel=1e-5)
    assert [r["tflops"] for r in read_xla_table(path, "sm_100")] == [6.765006451612]


def test_a_missing_device_key_lists_those_in_the_file(tmp_path):
    path = tmp_path / "table.h"
    path.write_text(TABLE)
    with pytest.raises(InputFileError, match="device keys in the file: sm_100, sm_90"):
        read_xla_table(path, "sm_80")
