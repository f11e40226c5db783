"""A MoE layer's grouped expert GEMMs: the experts' tiles share the SMs, and each expert's
GEMM is its own launch (Transformer Engine's grouped linear layer: one cuBLAS GEMM per
expert), so the kernel latency is paid once per local expert (`Kernels.launches`)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.device_model import DeviceEfficiency, DeviceSpeed, kernel_times_s
from paraplan.predict.moe_ops import moe_layer_work
from paraplan.predict.ops import GEMM, layer_work
from paraplan.predict.work import _Builder
from script_module import load_script

REPO = Path(__file__).resolve().parents[2]
SPEED = DeviceSpeed(peak_flops=989.4e12, mem_bandwidth_Bps=3.35e12, compute_units=132)
EFF = DeviceEfficiency(gemm_efficiency=0.7, gemm_k_half=200.0, kernel_latency_s=4e-6)


def test_a_grouped_gemm_pays_the_latency_once_per_group_and_a_batched_one_once():
    """16 experts of 1024 x 2048 x 1536 (compute-bound): 8 x 12 tiles each, 1,536 in all =
    12 waves of 132 units less 48 idle, k-loop 2048 / 2248; the tile time is the same both ways."""
    work = _Builder(2)
    work.gemm(1024, 2048, 1536, 16, grouped=True)
    work.gemm(1024, 2048, 1536, 16)  # one batched kernel (an unfused attention core's bmm)
    kernels = work.build().kernels
    assert kernels.launches.tolist() == [16.0, 1.0]
    grouped, batched = kernel_times_s(kernels, SPEED, EFF)
    flops = 2 * 1024 * 2048 * 1536 * 16
    tiles_s = flops / (989.4e12 * 0.7 * (1536 / 1584) * 2048 / 2248)
    assert batched == pytest.approx(tiles_s + 4e-6, rel=1e-12)
    assert grouped == pytest.approx(tiles_s + 16 * 4e-6, rel=1e-12)


def test_the_moe_layer_launches_one_gemm_per_local_expert_and_the_dense_layer_one_each():
    model = TransformerModel("moe", num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                             vocab_size=51200, hidden_dropout=0.0, attention_dropout=0.0, num_experts=128,
                             moe_router_topk=8, moe_ffn_hidden_size=256)
    settings = RunSettings(micro_batch_size=1, global_batch_size=32, data_parallel_size=8,
                           expert_model_parallel_size=8)
    work = moe_layer_work(model, settings)
    for pass_, experts in ((work.forward, 2), (work.backward, 4)):
        gemms = pass_.kernels.kind == GEMM
        launches = pass_.kernels.launches[gemms]
        assert sorted(launches.tolist())[-experts:] == [16.0] * experts  # 128 experts / EP 8
        assert (launches[launches != 16.0] == 1.0).all()
        assert (pass_.kernels.batch[gemms][launches == 16.0] == 16.0).all()
    dense = layer_work(model, RunSettings(micro_batch_size=1, global_batch_size=32, data_parallel_size=8))
    assert (dense.forward.kernels.launches == 1.0).all() and (dense.backward.kernels.launches == 1.0).all()


def test_the_measured_grouped_gemms_cost_about_one_latency_per_expert_more_than_one_gemm():
    """The H100 measurement this rests on (data/measured/h100-sxm5, benchmarks/gpu/grouped_gemm.py):
    over its 480 BF16 cases (G 4-32 experts, 256-4,096 tokens each, the six GEMMs of four
    models' experts), G expert GEMMs on 4 streams in a CUDA graph take longer than the one
    dense GEMM of the same FLOPs by a median 4.1 us per expert (quartiles 2.4 and 6.6): about
    the calibrated kernel latency (3.8 us), the cost a grouped price with one launch left out."""
    path = REPO / "data" / "measured" / "h100-sxm5" / "grouped_gemm_bf16_graph.csv"
    times: dict[tuple, dict[str, float]] = {}
    with path.open(newline="") as handle:
        for r in csv.DictReader(handle):
            key = (r["model"], r["pass"], r["projection"], int(r["groups"]), r["m"], r["k"])
            times.setdefault(key, {})[r["mode"]] = float(r["time_us"])
    extra_us = np.array([(t["graph4"] - t["dense"]) / key[3] for key, t in times.items()])
    assert len(extra_us) == 480
    assert np.percentile(extra_us, [25, 50, 75]) == pytest.approx([2.35, 4.14, 6.62], abs=0.01)


def test_the_grouped_gemm_benchmark_prints_the_figures_docs_moe_quotes(capsys):
    """docs/moe.md, "Grouped GEMMs measured on an H100": the price against the 4-stream GEMMs,
    GMAE 14.0% (BF16) and 17.5% (FP8) with a latency per expert, 23.5% / 28.3% without."""
    load_script(REPO / "benchmarks" / "bench_grouped_gemm.py").main()
    out = capsys.readouterr().out
    bf16, fp8 = out.split("\nfp8: ")
    for text, new, old in ((bf16, "GMAE  14.0%  signed  +0.2%", "GMAE  23.5%  signed -16.3%"),
                           (fp8, "GMAE  17.5%  signed  +8.4%", "GMAE  28.3%  signed -17.5%")):
        streams4 = text.split("vs 4 streams (Transformer Engine), 480 cases:")[1].split("vs 1 stream")[0]
        assert f"tiles + latency per expert   {new}" in streams4
        assert f"tiles only (before)          {old}" in streams4
    assert "best per-expert cost (free, not used): 3.39 us" in bf16


def test_the_memory_kernel_benchmark_prices_streaming_kernels_near_and_norms_fast(capsys):
    """docs/kernels.md, memory_efficiency: streaming kernels priced within -2%..+8% (median),
    PyTorch's norms 30-44% fast, fused AdamW 7% fast."""
    load_script(REPO / "benchmarks" / "bench_memory_kernels.py").main()
    out = capsys.readouterr().out
    assert ("median priced / measured: copy 0.98, add 1.07, mul_scalar 1.04, layer_norm_fwd 0.67, rms_norm_fwd "
            "0.70, layer_norm_bwd 0.56, rms_norm_bwd 0.59, adam_fused 0.93") in out
