"""Model definitions as data (no torch): what `models.py` builds in torch and what
`analytic.py` counts FLOPs and bytes for. A "layer" is the unit a planner may cut at.

- `mlp`: DistIR's MLP: `num_layers` x (Linear + ReLU); the first takes
  `input_dim`, the last gives `output_dim`, the others `hidden_dim` -> `hidden_dim`.
- `gpt`: a GPT-style decoder: layer 0 = token + position embedding, then `num_layers`
  pre-norm transformer blocks (causal self-attention with `num_attention_heads`
  heads, 4x MLP with GELU), last layer = final LayerNorm + vocabulary projection.
- `resnet`: a ResNet-50-style CNN: stem (7x7 conv, BN, ReLU, max-pool), bottleneck
  blocks (`blocks` per stage, 1x1 -> 3x3 -> 1x1 with 4x expansion), head (average
  pool + Linear). Each residual block is one layer.

These dataclasses are the one description of a model's settings: `paraplan profile`'s
options, the workflow config's `profile.models.<name>.settings`, its JSON schema and
every message about them come from their fields.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal

from paraplan.core import limits as lim
from paraplan.core.glossary import old_names
from paraplan.typed import AtLeast, AtMost, Source, load
from paraplan.typed.schema import record_schema
from paraplan.typed.source import option_name

Layers = Annotated[int, AtLeast(1), AtMost(lim.MAX_LAYERS, lim.LAYERS_WHY)]
Width = Annotated[int, AtLeast(1), AtMost(lim.MAX_WIDTH, lim.WIDTH_WHY)]
Batch = Annotated[int, AtLeast(1), AtMost(lim.MAX_GLOBAL_BATCH_SIZE, lim.GLOBAL_BATCH_WHY)]

ModelName = Literal["mlp", "gpt", "resnet"]


@dataclass(frozen=True, kw_only=True)
class MLPSpec:
    """DistIR's MLP: Linear + ReLU layers."""

    num_layers: Layers = 4
    """Linear + ReLU layers (mlp) / transformer blocks (gpt)."""
    input_dim: Width = 1024
    """Input features of the first Linear (mlp)."""
    hidden_dim: Width = 1024
    """Features between the Linear layers (mlp)."""
    output_dim: Width = 1024
    """Output features of the last Linear (mlp)."""
    bias: bool = True
    """Linear layers with bias (mlp)."""

    def dims(self) -> list[tuple[int, int]]:
        """(in, out) features of each Linear."""
        out = []
        for i in range(self.num_layers):
            d_in = self.input_dim if i == 0 else self.hidden_dim
            d_out = self.output_dim if i == self.num_layers - 1 else self.hidden_dim
            out.append((d_in, d_out))
        return out


@dataclass(frozen=True, kw_only=True)
class GPTSpec:
    """A GPT-style decoder, in Megatron-LM's argument names."""

    num_layers: Layers = 4
    """Transformer blocks (gpt) / Linear + ReLU layers (mlp)."""
    hidden_size: Width = 256
    """Model width (gpt)."""
    num_attention_heads: Width = 4
    """Attention heads; must divide hidden_size (gpt)."""
    seq_length: Width = 128
    """Tokens per sequence (gpt)."""
    vocab_size: Width = 1024
    """Vocabulary entries (gpt)."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be a multiple of num_attention_heads "
                f"{self.num_attention_heads}"
            )


@dataclass(frozen=True, kw_only=True)
class ResNetSpec:
    """A ResNet-50-style CNN (the defaults are ResNet-50)."""

    blocks: tuple[Layers, ...] = (3, 4, 6, 3)
    """Bottleneck blocks per stage, e.g. 3,4,6,3 (resnet)."""
    width: Width = 64
    """Channels of the first stage's bottleneck (resnet)."""
    image_size: Width = 224
    """Input image side in pixels (resnet)."""
    num_classes: Width = 1000
    """Classes of the head (resnet)."""
    in_channels: Width = 3
    """Input image channels (resnet)."""

    def __post_init__(self) -> None:
        if not self.blocks:
            raise ValueError("blocks needs at least one stage")

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
MODEL_SPECS: dict[str, type[MLPSpec] | type[GPTSpec] | type[ResNetSpec]] = {
    "mlp": MLPSpec, "gpt": GPTSpec, "resnet": ResNetSpec,
}


