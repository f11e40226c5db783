"""Time forward + backward of a Llama-style decoder on one GPU, as torchtitan runs it in
eager PyTorch, and print the paraplan run-table row that describes the same step.

The model: token embedding, `--num-layers` blocks (RMSNorm, q/k/v projections with
`--num-query-groups` K/V heads repeated to the query heads, rotary embedding on q and k,
causal scaled_dot_product_attention, output projection, RMSNorm, SwiGLU MLP), final
RMSNorm, untied output layer, cross-entropy on the float32 logits. Weights in BF16, no
bias, no dropout, no optimizer step, no activation recomputation. Each step is timed
with CUDA events; the median of `--iters` after `--warmup`.

    python benchmarks/gpu/llama_step.py --num-layers 4 --seq-length 8192 --micro-batch-size 1 \
        --sdpa-backend flash --out llama_step.csv

Writes one CSV row: the settings, the measured forward+backward time (`measured_s`) and
the forward alone (`measured_fwd_s`), and the device. Compare with
`paraplan predict <row as a run table> --cluster dgx-h100 --explain`
(docs/kernels.md, "Measured on an H100").
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path


def build(args, torch):
    nn, F = torch.nn, torch.nn.functional
    h, heads, groups = args.hidden_size, args.num_attention_heads, args.num_query_groups
    head_dim = h // heads

    def rope(x, cos, sin):  # x: b, heads, s, d (pairs interleaved as torchtitan's complex product)
        pairs = x.float().reshape(*x.shape[:-1], -1, 2)
        real, imag = pairs[..., 0], pairs[..., 1]
        out = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
        return out.flatten(-2).type_as(x)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.RMSNorm(h), nn.RMSNorm(h)
            self.wq = nn.Linear(h, h, bias=False)
            self.wk = nn.Linear(h, groups * head_dim, bias=False)
            self.wv = nn.Linear(h, groups * head_dim, bias=False)
            self.wo = nn.Linear(h, h, bias=False)
            self.w1 = nn.Linear(h, args.ffn_hidden_size, bias=False)
            self.w3 = nn.Linear(h, args.ffn_hidden_size, bias=False)
            self.w2 = nn.Linear(args.ffn_hidden_size, h, bias=False)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            y = self.norm1(x)
            q = self.wq(y).view(b, s, heads, head_dim).transpose(1, 2)
            k = self.wk(y).view(b, s, groups, head_dim).transpose(1, 2)
            v = self.wv(y).view(b, s, groups, head_dim).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            k = k.repeat_interleave(heads // groups, dim=1)
            v = v.repeat_interleave(heads // groups, dim=1)
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.wo(attn.transpose(1, 2).reshape(b, s, h))
            y = self.norm2(x)
            return x + self.w2(F.silu(self.w1(y)) * self.w3(y))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(args.vocab_size, h)
            self.blocks = nn.ModuleList(Block() for _ in range(args.num_layers))
            self.norm = nn.RMSNorm(h)
            self.out = nn.Linear(h, args.vocab_size, bias=False)
            freqs = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
            angles = torch.outer(torch.arange(args.seq_length).float(), freqs)
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)

        def forward(self, tokens, labels):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x, self.cos, self.sin)
            logits = self.out(self.norm(x))
            return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))

    return Model()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument("--ffn-hidden-size", type=int, default=14336)
    parser.add_argument("--num-attention-heads", type=int, default=32)
    parser.add_argument("--num-query-groups", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=128256)
    parser.add_argument("--seq-length", type=int, default=8192)
    parser.add_argument("--micro-batch-size", type=int, default=1)
    parser.add_argument("--sdpa-backend", choices=("auto", "flash", "cudnn"), default="flash")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("llama_step: needs a CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = build(args, torch).to(device=device, dtype=torch.bfloat16)
    model.cos, model.sin = model.cos.float(), model.sin.float()
    tokens = torch.randint(0, args.vocab_size, (args.micro_batch_size, args.seq_length), device=device)
    labels = torch.randint(0, args.vocab_size, (args.micro_batch_size, args.seq_length), device=device)
    backend = {"auto": None, "flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}[args.sdpa_backend]
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    context = nullcontext() if backend is None else sdpa_kernel(getattr(SDPBackend, backend))
    steps, forwards = [], []
    with context:
        for i in range(args.warmup + args.iters):
            model.zero_grad(set_to_none=True)
            start, middle, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            start.record()
            loss = model(tokens, labels)
            middle.record()
            loss.backward()
            end.record()
            end.synchronize()
            if not torch.isfinite(loss):
                print(f"llama_step: loss {loss.item()} is not finite", file=sys.stderr)
                return 1
            if i >= args.warmup:
                steps.append(start.elapsed_time(end) * 1e-3)
                forwards.append(start.elapsed_time(middle) * 1e-3)
    row = {k: v for k, v in vars(args).items() if k not in ("out", "warmup", "iters")}
    row.update(measured_s=statistics.median(steps), measured_fwd_s=statistics.median(forwards),
               measured_min_s=min(steps), measured_max_s=max(steps),
               peak_memory_GiB=torch.cuda.max_memory_allocated() / 2**30,
               device=torch.cuda.get_device_name(), torch_version=torch.__version__, iters=args.iters)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_header = not args.out.exists()
    with args.out.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(row))
        if write_header:
            writer.writeheader()
        writer.writerow(row)
    print(f"llama_step: {args.num_layers} layers h {args.hidden_size} s {args.seq_length} b {args.micro_batch_size} "
          f"{args.sdpa_backend}: fwd+bwd {row['measured_s'] * 1e3:.2f} ms (fwd {row['measured_fwd_s'] * 1e3:.2f}), "
          f"{row['peak_memory_GiB']:.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
