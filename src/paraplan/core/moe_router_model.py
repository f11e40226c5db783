"""A mixture-of-experts model's own router: the score function, expert bias, top-k
scaling factor and pre-softmax its checkpoint routes with (`TransformerModel`'s
`moe_router_*` fields, Megatron-Core's names, beside the group-limited routing of
`moe_router_num_groups` / `moe_router_group_topk`). A run takes them as its defaults:
a run-table row (or a plan) that leaves one of these columns empty gets the model's
value; a stated cell wins (`model_router_defaults`). Pure; no import of the model's
module (it calls `check_model_router` while it is built).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from paraplan.core.transformer import TransformerModel

ScoreFunction = Literal["softmax", "sigmoid"]
SCORE_FUNCTIONS: tuple[str, ...] = ("softmax", "sigmoid")
MODEL_ROUTER_FIELDS: tuple[str, ...] = (
    "moe_router_score_function", "moe_router_enable_expert_bias", "moe_router_topk_scaling_factor",
    "moe_router_pre_softmax",
)
"""The router settings a model carries as its own (the rest are the run's choices)."""
MEGATRON_ROUTER: dict[str, object] = {
    "moe_router_score_function": "softmax", "moe_router_enable_expert_bias": False,
    "moe_router_topk_scaling_factor": 0.0, "moe_router_pre_softmax": False,
}
"""Megatron-Core's defaults of those fields (a dense model's, and a model file's that
names no router)."""


def check_model_router(m: TransformerModel) -> None:
    """Raise `ValueError` for a model router Megatron-Core cannot run (module doc)."""
    where = f"model '{m.name}'"
    if m.moe_router_score_function not in SCORE_FUNCTIONS:
        raise ValueError(f"{where}: moe_router_score_function must be one of {SCORE_FUNCTIONS}, "
                         f"got {m.moe_router_score_function!r}")
    for key in ("moe_router_enable_expert_bias", "moe_router_pre_softmax"):
        if not isinstance(getattr(m, key), bool):
            raise ValueError(f"{where}: {key} must be true or false, got {getattr(m, key)!r}")
    factor = m.moe_router_topk_scaling_factor
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 <= factor <= 1e6:
        raise ValueError(f"{where}: moe_router_topk_scaling_factor must be a number in [0, 1e6] (0: none), "
                         f"got {factor!r}")
    if not m.is_moe:
        changed = [key for key in MODEL_ROUTER_FIELDS if getattr(m, key) != MEGATRON_ROUTER[key]]
        if changed:
            raise ValueError(f"{where}: {changed[0]} {getattr(m, changed[0])} needs experts (num_experts > 0)")
        return
    if m.moe_router_enable_expert_bias and m.moe_router_score_function != "sigmoid":
        raise ValueError(f"{where}: moe_router_enable_expert_bias needs moe_router_score_function sigmoid "
                         "(Megatron-Core's expert bias is for the sigmoid router only)")


def model_router_defaults(model: TransformerModel, stated: Mapping[str, object]) -> dict[str, object]:
    """The router settings a run of `model` takes from the model: those of
    `MODEL_ROUTER_FIELDS` the run does not state (`stated`: its non-empty cells). None
    for a dense model, or with NeMo AutoModel's `fake_balanced_gate` (it replaces the
    router). The expert bias is the model's only where the run's score function is
    sigmoid, pre-softmax only where it is softmax: a row that states another score
    function than its model's gets a router Megatron-Core runs, not the model's half."""
    if not model.is_moe or stated.get("fake_balanced_gate"):
        return {}
    defaults = {key: getattr(model, key) for key in MODEL_ROUTER_FIELDS if key not in stated}
    score = stated.get("moe_router_score_function", model.moe_router_score_function)
    if score != model.moe_router_score_function:
        defaults.pop("moe_router_enable_expert_bias" if score == "softmax" else "moe_router_pre_softmax", None)
    return defaults
