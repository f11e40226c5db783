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


if __name__ == "__main__":
    main()
