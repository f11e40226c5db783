"""What `paraplan plan --model` is asked: a transformer, a cluster, how many of its GPUs,
the global batch, and the space and depth of the search. One typed request, built alike
by the command line, the workflow's plan rules and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from paraplan.core.cluster import Cluster
from paraplan.core.moe_router_model import model_router_defaults
from paraplan.core.run_settings import Dtype, FlexDispatcherBackend, Fp8Recipe, MoeDispatcher, RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.space import SearchSpace
from paraplan.predict.runtable import default_flash_attention
from paraplan.typed import Count


@dataclass(frozen=True)
class TransformerPlanRequest:
    """What to plan: `model` trained on `num_gpus` GPUs of `cluster` at one global batch."""

    model: TransformerModel
    """The transformer (a preset, a Hugging Face config or a model YAML, loaded)."""
    cluster: Cluster
    """The kind of node (device, GPUs per node, links); the run uses `num_gpus` of its GPUs."""
    num_gpus: Count
    """GPUs of the run: TP x CP x PP x DP."""
    global_batch_size: Count
    """Sequences per iteration (of `model.seq_length` tokens each)."""
    dtype: Dtype = "bf16"
    """Training precision (weights, activations and the bytes of model state per parameter)."""
    fp8_recipe: Fp8Recipe | Literal[""] = ""
    """With dtype fp8 (`RunSettings.fp8_recipe`); empty: Megatron's default."""
    use_flash_attn: bool | None = None
    """Fused attention; None: the run table's default for the dtype."""
    moe_token_dispatcher_type: MoeDispatcher = "alltoall"
    """A mixture-of-experts model's token dispatcher (`RunSettings.moe_token_dispatcher_type`):
    with `flex`, only the expert layouts its kernels were measured for are searched."""
    moe_flex_dispatcher_backend: FlexDispatcherBackend = "deepep"
    """With `flex`: DeepEP's kernels or HybridEP's (`paraplan.predict.moe_deepep`)."""
    space: SearchSpace = field(default_factory=SearchSpace)
    """What the search may choose from."""
    top_k: Count = 5
    """Plans answered, best first."""
    retime: Count = 32
    """Candidates of least estimated time per schedule re-timed with the exact engine."""

    def base_settings(self) -> RunSettings:
        """The settings every candidate shares: batch, precision, attention kernel, the
        model's own router (`paraplan.core.moe_router_model`)."""
        flash = default_flash_attention(self.dtype) if self.use_flash_attn is None else self.use_flash_attn
        return RunSettings(global_batch_size=self.global_batch_size, dtype=self.dtype, use_flash_attn=flash,
                           fp8_recipe=self.fp8_recipe, moe_token_dispatcher_type=self.moe_token_dispatcher_type,
                           moe_flex_dispatcher_backend=self.moe_flex_dispatcher_backend,
                           **model_router_defaults(self.model, {}))  # type: ignore[arg-type]
