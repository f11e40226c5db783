"""Megatron-Core's router settings of a mixture-of-experts run (`RunSettings` inherits
them): the load-balancing type and its coefficients, forced balancing, the score
function, the expert bias, the routing dtype and the fused router kernels. What each
costs is `paraplan.predict.moe_router`; which combinations Megatron-Core (core_r0.15.0,
`transformer_config.py`, `router.py`) and Transformer Engine refuse is `check_router`.
The defaults below are Megatron-Core's; a run of a model takes the score function,
expert bias, scaling factor and pre-softmax it leaves unstated from the model's own
router (`paraplan.core.moe_router_model`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from paraplan.core.errors import StrategyError
from paraplan.core.moe_router_model import SCORE_FUNCTIONS, ScoreFunction
from paraplan.core.transformer import TransformerModel

LoadBalancingType = Literal["aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"]
LOAD_BALANCING_TYPES: tuple[str, ...] = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")
AUX_LOSS_TYPES: tuple[str, ...] = ("aux_loss", "seq_aux_loss", "global_aux_loss")
RouterDtype = Literal["", "fp32", "fp64"]
ROUTER_DTYPES: tuple[str, ...] = ("fp32", "fp64")
ROUTER_COLUMNS: tuple[str, ...] = (
    "moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_router_force_load_balancing",
    "moe_router_score_function", "moe_router_enable_expert_bias", "moe_router_topk_scaling_factor",
    "moe_router_pre_softmax", "moe_router_dtype", "moe_router_fusion", "fake_balanced_gate",
)
"""The run-table columns of `MoeRouterSettings`."""


@dataclass(frozen=True)
class MoeRouterSettings:
    """The router columns of a run table, in Megatron-LM's names (module doc)."""

    moe_router_load_balancing_type: LoadBalancingType = "aux_loss"
    """Megatron-Core's (default aux_loss): `aux_loss` (per micro-batch, counts all-reduced
    over tensor x context parallel), `seq_aux_loss` (per sequence), `global_aux_loss`
    (counts all-reduced over tensor x data x context parallel and averaged over the
    micro-batches), `none`; each loss only with `moe_aux_loss_coeff` > 0. `sinkhorn` is
    refused: its iterations run to a tolerance, each waiting for the device."""
    moe_aux_loss_coeff: float = 0.0
    """Megatron-Core's: the auxiliary loss's coefficient; 0 (its default) computes no loss."""
    moe_z_loss_coeff: float = 0.0
    """Megatron-Core's: the router z-loss's coefficient; 0: none (Megatron's None)."""
    moe_router_force_load_balancing: bool = False
    """Megatron-Core's benchmark switch: the router's logits replaced by random normal
    ones (a copy and a fill per MoE layer forward), so every expert gets its even share."""
    moe_router_score_function: ScoreFunction = "softmax"
    """Megatron-Core's: `softmax` or `sigmoid` (DeepSeek-V3, Llama 4); a run table's
    empty cell: the model's own (`TransformerModel.moe_router_score_function`)."""
    moe_router_enable_expert_bias: bool = False
    """Megatron-Core's aux-loss-free balancing (DeepSeek-V3): a per-expert bias added to
    the sigmoid scores for the choice; each forward adds its token counts to a buffer, all
    of a rank's MoE layers' counts all-reduced once per iteration over tensor x data x
    context parallel to update the biases. Only with the sigmoid score function."""
    moe_router_topk_scaling_factor: float = 0.0
    """Megatron-Core's: the chosen experts' weights scaled by it; 0: none (Megatron's None)."""
    moe_router_pre_softmax: bool = False
    """Megatron-Core's: softmax over all experts before the top-k (else over the k chosen)."""
    moe_router_dtype: RouterDtype = ""
    """Megatron-Core's: `fp32` routes in fp32 (logits, scores, probabilities); empty: the
    model's dtype. `fp64` is refused (no fp64 GEMM ceiling here; Transformer Engine's
    fused router refuses it too)."""
    moe_router_fusion: bool = False
    """Megatron-Core's `--moe-router-fusion` (Transformer Engine >= 2.7): top-k with its
    score function, the auxiliary loss's scores and the auxiliary loss each one fused
    kernel forward and backward, instead of PyTorch's ops."""
    fake_balanced_gate: bool = False
    """NeMo AutoModel's `backend.fake_balanced_gate` (its benchmark configs): its
    `FakeBalancedGate` replaces the router, no gating GEMM and no backward, each token sent
    to k consecutive experts with weights 1/k (six small kernels). Not with Megatron-Core's
    router settings above."""

    @property
    def aux_loss_on(self) -> bool:
        """An auxiliary loss is computed: an aux-loss type with a coefficient > 0."""
        return self.moe_router_load_balancing_type in AUX_LOSS_TYPES and self.moe_aux_loss_coeff > 0

    @property
    def router_logit_bytes(self) -> int:
        """Bytes of one logit, score or routing probability: 4 with `fp32`, else the
        router input's 2 (bf16 / fp16 / fp8 runs keep bf16 activations there)."""
        return 4 if self.moe_router_dtype == "fp32" else 2


