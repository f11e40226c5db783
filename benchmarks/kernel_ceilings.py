"""Kernel ceilings (config/kernels/<device>.json): how the device model prices GEMMs of
training size on H100 and A100 with the shipped calibration's transferred ceiling
(`a100-vtrain`: gemm_efficiency and gemm_k_half fitted on single-node A100 runs) and
with the device's own kernel fit, beside what was measured (a script, not a test).

1. Per device, the GEMMs of a GPT-3 175B layer at TP8, micro-batch 1, sequence 2048
   (QKV, attention output, MLP up and down; forward shapes) in TFLOP/s: transferred, the
   kernel fit's burst curve, and that curve held at the power limit (the file's
   `gemm.sustained` factor; what predictions use).
2. The H100 published table (XLA sm_90, GEMMs >= 1e10 FLOPs, burst measurements): the
   MAPE of each parameter set against the measured times.
3. Attention (causal, head dim 128) at sequence 2048 and 8192: forward and backward
   TFLOP/s of each parameter set.
4. The GEMMs of the two smallest Megatron-Core H100 rows (1.7B: hidden 2048, TP1; 7.1B:
   hidden 4096, TP2; micro-batch 4 x sequence 4,096 = 16,384 tokens), forward shapes, as
   the H100 curve prices them (burst and sustained), and the XLA table's GEMMs of that
   regime (k 2,048 or 4,096, at least 512 output tiles): the burst curve's error there.

    PYTHONPATH=src python benchmarks/kernel_ceilings.py
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from paraplan.clusters import load_cluster
from paraplan.kernels.ceilings import held_parameters, load_kernel_ceilings
from paraplan.kernels.fit import predict_attention_s, predict_gemm_s
from paraplan.kernels.results import AttentionTimes, GemmTimes, read_kernel_csvs
from paraplan.predict.calibration import load_calibration
from paraplan.predict.device_model import DeviceSpeed

ROOT = Path(__file__).resolve().parents[1]
DEVICES = {"H100-SXM5-80GB": "dgx-h100", "A100-SXM4-80GB": "dgx-a100"}
H, TP, TOKENS = 12288, 8, 2048
LAYER = {"qkv": (TOKENS, 3 * H // TP, H), "proj": (TOKENS, H, H // TP), "fc1": (TOKENS, 4 * H // TP, H),
         "fc2": (TOKENS, H, 4 * H // TP)}
SMALL_ROWS = {"1.7B": (2048, 1), "7.1B": (4096, 2)}  # hidden, TP of the Megatron-Core H100 rows
SMALL_TOKENS = 4 * 4096  # micro-batch 4 (what the predictor picks) x sequence 4,096


def _layer_shapes(h: int, tp: int, tokens: int) -> dict[str, tuple[int, int, int]]:
    return {"qkv": (tokens, 3 * h // tp, h), "proj": (tokens, h, h // tp), "fc1": (tokens, 4 * h // tp, h),
            "fc2": (tokens, h, 4 * h // tp)}


def _tflops(times: GemmTimes, speed: DeviceSpeed, eff) -> np.ndarray:
    return times.flops / predict_gemm_s(times, speed, eff) / 1e12


def _burst(device: str, held: dict[str, float]) -> dict[str, float]:
    """The kernel file's parameters with its GEMM ceiling before the sustained factor."""
    fit = load_kernel_ceilings(device).gemm
    return {**held, "gemm_efficiency": float(fit["params"]["gemm_efficiency"])} if "sustained" in fit else held


