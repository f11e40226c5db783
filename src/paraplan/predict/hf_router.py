"""The router of a Hugging Face mixture-of-experts `config.json` as the model's own
router settings in Megatron-Core's names (`paraplan.core.moe_router_model`).

The mapping, per key (a family's `transformers` class fixes some of them; `ROUTERS`):
- `scoring_func` -> `moe_router_score_function` (`softmax` / `sigmoid`);
- `topk_method` `noaux_tc` -> `moe_router_enable_expert_bias` (DeepSeek-V3's
  aux-loss-free balancing: the checkpoint's `e_score_correction_bias`, Megatron-Core's
  `router.expert_bias`); `greedy` / `group_limited_greedy`: no bias (the group limit is
  `hf_config._group_fields`);
- `routed_scaling_factor` -> `moe_router_topk_scaling_factor`;
- `norm_topk_prob` -> `moe_router_pre_softmax` = not `norm_topk_prob` for a softmax
  router: renormalising the top-k of a softmax over all experts gives the softmax over
  the k chosen, Megatron-Core's default; left unnormalised it is Megatron-Core's
  pre-softmax. Megatron-Core's sigmoid router always normalises its k > 1 weights, so a
  sigmoid router with `norm_topk_prob false` is priced with that division, said in a note.

Learned from (read, not copied) Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge, commit
067f987, 2026-08): `models/conversion/model_bridge.py` `CONFIG_MAPPING` (scoring_func,
routed_scaling_factor, n_group, topk_group), `models/deepseek/deepseek_v3_bridge.py` and
`models/kimi/kimi_bridge.py` (sigmoid, expert bias), `models/qwen/qwen3_moe_bridge.py`
(pre-softmax = not norm_topk_prob), `models/gpt_oss/gpt_oss_bridge.py` (no
pre-softmax: GPT-OSS takes the top-k of the logits, then a softmax over the k),
`models/llama/llama_provider.py` `Llama4ModelProvider` (sigmoid, no pre-softmax).
One difference, on purpose: Megatron-Bridge's `MixtralModelProvider` sets pre-softmax,
whose weights are the top-2 of a softmax over all 8 experts, unnormalised; transformers'
Mixtral renormalises them, which is Megatron-Core's softmax over the k chosen, read here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paraplan.core.errors import InputFileError
from paraplan.core.moe_router_model import SCORE_FUNCTIONS

if TYPE_CHECKING:
    from paraplan.predict.hf_config import _Keys

ROUTER_KEYS = ("scoring_func", "topk_method", "routed_scaling_factor", "norm_topk_prob")


@dataclass(frozen=True)
class Router:
    """A family's router: which keys its `transformers` class reads, and its defaults."""

    reads: tuple[str, ...] = ROUTER_KEYS
    score: str = "softmax"
    expert_bias: bool = False
    scaling: float = 0.0
    normalised: bool = True  # norm_topk_prob's default (True: Megatron-Core's softmax over the k chosen)


_DEEPSEEK_V3 = Router(score="sigmoid", expert_bias=True, scaling=2.5)  # transformers' DeepseekV3Config
_QWEN_MOE = Router(reads=("norm_topk_prob",), normalised=False)  # transformers' Qwen2/3MoeConfig default
ROUTERS: dict[str, Router] = {
    "deepseek_v3": _DEEPSEEK_V3, "kimi_k2": _DEEPSEEK_V3,
    "deepseek_v2": Router(scaling=1.0, normalised=False),  # transformers' DeepseekV2Config defaults
    "qwen2_moe": _QWEN_MOE, "qwen3_moe": _QWEN_MOE, "olmoe": _QWEN_MOE,  # OlmoeConfig: norm_topk_prob false
    # GLM-4.5's router is DeepSeek-V3's class (sigmoid, the e_score_correction_bias); its files
    # state the scaling and normalisation, transformers' Glm4MoeConfig defaults 1.0 and true
    "glm4_moe": Router(reads=("routed_scaling_factor", "norm_topk_prob"), score="sigmoid", expert_bias=True,
                       scaling=1.0),
    # fixed by the family's code, no key read: a renormalised top-2 softmax (Mixtral), a
    # softmax over the top-k logits (GPT-OSS), a sigmoid of the top-1 logit (Llama 4)
    "mixtral": Router(reads=()), "gpt_oss": Router(reads=()), "llama4_text": Router(reads=(), score="sigmoid"),
    # ERNIE 4.5: a softmax over all experts, the top-k renormalised (its selection also adds a fixed
    # correction bias to the scores, which Megatron-Core's softmax router has not: a note says so)
    "ernie4_5_moe": Router(reads=()),
    # MiniMax-M2: a sigmoid of the logits, the expert bias added to choose, the k chosen renormalised
    "minimax_m2": Router(reads=(), score="sigmoid", expert_bias=True),
    # Granite MoE: a softmax over the top-k logits; Phi-3.5-MoE's SparseMixer picks two experts
    # with a masked softmax each, priced as the softmax over the k chosen (a note says so)
    "granitemoe": Router(reads=()), "granitemoeshared": Router(reads=()), "phimoe": Router(reads=()),
    # DBRX: a softmax over all experts, the top-k renormalised (`hf_config._dbrx_flat`)
    "dbrx": Router(reads=()),
}
"""Routers by `model_type`; any other family reads every key, Megatron-Core's defaults
where the file states none."""