_DEFAULT = MoeRouterSettings()


def _shown(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)


def check_router(settings: MoeRouterSettings, model: TransformerModel) -> None:
    """Raise `StrategyError` for router settings Megatron-Core or Transformer Engine refuse,
    or that paraplan cannot price (module doc)."""
    s = settings
    if not model.num_experts:
        # y1-hostile: router settings on a dense model were ignored without a word
        changed = [key for key in ROUTER_COLUMNS if getattr(s, key) != getattr(_DEFAULT, key)]
        if changed:
            raise StrategyError(f"{changed[0]} {_shown(getattr(s, changed[0]))} needs a mixture-of-experts model; "
                                f"'{model.name}' has no experts (num_experts 0): expected it empty")
        return
    if s.moe_router_load_balancing_type not in LOAD_BALANCING_TYPES:
        raise StrategyError(f"moe_router_load_balancing_type '{s.moe_router_load_balancing_type}' is not one of "
                            f"{', '.join(LOAD_BALANCING_TYPES)}")
    if s.moe_router_score_function not in SCORE_FUNCTIONS:
        raise StrategyError(f"moe_router_score_function '{s.moe_router_score_function}' is not one of "
                            f"{', '.join(SCORE_FUNCTIONS)}")
    for key in ("moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_router_topk_scaling_factor"):
        if getattr(s, key) < 0:
            raise StrategyError(f"{key} must be >= 0, got {getattr(s, key)}")
    if s.fake_balanced_gate:
        # y1-hostile: every router column, not five of them (sinkhorn or fp64 passed unseen)
        megatron = [key for key in ROUTER_COLUMNS if key != "fake_balanced_gate"
                    and getattr(s, key) != getattr(_DEFAULT, key)]
        if megatron:
            raise StrategyError(f"fake_balanced_gate (NeMo AutoModel's) replaces Megatron-Core's router: "
                                f"{megatron[0]} must be left at its default")
        return
    if s.moe_router_load_balancing_type == "sinkhorn":
        raise StrategyError("moe_router_load_balancing_type sinkhorn is not modelled: Megatron-Core's sinkhorn "
                            "iterates until its error is below a tolerance, the host waiting for the device at "
                            "each step, so its kernels and waits cannot be counted ahead")
    if s.moe_router_dtype == "fp64":
        raise StrategyError("moe_router_dtype fp64 is not modelled (no fp64 GEMM ceiling; Transformer Engine's "
                            "fused router refuses fp64 too): expected empty or fp32")
    if s.moe_router_dtype and s.moe_router_dtype not in ROUTER_DTYPES:
        raise StrategyError(f"moe_router_dtype '{s.moe_router_dtype}': expected empty, fp32 or fp64")
    if s.moe_router_enable_expert_bias and s.moe_router_score_function != "sigmoid":
        raise StrategyError("moe_router_enable_expert_bias needs moe_router_score_function sigmoid "
                            "(Megatron-Core: expert bias for aux-loss-free routing only supports sigmoid)")
    if model.moe_router_topk == 1 and s.moe_router_score_function == "softmax" and not s.moe_router_pre_softmax:
        raise StrategyError("moe_router_topk 1 with the softmax score function needs moe_router_pre_softmax "
                            "(Megatron-Core: a softmax over one expert has a zero gradient), or "
                            "moe_router_score_function sigmoid (Llama 4's router)")
