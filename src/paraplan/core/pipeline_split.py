"""How a run's transformer layers split over its virtual pipeline stages, as
Megatron-Core splits them (chunk c of pipeline rank r is virtual stage c p + r):

- by default as evenly as possible (`pipeline_layer_split`);
- with `decoder_first/last_pipeline_num_layers`, set counts on the first / last rank
  and the rest evenly over the middle ranks;
- with `account_for_embedding/loss_in_pipeline_split`, the embedding and the loss
  counted as one layer each (`embedding_loss_split`);
- with `pipeline_model_parallel_layout`, as the layout string says
  (`paraplan.core.pipeline_layout`).

Wherever the layers go, the embedding runs on virtual stage 0 and the output layer,
the loss and any MTP layers on the last one (Megatron builds them on the first / last
model chunk of the first / last rank; a layout that says otherwise is refused).
`check_pipeline_split` holds every rule, raising `StrategyError` naming the setting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from paraplan.core.errors import StrategyError
from paraplan.core.layer_split import even_layer_counts
from paraplan.core.pipeline_layout import COLUMN as LAYOUT_COLUMN
from paraplan.core.pipeline_layout import LayoutError, check_layout, parse_layout
from paraplan.core.transformer import TransformerModel

if TYPE_CHECKING:
    from paraplan.core.run_settings import RunSettings

ACCOUNT_FOR = ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")


def pipeline_split_slots(settings: RunSettings, num_layers: int) -> int:
    """Layers plus the embedding and the loss where they count as layers: what the
    split divides."""
    return (num_layers + int(settings.account_for_embedding_in_pipeline_split)
            + int(settings.account_for_loss_in_pipeline_split))


def layers_per_virtual_stage(settings: RunSettings, num_layers: int) -> list[int]:
    """Transformer layers of each virtual stage under `settings` (module doc;
    `check_pipeline_split` first)."""
    p, v = settings.pipeline_model_parallel_size, settings.virtual_pipeline_model_parallel_size
    if settings.pipeline_model_parallel_layout:
        return list(parse_layout(settings.pipeline_model_parallel_layout).transformer_layers)
    if settings.account_for_embedding_in_pipeline_split or settings.account_for_loss_in_pipeline_split:
        return embedding_loss_split(num_layers, p, v, settings.account_for_embedding_in_pipeline_split,
                                    settings.account_for_loss_in_pipeline_split)
    return pipeline_layer_split(num_layers, p, v, settings.decoder_first_pipeline_num_layers,
                                settings.decoder_last_pipeline_num_layers)


def check_pipeline_split(settings: RunSettings, model: TransformerModel) -> None:
    """Raise `StrategyError` when the split settings cannot place `model`'s layers."""
    for key in ACCOUNT_FOR:
        if not isinstance(getattr(settings, key), bool):
            raise StrategyError(f"{key} must be true or false, got {getattr(settings, key)!r}")
    layout = settings.pipeline_model_parallel_layout
    if not isinstance(layout, str):
        raise StrategyError(f"{LAYOUT_COLUMN} must be a string, got {layout!r}")
    p, v = settings.pipeline_model_parallel_size, settings.virtual_pipeline_model_parallel_size
    if layout:
        _check_layout(settings, model)
    elif settings.account_for_embedding_in_pipeline_split or settings.account_for_loss_in_pipeline_split:
        _check_embedding_loss_split(settings, model)
    elif p * v > model.num_layers:
        raise StrategyError(f"{p} pipeline stages x {v} virtual stages need at least {p * v} layers, "
                            f"the model has {model.num_layers}")
    _check_uneven_split(settings, model)


def _check_layout(settings: RunSettings, model: TransformerModel) -> None:
    """A layout excludes every other split setting (as in Megatron-Core) and fixes v."""
    others = [k for k in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", *ACCOUNT_FOR)
              if getattr(settings, k)]
    if others:
        raise StrategyError(f"{LAYOUT_COLUMN} cannot be combined with {others[0]} (the layout places every layer "
                            "itself; Megatron-Core refuses both)")
    try:
        layout = parse_layout(settings.pipeline_model_parallel_layout)
    except LayoutError as exc:
        raise StrategyError(f"{LAYOUT_COLUMN} '{settings.pipeline_model_parallel_layout}': {exc}") from None
    p, v = settings.pipeline_model_parallel_size, settings.virtual_pipeline_model_parallel_size
    implied = check_layout(layout, p, model.num_layers, model.mtp_num_layers)
    if implied != v:
        raise StrategyError(f"{LAYOUT_COLUMN} '{layout.text}' has {len(layout.stages)} virtual stages = "
                            f"pipeline_model_parallel_size {p} x {implied}, but virtual_pipeline_model_parallel_size "
                            f"is {v}")


