"""Model definitions as data (no torch): what `models.py` builds in torch and what
`analytic.py` counts FLOPs and bytes for. A "layer" is the unit a planner may cut at.

- `mlp`: the DistIR seed's MLP: `layers` x (Linear + ReLU); the first takes
  `input_dim`, the last gives `output_dim`, the others `hidden_dim` -> `hidden_dim`.
- `gpt`: a GPT-style decoder: layer 0 = token + position embedding, then `layers`
  pre-norm transformer blocks (causal self-attention with `heads` heads, 4x MLP with
  GELU), last layer = final LayerNorm + vocabulary projection.
- `resnet`: a ResNet-50-style CNN: stem (7x7 conv, BN, ReLU, max-pool), bottleneck
  blocks (`blocks` per stage, 1x1 -> 3x3 -> 1x1 with 4x expansion), head (average
  pool + Linear). Each residual block is one layer.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from paraplan.core import ConfigError


@dataclass(frozen=True)
class MLPSpec:
    layers: int = 4
    input_dim: int = 1024
    hidden_dim: int = 1024
    output_dim: int = 1024
    bias: bool = True

    def dims(self) -> list[tuple[int, int]]:
        """(in, out) features of each Linear."""
        out = []
        for i in range(self.layers):
            d_in = self.input_dim if i == 0 else self.hidden_dim
            d_out = self.output_dim if i == self.layers - 1 else self.hidden_dim
            out.append((d_in, d_out))
        return out


@dataclass(frozen=True)
class GPTSpec:
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    seq_len: int = 128
    vocab: int = 1024

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ConfigError("hidden", f"must be a multiple of heads ({self.heads}), got {self.hidden}")


@dataclass(frozen=True)
class ResNetSpec:
    blocks: tuple[int, ...] = (3, 4, 6, 3)  # bottleneck blocks per stage (ResNet-50)
    width: int = 64  # channels of the first stage's bottleneck
    image_size: int = 224
    num_classes: int = 1000
    in_channels: int = 3

    def stage_shapes(self) -> list[tuple[int, int, int, int]]:
        """Per block: (in_channels, mid_channels, out_channels, stride)."""
        shapes = []
        channels = self.width
        for stage, count in enumerate(self.blocks):
            mid = self.width * 2**stage
            out = mid * 4
            for j in range(count):
                stride = 2 if (j == 0 and stage > 0) else 1
                shapes.append((channels, mid, out, stride))
                channels = out
        return shapes


Spec = MLPSpec | GPTSpec | ResNetSpec
MODEL_SPECS: dict[str, type] = {"mlp": MLPSpec, "gpt": GPTSpec, "resnet": ResNetSpec}


def spec_settings(spec: Spec) -> dict[str, object]:
    """The spec as plain values (for meta JSON and MLflow params)."""
    out: dict[str, object] = {}
    for f in fields(spec):
        value = getattr(spec, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def make_spec(model: str, settings: dict[str, object] | None = None) -> Spec:
    """`make_spec("gpt", {"layers": 2})`; unknown model names and keys list the known ones."""
    if model not in MODEL_SPECS:
        raise ConfigError("model", f"unknown model '{model}'; known models: {', '.join(sorted(MODEL_SPECS))}")
    cls = MODEL_SPECS[model]
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, object] = {}
    for key, value in (settings or {}).items():
        if key not in known:
            raise ConfigError(f"{model}.{key}", f"unknown setting; {model} takes {', '.join(known)}")
        if key == "blocks":
            try:
                value = tuple(int(v) for v in (value.split(",") if isinstance(value, str) else value))
            except (TypeError, ValueError):
                raise ConfigError(f"{model}.blocks", f"expected integers like 3,4,6,3, got {value!r}") from None
            if not value or min(value) < 1:
                raise ConfigError(f"{model}.blocks", f"expected integers >= 1, got {value!r}")
        elif key == "bias":
            if not isinstance(value, bool):
                raise ConfigError(f"{model}.bias", f"expected true or false, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{model}.{key}", f"expected an integer >= 1, got {value!r}")
        kwargs[key] = value
    return cls(**kwargs)


def num_layers(spec: Spec) -> int:
    if isinstance(spec, MLPSpec):
        return spec.layers
    if isinstance(spec, GPTSpec):
        return spec.layers + 2
    return sum(spec.blocks) + 2


def profile_cli_args(entry: dict) -> list[str]:
    """A workflow config entry (`model`, `batches`, `settings`, optional `analytic`) as
    `paraplan profile` options; used by workflow/rules/profile.smk (no torch here)."""
    args = ["--model", str(entry["model"])]
    for key, value in sorted(entry.get("settings", {}).items()):
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, list | tuple):
            args += [flag, ",".join(str(v) for v in value)]
        else:
            args += [flag, str(value)]
    batches = [int(b) for b in entry["batches"]]
    analytic = entry.get("analytic")
    if analytic:
        args += ["--analytic", "--cluster", str(analytic["cluster"]),
                 "--combine", str(analytic.get("combine", "roofline")), "--batch", str(max(batches))]
    else:
        args += ["--batches", ",".join(str(b) for b in batches)]
    return args
