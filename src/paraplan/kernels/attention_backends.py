"""Which attention kernel a run's `attention_backend` runs on its device, and that
kernel's measured ceilings.

Megatron-LM's `--attention-backend` (megatron/core/transformer/enums.py `AttnBackend`)
sets Transformer Engine's opt-out variables before the model is built
(`LanguageModule._set_attention_backend`): `flash` leaves only NVTE_FLASH_ATTN on,
`fused` only NVTE_FUSED_ATTN, `unfused` only NVTE_UNFUSED_ATTN, `local` none (Megatron's
own unfused `DotProductAttention`), `auto` all three. Transformer Engine then picks
among what is left (`get_attention_backend` in
transformer_engine/pytorch/attention/dot_product_attention/utils.py): FlashAttention
before FusedAttention, except that with both available on compute capability 9.0 and
above it turns FlashAttention off "to give FusedAttention preference on Hopper+".

So, in paraplan's kernel names (the end of a kernel CSV's `source` column):

- `flash`: `flash-attention-2` (Dao's package, what Transformer Engine installs with),
  or the generation `flash_attention_version` pins (Megatron-LM's
  `--flash-attention-version`, which turns the other generations off through
  NVTE_FLASH_ATTN_V2/V3/V4): `flash-attention-3` with 3 (Transformer Engine runs it on
  compute capability 9.0 only);
- `fused`: `cudnn` (cuDNN's fused attention);
- `auto`: the device kernel file's first attention kernel, which
  `kernels.published.<device>.attention_kernel` lists first as Transformer Engine's pick
  there: `cudnn` on H100, `flash-attention-2` on A100 (where a pinned
  `flash_attention_version` picks the generation);
- `unfused`, `local`: the unfused path (`use_flash_attn` false), priced from its
  GEMMs and memory-bound kernels, no kernel ceiling.

Each kernel's ceilings are fitted at one head dimension (128); a device file may carry
the same kernel fitted at another, `<kernel>@hdim<d>` (H100: 64, from the FA3 paper's
head-dim-64 figures), which then prices the runs whose query/key head width is d
(GPT-OSS: 64). A head width the file has no fit for is priced at the main fit's.

The calibration's three attention parameters describe the device's first kernel (a
calibration made with `--kernel-ceilings device` holds them at its values); a run
whose kernel is another one the device file carries is priced with that kernel's
(`DeviceSpeed.attention`); a kernel the file lacks is an error naming the device and
the kernels it has. A device without a kernel file prices `auto` with the
calibration's attention parameters and refuses a named kernel.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from paraplan.core.errors import StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.kernels.ceilings import head_dim_kernel
from paraplan.predict.device_model import AttentionCeiling, DeviceSpeed

BACKEND_KERNELS: dict[str, str] = {"flash": "flash-attention-2", "fused": "cudnn"}
"""The kernel each named fused backend runs (module doc; `flash` unless a generation is pinned)."""


@lru_cache(maxsize=16)
def device_attention_kernels(device: str) -> tuple[tuple[str, AttentionCeiling], ...] | None:
    """The attention kernels of `config/kernels/<device>.json`, the first first (what
    `auto` runs); None when no kernel file ships for the device."""
    from paraplan.kernels.ceilings import shipped_kernel_ceilings

    ceilings = shipped_kernel_ceilings(device)
    if ceilings is None:
        return None
    return tuple((name, AttentionCeiling(name, **params)) for name, params in ceilings.attention_ceilings().items())


def run_attention_kernel(settings: RunSettings, first: str | None, softcap: bool = False) -> str | None:
    """The kernel a fused-attention run runs, given its device file's first kernel
    (`first`; None without a file); None where that is the first kernel by `auto`,
    whose ceilings the calibration holds (module doc). With soft-capped attention logits
    (`softcap`, Gemma 2) Transformer Engine disqualifies cuDNN's fused kernel and runs
    FlashAttention (NVIDIA/TransformerEngine#3391, `get_attention_backend`): `auto` runs it
    there, `fused` is an error."""
    flash = f"flash-attention-{settings.flash_attention_version or 2}"
    if settings.attention_backend == "flash":
        return flash
    if settings.attention_backend == "fused":
        if softcap:
            raise StrategyError("attention_backend fused with attn_logit_softcapping: cuDNN's fused attention takes "
                                "no soft-cap (Transformer Engine runs it on FlashAttention); use attention_backend "
                                "auto or flash")
        return BACKEND_KERNELS["fused"]
    if softcap and first is not None and not first.startswith("flash-attention-"):
        return flash  # auto: Transformer Engine steers a soft-capped run to FlashAttention
    if settings.flash_attention_version and first is not None and first.startswith("flash-attention-"):
        return flash  # auto runs FlashAttention there, at the pinned generation
    return None


def with_attention_kernel(speed: DeviceSpeed, device: str, settings: RunSettings,
                          head_dim: int | None = None, softcap: bool = False) -> DeviceSpeed:
    """`speed` with the ceilings of the run's attention kernel where it is not the
    device's first kernel at its main head dimension (whose ceilings the calibration
    holds); unchanged otherwise. With `head_dim` (the model's query/key head width),
    the kernel's ceilings at that head dimension where the file has them
    (`<kernel>@hdim<d>`, module doc); with `softcap`, the kernel a soft-capped run
    runs (`run_attention_kernel`)."""
    if not settings.use_flash_attn:
        return speed
    kernels = device_attention_kernels(device)
    wanted = run_attention_kernel(settings, kernels[0][0] if kernels else None, softcap)
    have = dict(kernels or ())
    if head_dim is not None and kernels:  # a kernel file may hold GEMMs alone (MI300X's)
        at_dim = head_dim_kernel(wanted or kernels[0][0], head_dim)
        if at_dim in have:
            return replace(speed, attention=have[at_dim])
    if wanted is None:
        return speed
    if wanted not in have:
        names = ", ".join(have) or "none"
        where = (f"config/kernels/{device}.json has attention kernels: {names}" if kernels is not None
                 else f"no kernel file config/kernels/{device}.json")
        pinned = (f" (flash_attention_version {settings.flash_attention_version})"
                  if settings.flash_attention_version else "")
        raise StrategyError(f"attention_backend {settings.attention_backend}{pinned} runs {wanted}, whose ceilings "
                            f"device {device} has not measured ({where}); fit them with `paraplan fit --kind "
                            "kernels --attention-kernel` (docs/kernels.md) or use attention_backend auto")
    if kernels and wanted == kernels[0][0]:
        return speed
    return replace(speed, attention=have[wanted])


def unmeasured_head_width(device: str, head_dim: int) -> str:
    """A note where `device`'s kernel file measures no attention at head width `head_dim`
    (the model's query/key head width), whose runs are then priced at the main fit's
    width (docs/kernels.md, "Head widths"); '' where it does, or where no file or no
    attention fit ships for the device (its calibration's own attention prices it)."""
    from paraplan.kernels.ceilings import shipped_kernel_ceilings

    ceilings = shipped_kernel_ceilings(device)
    if ceilings is None or ceilings.attention is None:
        return ""
    main = int(ceilings.attention.get("head_dim", 0))
    others = {int(name.rsplit("@hdim", 1)[1]) for name in ceilings.attention_kernels if "@hdim" in name}
    widths = sorted({main} | others)
    if not main or head_dim in widths:
        return ""
    listed = ", ".join(str(w) for w in widths)
    return (f"attention at head width {head_dim}: config/kernels/{device}.json measures head width {listed}; "
            f"priced at {main}'s ceilings (docs/kernels.md, \"Head widths\")")