EXPERT_BIAS_METHODS = {"noaux_tc": True, "greedy": False, "group_limited_greedy": False}


def router_fields(keys: _Keys, model_type: str, topk: int) -> dict[str, Any]:
    """The model's router fields from the file's keys (module doc), the family's
    defaults for those it does not state (named in a note)."""
    family = ROUTERS.get(model_type, Router())
    stated = {key: keys.config[key] for key in family.reads if keys.config.get(key) is not None}
    keys.used.update(family.reads)
    score = keys.text("scoring_func", default=family.score) if "scoring_func" in stated else family.score
    if score not in SCORE_FUNCTIONS:
        raise InputFileError(keys.source, f"key 'scoring_func': expected one of {', '.join(SCORE_FUNCTIONS)}, "
                             f"got {stated['scoring_func']!r}")
    method = str(stated.get("topk_method", "")).lower()
    bias = EXPERT_BIAS_METHODS.get(method, family.expert_bias)  # an unknown method: refused by _group_fields
    if bias and score != "sigmoid":
        raise InputFileError(keys.source, f"key 'topk_method': {method or 'noaux_tc'} (an expert bias on the "
                             f"scores) with scoring_func {score}: Megatron-Core's expert bias is for the sigmoid "
                             "router only")
    scaling = stated.get("routed_scaling_factor", family.scaling)
    if "routed_scaling_factor" in stated and (isinstance(scaling, bool) or not isinstance(scaling, int | float)
                                              or not 0 < scaling <= 1e6):
        raise InputFileError(keys.source, f"key 'routed_scaling_factor': expected a number in (0, 1e6], "
                             f"got {scaling!r}")
    normalised = (keys.flag("norm_topk_prob", default=family.normalised) if "norm_topk_prob" in stated
                  else family.normalised)
    unstated = [key for key in family.reads if key not in stated]
    if unstated and model_type in ROUTERS:
        keys.notes.append(f"{keys.source}: {', '.join(unstated)} not stated: the {model_type} family's router "
                          f"used ({score}{', expert bias' if bias else ''}, scaling {scaling:g}, "
                          f"norm_topk_prob {str(normalised).lower()}, as transformers builds it)")
    if model_type == "ernie4_5_moe":
        keys.notes.append(f"{keys.source}: ERNIE 4.5's router adds a correction bias to its softmax scores to choose "
                          "the experts; priced as Megatron-Core's softmax router (the bias is one add over the scores)")
    if model_type == "phimoe":
        keys.notes.append(f"{keys.source}: Phi-3.5-MoE's SparseMixer router (each of its two experts chosen by a "
                          "masked softmax) is priced as Megatron-Core's softmax router over the two chosen")
    if score == "sigmoid" and not normalised and topk > 1:
        keys.notes.append(f"{keys.source}: norm_topk_prob false: Megatron-Core's sigmoid router normalises the "
                          f"{topk} chosen weights whatever it is told; priced with that division")
    return {"moe_router_score_function": score, "moe_router_enable_expert_bias": bias,
            "moe_router_topk_scaling_factor": float(scaling),
            "moe_router_pre_softmax": score == "softmax" and not normalised}
