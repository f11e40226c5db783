"""`paraplan ingest --format mamf`: a mamf-finder.py log (its --output_file, whose
format is reproduced here line for line) becomes GEMM rows whose time gives back the
median TFLOPS; a damaged shape line is an error naming it."""

from __future__ import annotations

import pytest

from paraplan.cli.main import main
from paraplan.core import InputFileError
from paraplan.kernels.mamf import read_mamf
from paraplan.kernels.results import read_kernel_csvs

_BEST = "| best:  600.5(mean)  601.0(median)  640.2(max) TFLOPS"  # (the finder's running best, ignored)
LOG = """
Benchmark started on 2026-11-25 20:00:00

** Command line:
/usr/bin/python ./mamf-finder.py --m_range 1024 2048 1024 --n 4096 --k 4096 --output_file=out.txt

** Dtype: torch.bfloat16

** Platform/Device info:
- Linux node 6.8.0 #1 SMP x86_64 x86_64
- _CudaDeviceProperties(name='NVIDIA H100 80GB HBM3', major=9, minor=0, total_memory=81089MB, multi_processor_count=132)

** Critical software versions:
- torch=2.7.0+cu126
- cuda=12.6

--------------------------------------------------------------------------------

Warming up the accelerator for 30 secs ... accelerator warmup finished
     1 |  600.5(mean)  601.0(median)  640.2(max) @ 1024x4096x4096        {best}
     2 |  700.1(mean)  702.5(median)  731.0(max) @ 2048x4096x4096        {best}

Tried 2 shapes => the best outcomes were:
mean:   700.1 TFLOPS @ 2048x4096x4096 (MxNxK)
median: 702.5 TFLOPS @ 2048x4096x4096 (MxNxK)
max:    731.0 TFLOPS @ 2048x4096x4096 (MxNxK)
""".replace("{best}", _BEST)


def test_a_mamf_log_becomes_gemm_rows(tmp_path):
    log = tmp_path / "mamf.txt"
    log.write_text(LOG)
    parsed = read_mamf(log)
    assert parsed.dtype == "bfloat16" and parsed.device == "NVIDIA H100 80GB HBM3"
    assert [(r["m"], r["n"], r["k"]) for r in parsed.rows] == [(1024, 4096, 4096), (2048, 4096, 4096)]
    out = tmp_path / "gemm.csv"
    assert main(["ingest", "--format", "mamf", str(log), "--device", "H100-SXM5-80GB", "-o", str(out),
                 "--no-track"]) == 0
    times = read_kernel_csvs([out]).gemm_times("H100-SXM5-80GB", "bfloat16")
    assert times.flops / times.time_s == pytest.approx([601.0e12, 702.5e12])


def test_a_damaged_shape_line_is_named(tmp_path):
    log = tmp_path / "mamf.txt"
    log.write_text(LOG.replace("702.5(median)", "7o2.5(median)"))
    with pytest.raises(InputFileError, match=r"mamf.txt:21: a shape line that cannot be read"):
        read_mamf(log)