def spec_settings(spec: Spec) -> dict[str, object]:
    """The spec as plain values (for meta JSON and MLflow params)."""
    out: dict[str, object] = {}
    for f in fields(spec):
        value = getattr(spec, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def make_spec(model: str, settings: object = None, source: Source | None = None) -> Spec:
    """`make_spec("gpt", {"num_layers": 2})`: the settings checked against the model's
    fields; an unknown model or key lists the known ones (errors name `source`, by
    default the `settings` of a config entry)."""
    where = source or Source.config("settings")
    if model not in MODEL_SPECS:
        raise where.error(("model",) if where.kind != "config" else (), f"unknown model '{model}'; known models: "
                          f"{', '.join(MODEL_SPECS)}")
    return load(MODEL_SPECS[model], settings or {}, where)


def num_layers(spec: Spec) -> int:
    """Layers of the profile (units a pipeline may cut at)."""
    if isinstance(spec, MLPSpec):
        return spec.num_layers
    if isinstance(spec, GPTSpec):
        return spec.num_layers + 2
    return sum(spec.blocks) + 2


# ---- the workflow config's `profile.models.<name>` entries


@dataclass(frozen=True, kw_only=True)
class AnalyticEntry:
    """Compute the profile from FLOPs and bytes on a cluster's device instead of measuring it."""

    cluster: str
    """Cluster name under config/clusters (e.g. dgx-a100) or a YAML path."""
    combine: Literal["roofline", "sum"] = "roofline"
    """roofline (max of compute and memory time per op) or sum (DistIR's cost model)."""


@dataclass(frozen=True, kw_only=True)
class ProfileEntry:
    """One profile the workflow takes: a model of paraplan.profile.specs, its settings and batch sizes."""

    model: ModelName
    """mlp (Linear + ReLU layers), gpt (embedding, transformer blocks, head) or resnet
    (ResNet-50-style stem, bottleneck blocks, head)."""
    profile_batch_sizes: tuple[Batch, ...]
    """Batch sizes to measure; with two or more, time(b) = fixed + per_sample x b is fitted per
    layer and the CSV keeps the largest batch plus fwd_fixed_s/bwd_fixed_s. Analytic entries use
    the largest."""
    settings: dict[str, Any] | None = None
    """The model's settings (the fields of its spec); unknown keys fail with the list of known ones."""
    analytic: AnalyticEntry | None = None
    """Compute instead of measure."""


def profile_entry_schema() -> dict[str, Any]:
    """JSON schema of a `profile.models` entry: ProfileEntry's, with `settings` checked
    against the spec of the entry's `model`."""
    schema = record_schema(ProfileEntry)
    schema["properties"]["settings"] = {"type": "object", "default": {},
                                        "description": schema["properties"]["settings"]["description"]}
    schema["allOf"] = [
        {"if": {"properties": {"model": {"const": name}}},
         "then": {"properties": {"settings": record_schema(cls)}}}
        for name, cls in MODEL_SPECS.items()
    ]
    schema["properties"]["profile_batch_sizes"]["minItems"] = 1
    schema["properties"]["profile_batch_sizes"]["uniqueItems"] = True
    return schema


def profile_cli_args(entry: object, key: str = "profile.models.<name>") -> list[str]:
    """A workflow config entry (`model`, `profile_batch_sizes`, `settings`, optional `analytic`) as
    `paraplan profile` options, checked first (errors name `key`); used by
    workflow/rules/profile.smk and plan.smk (no torch here)."""
    parsed = load(ProfileEntry, entry, Source.config(key))
    spec = make_spec(parsed.model, parsed.settings or {}, Source.config(f"{key}.settings"))
    given = parsed.settings or {}
    args = ["--model", parsed.model]
    for f in fields(spec):
        if f.name not in given and not any(old in given for old in old_names(f.name)):
            continue  # only what the entry sets: the command's defaults are the spec's
        value = getattr(spec, f.name)
        flag = option_name(f.name)
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, tuple):
            args += [flag, ",".join(str(v) for v in value)]
        else:
            args += [flag, str(value)]
    batches = list(parsed.profile_batch_sizes)
    if parsed.analytic is not None:
        args += ["--analytic", "--cluster", parsed.analytic.cluster,
                 "--combine", parsed.analytic.combine, "--profile-batch-size", str(max(batches))]
    else:
        args += ["--profile-batch-sizes", ",".join(str(b) for b in batches)]
    return args