def _check_embedding_loss_split(settings: RunSettings, model: TransformerModel) -> None:
    """Megatron-Core's rules for `account_for_embedding/loss_in_pipeline_split`: not with
    first/last stage counts; the layers plus one per flag divisible by p, each rank's
    share divisible by v."""
    if settings.uneven_pipeline_split:
        raise StrategyError("account_for_embedding/loss_in_pipeline_split cannot be combined with "
                            "decoder_first/last_pipeline_num_layers (Megatron-Core refuses both at once)")
    p, v = settings.pipeline_model_parallel_size, settings.virtual_pipeline_model_parallel_size
    slots = pipeline_split_slots(settings, model.num_layers)
    counted = " + ".join(["the embedding"] * settings.account_for_embedding_in_pipeline_split
                         + ["the loss"] * settings.account_for_loss_in_pipeline_split)
    if slots % p:
        raise StrategyError(f"{model.num_layers} layers + {counted} = {slots} are not divisible by "
                            f"pipeline_model_parallel_size {p}")
    if (slots // p) % v:
        raise StrategyError(f"{slots // p} layers per pipeline rank (counting {counted}) are not divisible by "
                            f"virtual_pipeline_model_parallel_size {v}")


def _check_uneven_split(settings: RunSettings, model: TransformerModel) -> None:
    """Megatron-Core's rules for `decoder_first/last_pipeline_num_layers`: each set
    stage's count divisible by v, the layers left split evenly over the stages left,
    each of those counts divisible by v."""
    first, last = settings.decoder_first_pipeline_num_layers, settings.decoder_last_pipeline_num_layers
    for key, value in (("decoder_first_pipeline_num_layers", first), ("decoder_last_pipeline_num_layers", last)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise StrategyError(f"{key} must be an integer >= 1 (0: an even split), got {value!r}")
    if not settings.uneven_pipeline_split:
        return
    p, v = settings.pipeline_model_parallel_size, settings.virtual_pipeline_model_parallel_size
    layers = model.num_layers
    if p < 2:
        raise StrategyError("decoder_first/last_pipeline_num_layers need pipeline_model_parallel_size >= 2")
    for key, value in (("decoder_first_pipeline_num_layers", first), ("decoder_last_pipeline_num_layers", last)):
        if value and value % v:
            raise StrategyError(f"{key} {value} is not divisible by virtual_pipeline_model_parallel_size {v}")
    middle_stages = p - (first > 0) - (last > 0)
    middle_layers = layers - first - last
    if middle_layers < 0 or bool(middle_layers) != bool(middle_stages):
        raise StrategyError(
            f"decoder_first/last_pipeline_num_layers {first}/{last} leave {middle_layers} of the {layers} layers "
            f"for {middle_stages} middle pipeline stages")
    if middle_stages and middle_layers % middle_stages:
        raise StrategyError(f"the {middle_layers} layers between the first and last pipeline stage do not split "
                            f"evenly over the {middle_stages} middle stages")
    if middle_stages and (middle_layers // middle_stages) % v:
        raise StrategyError(f"{middle_layers // middle_stages} layers per middle pipeline stage are not divisible "
                            f"by virtual_pipeline_model_parallel_size {v}")


def pipeline_layer_split(num_layers: int, stages: int, virtual: int = 1, first: int = 0, last: int = 0) -> list[int]:
    """Transformer layers of each virtual stage (chunk c of pipeline rank r is virtual
    stage c x stages + r). With `first`/`last` (Megatron-Core's
    decoder_first/last_pipeline_num_layers) the first/last rank holds that many, the
    other ranks share the rest evenly, and each rank's layers split evenly over its
    `virtual` chunks (`RunSettings.check` enforces the divisibility). Without them the
    layers split as evenly as possible over the stages x virtual chunks, the first
    virtual stages taking one more."""
    nv = stages * virtual
    if not (first or last):
        return even_layer_counts(num_layers, nv)
    middle = stages - (first > 0) - (last > 0)
    per_middle = (num_layers - first - last) // middle if middle else 0
    per_rank = [per_middle] * stages
    if first:
        per_rank[0] = first
    if last:
        per_rank[-1] = last
    return [per_rank[vs % stages] // virtual for vs in range(nv)]


def embedding_loss_split(num_layers: int, stages: int, virtual: int, embedding: bool, loss: bool) -> list[int]:
    """Transformer layers of each virtual stage when the embedding and/or the loss count
    as one layer each (Megatron-Core's account_for_embedding/loss_in_pipeline_split): the
    layers plus those slots split evenly over the stages x virtual chunks, then the
    first virtual stage gives its slot to the embedding and the last to the loss
    (`RunSettings.check` enforces the divisibility). Llama 3 405B on 16 stages: 126 + 2
    = 128 slots, 8 per rank; the first and last rank hold 7 layers."""
    nv = stages * virtual
    per = (num_layers + int(embedding) + int(loss)) // nv
    out = [per] * nv
    out[0] -= int(embedding)
    out[-1] -= int(loss)
    return out


def interleaved_uneven_split(num_layers: int, stages: int, virtual: int) -> tuple[int, int] | None:
    """(decoder_first, decoder_last) pipeline layers that let `virtual` chunks per rank
    interleave when stages x virtual does not divide the layers: the middle ranks take
    the smallest multiple of `virtual` that covers an even share, the first and last
    rank what is left (each a positive multiple of `virtual`, at most a middle rank's
    count; the last, which also runs the LM head, the smaller half). (0, 0) when the
    even split already works; None when no such split exists (`virtual` must divide
    the layers)."""
    if num_layers % (stages * virtual) == 0:
        return (0, 0)
    if stages < 3 or num_layers % virtual:
        return None
    per_middle = virtual * -(-num_layers // (stages * virtual))
    rest = num_layers - (stages - 2) * per_middle
    if rest < 2 * virtual or rest > 2 * per_middle:
        return None
    last = virtual * ((rest // virtual) // 2)
    return (rest - last, last)
