"""Kernels measured on a GPU: listed GEMM shapes, FP8 and sustained runs refused where
they cannot run, timings held at the power limit (`--hold-s`, source `...:held...`)
fitted with no sustained factor and taking precedence over burst rows of the same
kernel, and the sustained loop's summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from paraplan.cli.main import main
from paraplan.kernels.results import read_kernel_csvs
from paraplan.kernels.sustained import SUSTAINED_COLUMNS
from paraplan.kernels.sustained_bench import Chunk, sustained_summary
from script_module import load_script

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "data" / "measured" / "h100-sxm5"
XLA = ROOT / "data" / "published" / "gemm" / "xla_h100_sm90_bf16.csv"


def _bench(tmp_path: Path, *extra: str) -> int:
    return main(["bench", "--kind", "gemm", "--device", "cpu", "--warmup", "0", "--iters", "1", "--no-track",
                 "-o", str(tmp_path), *extra])


def test_listed_shapes_are_timed_as_listed(tmp_path):
    pytest.importorskip("torch")
    assert _bench(tmp_path, "--gemm-shapes", "32x48x16,8x8x8x3") == 0
    rows = read_kernel_csvs([tmp_path / "gemm.csv"]).gemm
    assert [(r["m"], r["n"], r["k"], r["batch"]) for _, _, r in rows] == [(32, 48, 16, 1), (8, 8, 8, 3)]
    assert {r["source"] for _, _, r in rows} == {"paraplan-bench:cpu"}


def test_held_rows_say_so_in_their_source(tmp_path):
    pytest.importorskip("torch")
    assert _bench(tmp_path, "--gemm-shapes", "16x16x16", "--hold-s", "0.01") == 0
    assert [r["source"] for _, _, r in read_kernel_csvs([tmp_path / "gemm.csv"]).gemm] == ["paraplan-bench:cpu:held"]
    assert main(["bench", "--kind", "attention", "--device", "cpu", "--seq-lengths", "32", "--head-dims", "16",
                 "--heads", "1", "--tokens", "32", "--sdpa-backend", "math", "--hold-s", "0.01", "--warmup", "0",
                 "--iters", "1", "--no-track", "-o", str(tmp_path / "a")]) == 0
    sources = {r["source"] for _, _, r in read_kernel_csvs([tmp_path / "a" / "attention.csv"]).attention}
    assert sources == {"paraplan-bench:cpu:held:math"}


@pytest.mark.parametrize(("extra", "message"), [
    (["--gemm-shapes", "64x64"], "option --gemm-shapes: expected MxNxK or MxNxKxBATCH of positive integers, "
                                 "got '64x64'"),
    (["--gemm-shapes", "8x0x8"], "got '8x0x8'"),
    (["--dtype", "float8_e4m3fn", "--gemm-shapes", "16x16x16"],
     "option --dtype: float8_e4m3fn: FP8 GEMMs run on CUDA only (torch._scaled_mm), not on cpu"),
    (["--hold-s", "-1"], "option --hold-s: must be >= 0, got -1.0"),
])
def test_gemm_inputs_it_cannot_run_are_one_line_errors(tmp_path, capsys, extra, message):
    pytest.importorskip("torch")
    assert _bench(tmp_path / "out", *extra) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_attention_in_fp8_and_sustained_on_a_cpu_are_refused(tmp_path, capsys):
    pytest.importorskip("torch")
    assert main(["bench", "--kind", "attention", "--device", "cpu", "--dtype", "float8_e4m3fn", "--no-track",
                 "-o", str(tmp_path / "a")]) == 2
    assert ("option --dtype: attention: float8_e4m3fn is a GEMM dtype here; expected one of float32, float16, "
            "bfloat16") in capsys.readouterr().err
    assert main(["bench", "--kind", "gemm-sustained", "--device", "cpu", "--gemm-shapes", "16x16x16", "--no-track",
                 "-o", str(tmp_path / "s")]) == 2
    assert ("option --kind: gemm-sustained measures a GPU at its power limit; it needs --device cuda, got cpu"
            in capsys.readouterr().err)
    assert main(["bench", "--kind", "gemm-sustained", "--device", "cpu", "--sustain-s", "0", "--no-track",
                 "-o", str(tmp_path / "s")]) == 2
    assert "option --sustain-s: must be positive, got 0" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "s").exists()


def test_sustained_summary_takes_the_second_half_of_the_loop():
    chunks = [Chunk(1.0, 800.0, 1980.0, 300.0), Chunk(2.0, 760.0, 1700.0, 650.0), Chunk(3.0, 690.0, 1400.0, 699.0),
              Chunk(4.0, 700.0, 1455.0, 701.0), Chunk(5.0, 680.0, None, None)]
    # the half is at 2.5 s: the chunks ending at 3, 4 and 5 s
    assert sustained_summary(chunks) == {"sustained_tflops": 690.0, "sustained_clock_min_mhz": 1400.0,
                                         "sustained_clock_max_mhz": 1455.0, "sustained_power_w": 700.0}
    assert sustained_summary([Chunk(0.5, 640.0, None, None)]) == {
        "sustained_tflops": 640.0, "sustained_clock_min_mhz": None, "sustained_clock_max_mhz": None,
        "sustained_power_w": None}
    with pytest.raises(ValueError, match="no chunks"):
        sustained_summary([])


def test_held_rows_take_precedence_over_burst_rows_of_the_same_group():
    rows = read_kernel_csvs([MEASURED / "gemm_bf16_held.csv", XLA, MEASURED / "attention_cudnn_held.csv",
                             ROOT / "data" / "published" / "attention" / "fa3_paper_h100_bwd_and_cudnn_fwd.csv"])
    kept, left_out = rows.held_first()
    xla_rows = sum(1 for p, _, _ in rows.gemm if p == str(XLA))
    cudnn_128 = sum(1 for _, _, r in rows.attention if r["source"] == "fa3-h100-fwd:cudnn" or (
        str(r["source"]).endswith(":cudnn") and "held" not in str(r["source"]) and r["head_dim"] == 128))
    assert xla_rows == 375 and left_out == xla_rows + cudnn_128
    assert {r["source"] for _, _, r in kept.gemm} == {"paraplan-bench:cuda:held"}
    # FlashAttention-2's and -3's burst rows have no held twin among these inputs: they stay
    assert {str(r["source"]).rsplit(":", 1)[-1] for _, _, r in kept.attention} == {
        "cudnn", "flash-attention-2", "flash-attention-3"}
    assert all("held" in str(r["source"]) for _, _, r in kept.attention if str(r["source"]).endswith("cudnn"))


def _sustained_csv(tmp_path: Path, *rows: tuple[str, str, str, str]) -> Path:
    path = tmp_path / "sustained.csv"
    lines = [",".join(SUSTAINED_COLUMNS)]
    for device, dtype, burst, sustained in rows:
        cells = {c: "" for c in SUSTAINED_COLUMNS}
        cells.update(kind="gemm_sustained", device=device, dtype=dtype, setup="s", runs="1", burst_tflops=burst,
                     sustained_tflops=sustained, power_limit_w="700", source="test")
        lines.append(",".join(cells[c] for c in SUSTAINED_COLUMNS))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_fit_of_held_rows_applies_no_sustained_factor_and_holds_the_latency(tmp_path, capsys):
    sustained = _sustained_csv(tmp_path, ("H100-SXM5-80GB", "bfloat16", "800", "720"))
    out = tmp_path / "held.json"
    assert main(["fit", "--kind", "kernels", "--no-track", str(MEASURED / "gemm_bf16_held.csv"), str(XLA),
                 str(sustained), "--cluster", "dgx-h100", "--min-gemm-flops", "1e11", "--gemm-latency-s", "3.8e-6",
                 "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "375 burst-timed row(s) left out" in err and "kernel_latency_s held at 3.8e-06" in err
    doc = json.loads(out.read_text())
    gemm = doc["gemm"]
    assert "sustained" not in gemm and "power limit" in gemm["held"]
    assert gemm["fitted"] == ["gemm_efficiency", "gemm_k_half"] and gemm["n_points"] == 169
    assert doc["efficiency"]["kernel_latency_s"] == 3.8e-6
    assert doc["efficiency"]["gemm_efficiency"] == gemm["params"]["gemm_efficiency"]
    # the measured training-size GEMMs sit at 650-690 TFLOP/s of the 989 peak: a ceiling near 0.7
    assert 0.68 < gemm["params"]["gemm_efficiency"] < 0.74 and gemm["heldout_mape"] < 0.05
    # the burst rows alone take the factor, from the device's own rows
    burst = tmp_path / "burst.json"
    assert main(["fit", "--kind", "kernels", "--no-track", str(XLA), str(sustained), "--cluster", "dgx-h100",
                 "-o", str(burst)]) == 0
    doc = json.loads(burst.read_text())
    assert doc["gemm"]["sustained"]["factor"] == pytest.approx(0.9, rel=1e-12)
    assert doc["efficiency"]["gemm_efficiency"] == pytest.approx(doc["gemm"]["params"]["gemm_efficiency"] * 0.9)
    assert main(["fit", "--kind", "kernels", "--no-track", str(XLA), "--cluster", "dgx-h100", "--gemm-latency-s",
                 "1", "-o", str(tmp_path / "x.json")]) == 2
    assert "option --gemm-latency-s: expected seconds in [0, 2e-05], got 1" in capsys.readouterr().err


def test_sustained_from_serves_the_dtypes_without_own_rows(tmp_path):
    """The device's own rows first (BF16 here); --sustained-from only for a dtype it has
    none of (FP8: MAMF's FP8 row held by the other device's FP8 factor)."""
    sustained = _sustained_csv(tmp_path, ("H100-SXM5-80GB", "bfloat16", "800", "720"),
                               ("H200-SXM-141GB", "bfloat16", "800", "600"),
                               ("H200-SXM-141GB", "float8_e4m3fn", "1000", "800"))
    fp8 = ROOT / "data" / "published" / "gemm" / "mamf_best_shapes_fp8.csv"
    out = tmp_path / "k.json"
    assert main(["fit", "--kind", "kernels", "--no-track", str(XLA), str(fp8), str(sustained), "--cluster",
                 "dgx-h100", "--sustained-from", "H200-SXM-141GB", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["gemm"]["sustained"]["from_device"] == "H100-SXM5-80GB"
    assert doc["gemm"]["sustained"]["factor"] == pytest.approx(0.9, rel=1e-12)
    assert doc["fp8"]["sustained"]["from_device"] == "H200-SXM-141GB"
    assert doc["fp8"]["sustained"]["factor"] == pytest.approx(0.8, rel=1e-12)


def test_shipped_h100_ceilings_rest_on_the_measured_rows():
    doc = json.loads((ROOT / "config" / "kernels" / "H100-SXM5-80GB.json").read_text())
    assert [d["path"] for d in doc["gemm"]["data"]] == ["data/measured/h100-sxm5/gemm_bf16_held.csv"]
    assert "held" in doc["gemm"] and "sustained" not in doc["gemm"]
    assert doc["attention"]["kernel"] == "cudnn" and "held" in doc["attention"]
    assert [d["path"] for d in doc["attention"]["data"]] == ["data/measured/h100-sxm5/attention_cudnn_held.csv"]
    assert [d["path"] for d in doc["fp8"]["data"]] == ["data/measured/h100-sxm5/gemm_fp8_held_window.csv",
                                                       "data/measured/h100-sxm5/gemm_fp8_fast_accum_held_window.csv"]
    assert "held" in doc["fp8"] and "sustained" not in doc["fp8"]


def test_the_single_gpu_steps_are_predicted_as_one_gpu_runs(capsys):
    """benchmarks/bench_single_gpu.py: each measured Llama-style step becomes a one-GPU run
    table row with its SDPA kernel's attention_backend; predict takes all seven."""
    module = load_script(ROOT / "benchmarks" / "bench_single_gpu.py")
    measured = list(__import__("csv").DictReader((MEASURED / "llama_step.csv").open()))
    assert len(measured) == 11 and {m["device"] for m in measured} == {"NVIDIA H100 80GB HBM3"}
    row = dict(zip(module.COLUMNS, module.run_table_row(measured[2], 2), strict=True))
    assert row["attention_backend"] == "fused" and measured[2]["sdpa_backend"] == "cudnn"
    assert (row["tensor_model_parallel_size"], row["data_parallel_size"], row["global_batch_size"]) == ("1", "1", "1")
    assert module.main([]) == 0
    out = capsys.readouterr().out
    assert "11 steps: mean signed error" in out and out.count(" v128256 ") == 10


