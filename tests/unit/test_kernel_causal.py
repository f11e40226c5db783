"""A causal attention backward derived from the published non-causal one: the mask costs
the backward what it costs the forward (paraplan.kernels.causal)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from paraplan.cli.main import main
from paraplan.kernels.causal import with_causal_backward
from paraplan.kernels.results import AttentionTimes, attention_flops, read_kernel_csvs

ROOT = Path(__file__).resolve().parents[2]
ATTENTION = ROOT / "data" / "published" / "attention"


def _times(rows: list[tuple[str, bool, float]]) -> AttentionTimes:
    """Rows of (pass, causal, TFLOP/s) at s = 4096, head dim 128, 4 x 16 heads."""
    passes = np.array([p for p, _, _ in rows], dtype=object)
    causal = np.array([c for _, c, _ in rows])
    time_s = np.array([attention_flops(4, 16, 4096, 128, c, p) / (tf * 1e12) for p, c, tf in rows])
    n = len(rows)
    return AttentionTimes("H100-SXM5-80GB", "float16", passes, np.full(n, 4.0), np.full(n, 16.0),
                          np.full(n, 4096.0), np.full(n, 128.0), causal, time_s)


def test_the_causal_backward_loses_what_the_causal_forward_loses():
    times, derived = with_causal_backward(_times([("fwd", True, 400.0), ("fwd", False, 500.0), ("bwd", False, 450.0)]))
    assert derived == 1 and len(times) == 4
    assert times.attention_pass[3] == "bwd" and bool(times.causal[3])
    # 450 x 400 / 500 = 360 TFLOP/s on the causal backward's FLOPs (half the non-causal ones)
    assert times.time_s[3] == pytest.approx(attention_flops(4, 16, 4096, 128, True, "bwd") / 360e12, rel=1e-12)


def test_a_measured_causal_backward_is_kept_and_nothing_is_derived():
    rows = [("fwd", True, 400.0), ("fwd", False, 500.0), ("bwd", False, 450.0), ("bwd", True, 300.0)]
    times, derived = with_causal_backward(_times(rows))
    assert derived == 0 and len(times) == 4
    # nor beside a measured causal forward+backward (FlashAttention-2's published figure)
    rows[3] = ("fwd_bwd", True, 300.0)
    assert with_causal_backward(_times(rows))[1] == 0
    # without both forward rows there is no ratio to carry over
    assert with_causal_backward(_times([("fwd", True, 400.0), ("bwd", False, 450.0)]))[1] == 0


def test_the_rule_prices_flashattention2s_published_causal_pass_within_thirteen_percent():
    # FA2 on H100, head dim 128: forward with and without the mask (FA3 paper), backward
    # without it (FA3 paper), forward+backward with it (FA2's own figure): the derived
    # causal backward plus the causal forward takes 3-12% longer than measured (conservative)
    rows = read_kernel_csvs([ATTENTION / "flash3_paper_h100_fwd.csv",
                             ATTENTION / "fa3_paper_h100_bwd_and_cudnn_fwd.csv",
                             ATTENTION / "flash2_fwd_bwd.csv"])
    fa2 = rows.attention_times("H100-SXM5-80GB", source="flash-attention-2")
    fa2 = fa2.subset(fa2.head_dim == 128)
    measured = fa2.subset(fa2.attention_pass == "fwd_bwd")
    times, derived = with_causal_backward(fa2.subset(fa2.attention_pass != "fwd_bwd"))
    assert derived == 6
    errors = []
    for s in (512, 1024, 2048, 4096, 8192, 16384):
        def one(attention_pass: str, s: float = s) -> float:
            src = measured if attention_pass == "fwd_bwd" else times
            hit = np.flatnonzero((src.attention_pass == attention_pass) & src.causal & (src.seq_length == s))
            return float(src.time_s[hit[-1]] / src.batch[hit[-1]])  # per sequence: the batches differ
        errors.append((one("fwd") + one("bwd")) / one("fwd_bwd") - 1)
    assert all(0.02 < e < 0.13 for e in errors), errors


def test_bench_attention_names_the_sdpa_backend_in_its_source(tmp_path, capsys):
    pytest.importorskip("torch")  # timing kernels is the measure extra's
    assert main(["bench", "--kind", "attention", "--device", "cpu", "--device-name", "cpu-core", "--seq-lengths",
                 "64,128", "--head-dims", "32", "--heads", "2", "--tokens", "128", "--sdpa-backend", "math",
                 "--warmup", "1", "--iters", "2", "--no-track", "-o", str(tmp_path)]) == 0
    times = read_kernel_csvs([tmp_path / "attention.csv"]).attention_times("cpu-core", source=":math")
    assert sorted(times.attention_pass.tolist()) == ["bwd", "bwd", "fwd", "fwd"] and times.causal.all()
    # cuDNN's kernel does not run on a CPU: one line naming the setting, no file written
    assert main(["bench", "--kind", "attention", "--device", "cpu", "--seq-lengths", "64", "--head-dims", "32",
                 "--sdpa-backend", "cudnn", "--iters", "1", "--no-track", "-o", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    # the reason in parentheses is torch's own words, which change between releases
    last = err.splitlines()[-1]  # (after the first command's rows)
    assert last.startswith("paraplan bench: error: option --sdpa-backend: cudnn: torch cannot run it on cpu for "
                           "seq_length 64, head_dim 32, float32 (") and last.endswith(")"), err
    assert not (tmp_path / "no" / "attention.csv").exists()
