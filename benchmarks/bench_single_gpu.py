"""paraplan predict against forward+backward steps measured on one H100 (our own test set).

`benchmarks/gpu/llama_step.py` timed Llama-style decoders (eager PyTorch as torchtitan runs
them: RMSNorm, RoPE, GQA, SwiGLU, fp32 cross-entropy) on a lent H100 SXM5
(data/measured/h100-sxm5/llama_step.csv). Each row is written here as a one-GPU run table
row (TP, PP, DP 1; no recomputation; `attention_backend` flash or fused for SDPA's flash
or cuDNN kernel; `elementwise_kernels eager`, `cross_entropy_impl torch`) and predicted with
the shipped H100 calibration. Compared: the measured forward+backward time against the
predicted GEMM + attention + memory-bound + host time (the optimizer step, which the
measurement leaves out, is printed apart; so are its states, and predict's "does not fit"
for the h 8192 rows counts them). Nothing here is fitted.

    python benchmarks/bench_single_gpu.py [--calibration FILE]
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "data" / "measured" / "h100-sxm5" / "llama_step.csv"
COLUMNS = ("name", "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
           "swiglu", "untie_embeddings_and_output_weights", "normalization", "position_embedding_type",
           "add_bias_linear", "hidden_dropout", "attention_dropout", "seq_length", "vocab_size",
           "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size", "global_batch_size",
           "micro_batch_size", "dtype", "attention_backend", "elementwise_kernels", "cross_entropy_impl")
BACKEND = {"flash": "flash", "cudnn": "fused"}  # SDPA's kernel -> the run table's attention_backend


def run_table_row(measured: dict[str, str], index: int) -> list[str]:
    b = measured["micro_batch_size"]
    return [f"step{index}", measured["num_layers"], measured["hidden_size"], measured["num_attention_heads"],
            measured["num_query_groups"], measured["ffn_hidden_size"], "true", "true", "RMSNorm", "rope", "false",
            "0", "0", measured["seq_length"], measured["vocab_size"], "1", "1", "1", b, b, "bf16",
            BACKEND[measured["sdpa_backend"]], "eager", "torch"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibration", default=None, help="calibration file (default: the H100's shipped one)")
    args = parser.parse_args(argv)
    from paraplan.cli.main import main as paraplan

    measured = list(csv.DictReader(MEASURED.open()))
    with tempfile.TemporaryDirectory() as tmp:
        table, out = Path(tmp) / "steps.csv", Path(tmp) / "predicted.csv"
        with table.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(COLUMNS)
            writer.writerows(run_table_row(m, i) for i, m in enumerate(measured))
        extra = ["--calibration", args.calibration] if args.calibration else []
        if paraplan(["predict", str(table), "--cluster", "dgx-h100", "--explain", "--no-track", *extra,
                     "-o", str(out)]) != 0:
            return 1
        predicted = list(csv.DictReader(out.open()))
    print(f"\n== one H100 SXM5, forward+backward, measured ({MEASURED.relative_to(ROOT)}) vs predicted")
    print(f"   {'decoder':38s} {'measured ms':>11s} {'predicted':>10s} {'error':>7s}   gemm   attn    mem  "
          f"(optimizer, not measured)")
    errors = []
    for m, p in zip(measured, predicted, strict=True):
        parts = [float(p[f"explain_{k}_s"]) for k in ("gemm", "attention", "memory", "host")]
        step, measured_s = sum(parts), float(m["measured_s"])
        errors.append(step / measured_s - 1)
        name = (f"{m['num_layers']} x h{m['hidden_size']} s{m['seq_length']} b{m['micro_batch_size']} "
                f"v{m['vocab_size']} {m['sdpa_backend']}")
        optimizer_ms = float(p["explain_optimizer_s"]) * 1e3
        print(f"   {name:38s} {measured_s * 1e3:11.1f} {step * 1e3:10.1f} {errors[-1]:+7.1%} "
              f"{parts[0] * 1e3:6.1f} {parts[1] * 1e3:6.1f} {parts[2] * 1e3:6.1f}  ({optimizer_ms:.1f})")
    mape = sum(abs(e) for e in errors) / len(errors)
    print(f"   {len(errors)} steps: mean signed error {sum(errors) / len(errors):+.1%}, MAPE {mape:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
