"""The single-GPU measuring scripts under benchmarks/gpu: what can be checked without a GPU
(their shapes and byte counts, their CPU dry run, their refusal without CUDA, the shell
script's syntax)."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest

from script_module import load_script

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "benchmarks" / "gpu"


def _module(name: str):
    return load_script(GPU / f"{name}.py")


def test_an_experts_six_gemms_are_fc1_and_fc2_forward_dgrad_and_wgrad():
    """Qwen3-30B-A3B's expert (h 2048, FFN 768, gated: fc1 is 2048 x 1536) at 512 tokens:
    the weight gradients' inner dimension is the expert's tokens."""
    shapes = _module("grouped_gemm").gemm_shapes(2048, 768, 512)
    assert shapes == [("forward", "fc1", 512, 2048, 1536), ("forward", "fc2", 512, 768, 2048),
                      ("dgrad", "fc1", 512, 1536, 2048), ("dgrad", "fc2", 512, 2048, 768),
                      ("wgrad", "fc1", 2048, 512, 1536), ("wgrad", "fc2", 768, 512, 2048)]


def test_the_grouped_gemm_script_refuses_without_cuda(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert _module("grouped_gemm").main(["--out", str(tmp_path / "x.csv")]) == 2
    assert "grouped_gemm.py: needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_the_memory_kernel_script_dry_runs_on_cpu_with_the_bytes_one_fused_kernel_moves(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "m.csv"
    assert _module("memory_kernels").main(["--device", "cpu", "--tokens", "64", "--hidden", "128",
                                           "--adam-params", "1000", "--warmup", "0", "--reps", "2",
                                           "--out", str(out)]) == 0
    rows = {r["kernel"]: r for r in csv.DictReader(out.open())}
    e = 2  # bf16
    assert int(rows["copy"]["bytes"]) == 2 * 64 * 128 * e
    assert int(rows["add"]["bytes"]) == 3 * 64 * 128 * e
    assert int(rows["rms_norm_bwd"]["bytes"]) == 3 * 64 * 128 * e
    assert int(rows["swiglu_fwd"]["bytes"]) == 3 * 64 * (2 * 128 + 64) * e
    assert int(rows["permute"]["bytes"]) == 2 * 64 * 8 * 128 * e
    assert int(rows["adam_fused"]["bytes"]) == 28 * 1000
    assert {r["device"] for r in rows.values()} == {"cpu"}


def test_the_gpu_measuring_script_parses():
    assert subprocess.run(["bash", "-n", str(GPU / "measure_kernels.sh")], capture_output=True).returncode == 0