def main() -> None:
    transferred = load_calibration("a100-vtrain").efficiency
    print("1. GPT-3 175B layer GEMMs (TP8, mbs 1, s 2048), predicted TFLOP/s")
    print(f"{'device':<16} {'GEMM':<5} {'m x n x k':<18} {'a100-vtrain':>12} {'kernel fit':>11} {'sustained':>10}")
    for device, cluster in DEVICES.items():
        speed = DeviceSpeed.of(load_cluster(cluster).device, "bf16")
        own = replace(transferred, **held_parameters(device))
        burst = replace(transferred, **_burst(device, held_parameters(device)))
        for name, (m, n, k) in LAYER.items():
            g = GemmTimes(device, "bfloat16", *(np.array([float(v)]) for v in (m, n, k, 1, 1)))
            print(f"{device:<16} {name:<5} {f'{m}x{n}x{k}':<18} {_tflops(g, speed, transferred)[0]:>12.0f} "
                  f"{_tflops(g, speed, burst)[0]:>11.0f} {_tflops(g, speed, own)[0]:>10.0f}")
    rows = read_kernel_csvs([ROOT / "data/published/gemm/xla_h100_sm90_bf16.csv"])
    times = rows.gemm_times("H100-SXM5-80GB", "bfloat16")
    times = times.subset(times.flops >= 1e10)
    speed = DeviceSpeed.of(load_cluster("dgx-h100").device, "bf16")
    own = replace(transferred, **held_parameters("H100-SXM5-80GB"))
    burst = replace(transferred, **_burst("H100-SXM5-80GB", held_parameters("H100-SXM5-80GB")))
    print(f"\n2. H100 XLA sm_90 table, {len(times)} GEMMs >= 1e10 FLOPs: measured {times.flops.min() / 1e9:.0f}"
          f"-{times.flops.max() / 1e9:.0f} GFLOP at {np.min(times.flops / times.time_s) / 1e12:.0f}-"
          f"{np.max(times.flops / times.time_s) / 1e12:.0f} TFLOP/s")
    for label, eff in (("a100-vtrain (transferred)", transferred), ("kernel fit (H100's own)", burst),
                       ("its sustained ceiling", own)):
        err = predict_gemm_s(times, speed, eff) / times.time_s - 1
        print(f"   {label:<26} MAPE {np.abs(err).mean():6.1%}  mean signed {err.mean():+6.1%}")
    print("\n3. causal attention, head dim 128 (16 heads, 16k tokens), predicted TFLOP/s fwd / bwd")
    for device, cluster in DEVICES.items():
        speed = DeviceSpeed.of(load_cluster(cluster).device, "bf16")
        own = replace(transferred, **held_parameters(device))
        for s in (2048, 8192):
            att = AttentionTimes(device, "bfloat16", np.array(["fwd", "bwd"], dtype=object), np.full(2, 16384 / s),
                                 np.full(2, 16.0), np.full(2, float(s)), np.full(2, 128.0), np.ones(2, dtype=bool),
                                 np.ones(2))
            cells = []
            for eff in (transferred, own):
                tf = att.flops / predict_attention_s(att, speed, eff) / 1e12
                cells.append(f"{tf[0]:5.0f} / {tf[1]:5.0f}")
            print(f"   {device:<16} s={s:<5} a100-vtrain {cells[0]}   kernel fit {cells[1]}")

    _small_rows(transferred)


def _small_rows(transferred) -> None:
    """Section 4 (see the module doc)."""
    device = "H100-SXM5-80GB"
    speed = DeviceSpeed.of(load_cluster("dgx-h100").device, "bf16")
    own = replace(transferred, **held_parameters(device))
    burst = replace(transferred, **_burst(device, held_parameters(device)))
    print(f"\n4. GEMMs of the small Megatron-Core H100 rows ({SMALL_TOKENS} tokens), predicted TFLOP/s")
    print(f"   {'row':<5} {'GEMM':<5} {'m x n x k':<18} {'burst':>6} {'sustained':>10}")
    for row, (h, tp) in SMALL_ROWS.items():
        for name, (m, n, k) in _layer_shapes(h, tp, SMALL_TOKENS).items():
            g = GemmTimes(device, "bfloat16", *(np.array([float(v)]) for v in (m, n, k, 1, 1)))
            print(f"   {row:<5} {name:<5} {f'{m}x{n}x{k}':<18} {_tflops(g, speed, burst)[0]:>6.0f} "
                  f"{_tflops(g, speed, own)[0]:>10.0f}")
    times = read_kernel_csvs([ROOT / "data/published/gemm/xla_h100_sm90_bf16.csv"]).gemm_times(device, "bfloat16")
    tiles = np.ceil(times.m / 128) * np.ceil(times.n / 128) * times.batch
    regime = times.subset(np.isin(times.k, (2048.0, 4096.0)) & (tiles >= 512))
    err = predict_gemm_s(regime, speed, burst) / regime.time_s - 1
    measured = regime.flops / regime.time_s / 1e12
    print(f"   XLA sm_90, {len(regime)} GEMMs of that regime (measured {measured.min():.0f}-{measured.max():.0f} "
          f"TFLOP/s, burst): burst curve MAPE {np.abs(err).mean():.1%}, mean signed {err.mean():+.1%} "
          f"(+: priced slower than measured), max {err[np.argmax(np.abs(err))]:+.1%}")


if __name__ == "__main__":
    main()
