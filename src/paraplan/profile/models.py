"""The specs of `specs.py` as torch modules (torch.nn only, no downloads): a model is a
list of named layers run one after the other, so the profiler can time each one."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from paraplan.profile.specs import GPTSpec, MLPSpec, ResNetSpec, Spec


@dataclass
class LayeredModel:
    """`layers[i]` takes `layers[i-1]`'s output; `make_input(batch)` gives layer 0's input."""

    names: list[str]
    layers: nn.ModuleList
    spec: Spec

    def make_input(self, batch: int, device: torch.device, dtype: torch.dtype,
                   generator: torch.Generator | None = None) -> torch.Tensor:
        spec = self.spec
        if isinstance(spec, GPTSpec):
            return torch.randint(0, spec.vocab_size, (batch, spec.seq_length), device=device, generator=generator)
        if isinstance(spec, MLPSpec):
            shape: tuple[int, ...] = (batch, spec.input_dim)
        else:
            shape = (batch, spec.in_channels, spec.image_size, spec.image_size)
        return torch.randn(shape, device=device, generator=generator).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class LinearReLU(nn.Module):
    def __init__(self, d_in: int, d_out: int, bias: bool):
        super().__init__()
        self.linear = nn.Linear(d_in, d_out, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.linear(x))


class Embedding(nn.Module):
    def __init__(self, vocab: int, seq_len: int, hidden: int):
        super().__init__()
        self.token = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq_len, hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.token(tokens) + self.position(positions)


class DecoderBlock(nn.Module):
    """Pre-norm block: x + attn(ln(x)), then x + mlp(ln(x)); causal attention."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Head(nn.Module):
    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


class Stem(nn.Module):
    def __init__(self, in_channels: int, width: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(F.relu(self.bn(self.conv(x))))


class Bottleneck(nn.Module):
    def __init__(self, c_in: int, mid: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ClassifierHead(nn.Module):
    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_model(spec: Spec, seed: int = 0) -> LayeredModel:
    """Deterministic weights (`seed`)."""
    torch.manual_seed(seed)
    names: list[str] = []
    layers: list[nn.Module] = []
    if isinstance(spec, MLPSpec):
        for i, (d_in, d_out) in enumerate(spec.dims()):
            names.append(f"linear{i}")
            layers.append(LinearReLU(d_in, d_out, spec.bias))
    elif isinstance(spec, GPTSpec):
        names.append("embedding")
        layers.append(Embedding(spec.vocab_size, spec.seq_length, spec.hidden_size))
        for i in range(spec.num_layers):
            names.append(f"block{i}")
            layers.append(DecoderBlock(spec.hidden_size, spec.num_attention_heads))
        names.append("head")
        layers.append(Head(spec.hidden_size, spec.vocab_size))
    elif isinstance(spec, ResNetSpec):
        names.append("stem")
        layers.append(Stem(spec.in_channels, spec.width))
        shapes = spec.stage_shapes()
        block_index = 0
        for stage, count in enumerate(spec.blocks):
            for j in range(count):
                names.append(f"stage{stage + 1}.block{j}")
                layers.append(Bottleneck(*shapes[block_index]))
                block_index += 1
        names.append("head")
        layers.append(ClassifierHead(shapes[-1][2], spec.num_classes))
    else:  # pragma: no cover - specs.make_spec only builds the three above
        raise TypeError(f"unknown spec {spec!r}")
    return LayeredModel(names=names, layers=nn.ModuleList(layers), spec=spec)