def test_transformer_engine_fp8_mix_times_each_shape_as_one_fast_and_two_split_gemms():
    from paraplan.kernels.results import GemmTimes, transformer_engine_fp8_mix

    def times(shapes, seconds):
        col = np.array(shapes, dtype=float)
        return GemmTimes("d", "float8_e4m3fn", col[:, 0], col[:, 1], col[:, 2], np.ones(len(shapes)),
                         np.array(seconds))

    fast = times([(8, 8, 8), (16, 16, 16), (32, 32, 32)], [1.0, 3.0, 5.0])
    split = times([(16, 16, 16), (8, 8, 8), (64, 64, 64)], [6.0, 4.0, 9.0])
    mixed = transformer_engine_fp8_mix(fast, split)
    # the shapes measured both ways, in order; (t_fast + 2 t_split) / 3
    assert mixed.m.tolist() == [8.0, 16.0] and mixed.time_s.tolist() == [3.0, 5.0]
    assert len(transformer_engine_fp8_mix(times([(8, 8, 8)], [1.0]), times([(16, 16, 16)], [1.0]))) == 0


def test_fp8_rows_with_and_without_fast_accumulation_are_fitted_as_transformer_engine_runs_them(tmp_path, capsys):
    out = tmp_path / "k.json"
    assert main(["fit", "--kind", "kernels", "--no-track", str(MEASURED / "gemm_bf16_held.csv"),
                 str(MEASURED / "gemm_fp8_held_window.csv"), str(MEASURED / "gemm_fp8_fast_accum_held_window.csv"),
                 "--cluster", "dgx-h100", "--min-gemm-flops", "1e11", "--gemm-latency-s", "3.8e-6",
                 "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "each of 125 shapes measured both ways timed as (t_fast + 2 t_split) / 3" in err
    # the BF16 threshold's duration at the FP8 peak: 1e11 x 1978.9 / 989.4 FLOPs, 53 of the 125 shapes
    assert "72 FP8 GEMM(s) below 2.0001e+11 FLOPs left out of the fit" in err
    fp8 = json.loads(out.read_text())["fp8"]
    assert fp8["min_flops"] == pytest.approx(1e11 * 1978.9 / 989.4, rel=1e-12)
    assert fp8["n_points"] == 53 and "held" in fp8 and "sustained" not in fp8
    assert fp8["accumulation"].startswith("Transformer Engine's FP8 recipes: the forward GEMM fast-accumulated")
    # the mix sits between the two accumulation modes fitted alone, nearer the split one (2 of 3 GEMMs)
    def rate_at_k_8192(doc: dict) -> float:
        e = doc["efficiency"]
        return e["gemm_efficiency"] * 8192 / (8192 + e["gemm_k_half"])

    alone = {}
    for name in ("gemm_fp8_held_window.csv", "gemm_fp8_fast_accum_held_window.csv"):
        assert main(["fit", "--kind", "kernels", "--no-track", str(MEASURED / "gemm_bf16_held.csv"),
                     str(MEASURED / name), "--cluster", "dgx-h100", "--min-gemm-flops", "1e11", "--gemm-latency-s",
                     "3.8e-6", "-o", str(tmp_path / name)]) == 0
        alone[name] = rate_at_k_8192(json.loads((tmp_path / name).read_text())["fp8"])
    split, fast = alone["gemm_fp8_held_window.csv"], alone["gemm_fp8_fast_accum_held_window.csv"]
    mix = rate_at_k_8192(fp8)
    assert split < mix < fast and mix - split < fast - mix


def test_min_time_keeps_timing_until_the_window_is_spanned(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    import time as clock

    from paraplan.kernels.bench import times_s

    times = times_s(lambda: clock.sleep(0.002), torch.device("cpu"), warmup=0, iters=2, min_time_s=0.03)
    assert len(times) >= 10 and times.sum() >= 0.03 and times.min() >= 0.002
    assert len(times_s(lambda: None, torch.device("cpu"), warmup=0, iters=3)) == 3
    assert _bench(tmp_path / "x", "--min-time-s", "-0.5") == 2
    assert "option --min-time-s: must be >= 0, got -0.5" in capsys.readouterr().err
