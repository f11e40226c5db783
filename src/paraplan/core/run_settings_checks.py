"""The rules of one feature each that `RunSettings.check` applies: recomputation
modules, attention backends, context parallelism and expert parallelism (Megatron-LM's
and Megatron-Core's interlocks), each raising `StrategyError` naming the setting and
what was expected."""

from __future__ import annotations

from typing import TYPE_CHECKING

from paraplan.core.errors import StrategyError
from paraplan.core.run_settings import (
    ATTENTION_BACKENDS,
    CP_COMM_TYPES,
    CROSS_ENTROPY_IMPLS,
    ELEMENTWISE_KERNELS,
    FLASH_ATTENTION_VERSIONS,
    FLEX_BACKEND_NAMES,
    FSDP_PARAM_DTYPES,
    FUSED_ATTENTION_BACKENDS,
    MOE_RECOMPUTE_MODULES,
    OPTIMIZER_IMPLS,
    RECOMPUTE_METHODS,
    RECOMPUTE_MODULES,
    UNFUSED_ATTENTION_BACKENDS,
)

if TYPE_CHECKING:
    from paraplan.core.run_settings import RunSettings
    from paraplan.core.transformer import TransformerModel


def check_recompute_modules(settings: RunSettings, model: TransformerModel) -> None:
    modules = settings.recompute_modules
    if not isinstance(modules, tuple) or not modules:
        raise StrategyError(f"recompute_modules must be a non-empty list among {', '.join(RECOMPUTE_MODULES)}, "
                            f"got {modules!r}")
    unknown = [m for m in modules if m not in RECOMPUTE_MODULES]
    if unknown:
        raise StrategyError(f"recompute_modules: '{unknown[0]}' is not one of {', '.join(RECOMPUTE_MODULES)} "
                            "(the Megatron-Core modules paraplan prices)")
    if len(set(modules)) != len(modules):
        raise StrategyError(f"recompute_modules names a module twice: {' '.join(modules)}")
    if modules != ("core_attn",) and settings.recompute_granularity != "selective":
        raise StrategyError(f"recompute_modules {' '.join(modules)} needs recompute_granularity selective, got "
                            f"{settings.recompute_granularity}")
    if "mla_up_proj" in modules and not model.multi_latent_attention:
        raise StrategyError(f"recompute_modules mla_up_proj needs multi-latent attention; '{model.name}' has none")
    moe_only = [m for m in modules if m in MOE_RECOMPUTE_MODULES]
    if moe_only and not model.is_moe:
        raise StrategyError(f"recompute_modules {moe_only[0]} needs a mixture-of-experts model; '{model.name}' has "
                            "no experts")
    if "shared_experts" in modules and not model.moe_shared_expert_intermediate_size:
        raise StrategyError(f"recompute_modules shared_experts needs shared experts; '{model.name}' has none")


def check_recompute_method(settings: RunSettings) -> None:
    """`recompute_method` and `recompute_num_layers` go together, with full recomputation."""
    method, n = settings.recompute_method, settings.recompute_num_layers
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise StrategyError(f"recompute_num_layers must be an integer >= 0, got {n!r}")
    if not method:
        if n:
            raise StrategyError(f"recompute_num_layers {n} needs a recompute_method (uniform or block)")
        return
    if method not in RECOMPUTE_METHODS:
        raise StrategyError(f"recompute_method '{method}' is not one of {', '.join(RECOMPUTE_METHODS)}")
    if settings.recompute_granularity != "full":
        raise StrategyError(f"recompute_method {method} needs recompute_granularity full, got "
                            f"{settings.recompute_granularity}")
    if n < 1:
        raise StrategyError(f"recompute_method {method} needs recompute_num_layers >= 1 (Megatron-LM's "
                            "--recompute-num-layers)")


def check_recompute_block(settings: RunSettings, model: TransformerModel) -> None:
    """A block of recomputed layers fits in every model chunk (Megatron-Core's check)."""
    if settings.recompute_method != "block" or settings.recompute_granularity != "full":
        return
    most = max(settings.layers_per_virtual_stage(model.num_layers))
    if settings.recompute_num_layers > most:
        raise StrategyError(f"recompute_method block with recompute_num_layers {settings.recompute_num_layers}: a "
                            f"model chunk holds at most {most} layers (Megatron-Core: recompute_num_layers must not "
                            "exceed the layers of a chunk)")


def check_attention_backend(settings: RunSettings) -> None:
    """`attention_backend` names a fused kernel exactly when `use_flash_attn` is on."""
    backend = settings.attention_backend
    if backend not in ATTENTION_BACKENDS:
        raise StrategyError(f"attention_backend '{backend}' is not one of {', '.join(ATTENTION_BACKENDS)}")
    if backend in FUSED_ATTENTION_BACKENDS and not settings.use_flash_attn:
        raise StrategyError(f"attention_backend {backend} runs a fused attention kernel but use_flash_attn is "
                            "false (the unfused path); set use_flash_attn true, or attention_backend unfused")
    if backend in UNFUSED_ATTENTION_BACKENDS and settings.use_flash_attn:
        raise StrategyError(f"attention_backend {backend} runs the unfused attention path but use_flash_attn is "
                            "true; set use_flash_attn false, or attention_backend flash, fused or auto")
    version = settings.flash_attention_version
    if version not in FLASH_ATTENTION_VERSIONS:
        raise StrategyError(f"flash_attention_version must be 2, 3 or 4 (empty: not pinned), got {version!r}")
    if version and backend == "auto" and not settings.use_flash_attn:
        raise StrategyError(f"flash_attention_version {version} pins FlashAttention's generation, but "
                            "use_flash_attn is false (the unfused path; an empty use_flash_attn is false for fp16 "
                            "and fp32); expected use_flash_attn true")
    if version and (backend not in ("flash", "auto") or not settings.use_flash_attn):
        runs = "the unfused path" if not settings.use_flash_attn else "cuDNN's fused attention"
        raise StrategyError(f"flash_attention_version {version} pins FlashAttention's generation, but "
                            f"attention_backend {backend} runs {runs}; expected attention_backend flash or auto")


def check_context_parallel(settings: RunSettings, model: TransformerModel) -> None:
    """Megatron-Core's rules for `context_parallel_size` c: the sequence splits into
    2c chunks (causal load balancing), with sequence parallelism each rank's s / c
    tokens split again over t; the attention runs fused (Transformer Engine); `a2a`
    splits each rank's query and key/value heads over c."""
    c, t = settings.context_parallel_size, settings.tensor_model_parallel_size
    if settings.cp_comm_type not in CP_COMM_TYPES:
        raise StrategyError(f"cp_comm_type '{settings.cp_comm_type}' is not one of {', '.join(CP_COMM_TYPES)}")
    if c == 1:
        return
    if model.seq_length % (2 * c):
        raise StrategyError(f"context_parallel_size {c} needs seq_length {model.seq_length} divisible by "
                            f"2 x context_parallel_size = {2 * c} (causal load balancing)")
    if settings.sequence_parallel and model.seq_length % (t * c):
        raise StrategyError(f"sequence_parallel with context_parallel_size {c} needs seq_length "
                            f"{model.seq_length} divisible by tensor x context parallel size = {t * c}")
    if not settings.use_flash_attn:
        raise StrategyError(f"context_parallel_size {c} needs use_flash_attn (context parallelism runs "
                            "Transformer Engine's fused attention; the unfused path has none)")
    unpriced = context_parallel_unpriced(model)
    if unpriced:
        raise StrategyError(f"context_parallel_size {c} with {unpriced} is not modelled (the context-parallel "
                            "attention core prices full causal attention with one head width)")
    if settings.cp_comm_type == "a2a":
        for key, heads in (("num_attention_heads", model.num_attention_heads),
                           ("num_query_groups", model.query_groups)):
            if (heads // t) % c:
                raise StrategyError(f"cp_comm_type a2a splits heads over context_parallel_size {c}: {key} "
                                    f"{heads} / tensor_model_parallel_size {t} = {heads // t} is not divisible "
                                    f"by {c}")


def context_parallel_unpriced(model: TransformerModel) -> str:
    """The model's attention that context parallelism is not priced for ("" when it
    is): multi-latent attention, chunked or sliding-window layers."""
    if model.multi_latent_attention:
        return "multi-latent attention"
    if model.window_size:
        return "chunked attention" if model.chunked_attention else "sliding-window attention"
    return ""


def check_experts(settings: RunSettings, model: TransformerModel) -> None:
    """Megatron-Core's rules for expert parallelism (`initialize_model_parallel`:
    EP x ETP x PP divides the world, i.e. EP x ETP divides t x c x d; `num_experts`
    divisible by EP) and the layouts the MoE layer model prices."""
    ep, etp = settings.expert_model_parallel_size, settings.expert_tensor_parallel_size
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise StrategyError(f"expert_model_parallel_size must be an integer >= 1, got {ep!r}")
    if isinstance(etp, bool) or not isinstance(etp, int) or etp < 0:
        raise StrategyError(f"expert_tensor_parallel_size must be an integer >= 1 (0: the tensor-parallel size), "
                            f"got {etp!r}")
    imbalance = settings.moe_load_imbalance
    if isinstance(imbalance, bool) or not isinstance(imbalance, int | float) or not 1.0 <= imbalance <= 64.0:
        raise StrategyError(f"moe_load_imbalance must be a number in [1, 64] (busiest rank's tokens over the "
                            f"mean), got {imbalance!r}")
    capacity = settings.moe_expert_capacity_factor
    if isinstance(capacity, bool) or not isinstance(capacity, int | float) or not 0.0 <= capacity <= 64.0:
        raise StrategyError(f"moe_expert_capacity_factor must be a number in (0, 64] (0: dropless), "
                            f"got {capacity!r}")
    if settings.moe_pad_expert_input_to_capacity and not capacity:
        raise StrategyError("moe_pad_expert_input_to_capacity needs a moe_expert_capacity_factor")
    if not model.is_moe:
        # y1-hostile: name the setting (was the four names joined by '/', whichever was set)
        setting = next((f"{key} {value}" for key, value, used in (
            ("expert_model_parallel_size", ep, ep != 1),
            ("expert_tensor_parallel_size", etp, etp not in (0, settings.tensor_model_parallel_size)),
            ("moe_shared_expert_overlap", "true", settings.moe_shared_expert_overlap),
            ("moe_expert_capacity_factor", f"{capacity:g}", bool(capacity))) if used), None)
        if setting:
            raise StrategyError(f"{setting} needs a mixture-of-experts model; '{model.name}' has no experts "
                                "(num_experts 0)")
        if settings.overlap_moe_expert_parallel_comm:
            check_a2a_overlap(settings)
        if settings.moe_token_dispatcher_type != "alltoall":
            raise StrategyError(f"moe_token_dispatcher_type {settings.moe_token_dispatcher_type} needs a "
                                f"mixture-of-experts model; '{model.name}' has no experts")
        check_flex_dispatcher(settings)
        return
    t, d, c = settings.tensor_model_parallel_size, settings.data_parallel_size, settings.context_parallel_size
    etp = settings.expert_tensor_parallel
    if model.num_experts % ep:
        raise StrategyError(f"num_experts {model.num_experts} is not divisible by expert_model_parallel_size {ep}")
    if (t * c * d) % (ep * etp):
        ranks = f"tensor x data-parallel ranks of a pipeline stage, {t} x {d}" if c == 1 else \
            f"tensor x context x data-parallel ranks of a pipeline stage, {t} x {c} x {d}"
        # q6-moefirst: an empty ETP is TP, which a row that sets EP alone did not say
        defaulted = (f"; expert_tensor_parallel_size left empty is the tensor-parallel size, {etp} (Megatron-Core's "
                     "default): set it, e.g. 1" if settings.expert_tensor_parallel_size == 0 and etp > 1 else "")
        raise StrategyError(
            f"expert_model_parallel_size x expert_tensor_parallel_size = {ep} x {etp} does not divide the "
            f"{ranks} (Megatron-Core: EP x ETP x PP must divide the world size){defaulted}")
    if model.moe_ffn_size % etp:
        raise StrategyError(f"moe_ffn_hidden_size {model.moe_ffn_size} is not divisible by "
                            f"expert_tensor_parallel_size {etp}")
    if model.moe_shared_expert_intermediate_size % t:
        raise StrategyError(f"moe_shared_expert_intermediate_size {model.moe_shared_expert_intermediate_size} "
                            f"is not divisible by tensor_model_parallel_size {t}")
    if t > 1 and not settings.sequence_parallel and (ep > 1 or etp != t):
        raise StrategyError(
            f"expert_model_parallel_size {ep} / expert_tensor_parallel_size {etp} with tensor_model_parallel_size "
            f"{t} need sequence_parallel (Megatron-Core: 'when using expert parallelism and tensor parallelism, "
            "sequence parallelism must be used'); without it only EP 1 with ETP = TP")
    if settings.moe_shared_expert_overlap and not model.moe_shared_expert_intermediate_size:
        raise StrategyError(f"moe_shared_expert_overlap needs shared experts; '{model.name}' has none "
                            "(moe_shared_expert_intermediate_size 0)")
    if settings.overlap_moe_expert_parallel_comm:
        check_a2a_overlap(settings, model.mtp_num_layers)
    check_flex_dispatcher(settings)
    if settings.moe_token_dispatcher_type == "flex" and etp > 1:
        raise StrategyError(f"moe_token_dispatcher_type flex with expert_tensor_parallel_size {etp} is not "
                            f"modelled ({FLEX_BACKEND_NAMES[settings.moe_flex_dispatcher_backend]} priced for ETP 1)")


def check_flex_dispatcher(settings: RunSettings) -> None:
    """The flex dispatcher's own settings (backend, SM count) need the flex dispatcher."""
    if settings.moe_flex_dispatcher_num_sms < 0:
        raise StrategyError(f"moe_flex_dispatcher_num_sms must be >= 0 (0: the backend's default), got "
                            f"{settings.moe_flex_dispatcher_num_sms}")
    if settings.moe_token_dispatcher_type == "flex":
        return
    setting = ("moe_flex_dispatcher_backend hybridep" if settings.moe_flex_dispatcher_backend != "deepep" else
               f"moe_flex_dispatcher_num_sms {settings.moe_flex_dispatcher_num_sms}"
               if settings.moe_flex_dispatcher_num_sms else "")
    if setting:
        raise StrategyError(f"{setting} needs moe_token_dispatcher_type flex (the row's dispatcher is "
                            f"{settings.moe_token_dispatcher_type})")


# -- v5-dualpipe: DualPipe's rules (deepseek-ai/DualPipe's asserts; paraplan.sim.dualpipe)
def check_dualpipe(schedule: str, ranks: int, microbatches: int) -> None:
    """`StrategyError` unless `schedule` (dualpipe or dualpipev) can run `microbatches` over
    `ranks` pipeline ranks: the asserts of the DualPipe repository's `step`."""
    if schedule not in ("dualpipe", "dualpipev"):
        raise StrategyError(f"schedule '{schedule}' is not one of dualpipe, dualpipev")
    if schedule == "dualpipe":
        if ranks < 2 or ranks % 2:
            raise StrategyError(f"schedule dualpipe needs an even pipeline_model_parallel_size >= 2 (each rank "
                                f"pairs with rank p - 1 - r), got {ranks}")
        if microbatches % 2:
            raise StrategyError(f"schedule dualpipe needs an even number of micro-batches (half fed from each "
                                f"end), got {microbatches}")
    elif ranks < 1:
        raise StrategyError(f"schedule dualpipev needs pipeline_model_parallel_size >= 1, got {ranks}")
    if microbatches < 2 * ranks:
        raise StrategyError(f"schedule {schedule} needs at least twice as many micro-batches as pipeline ranks: "
                            f"{microbatches} micro-batches < 2 x {ranks}")


def check_dualpipe_settings(settings: RunSettings) -> None:
    """A run with schedule dualpipe: DualPipe's own rules, and what paraplan prices of it."""
    check_dualpipe("dualpipe", settings.pipeline_model_parallel_size, settings.num_microbatches)
    not_modelled = [why for bad, why in (
        (settings.zero_stage == 3, "zero_stage 3 (weights gathered per layer)"),
        (settings.context_parallel_size > 1, "context parallelism"),
        (settings.recompute_granularity == "full", "full recomputation"),
        ("moe" in settings.recompute_modules and settings.recompute_granularity == "selective",
         "moe in recompute_modules"),
        (settings.moe_shared_expert_overlap, "moe_shared_expert_overlap"),
        (settings.overlap_moe_expert_parallel_comm, "overlap_moe_expert_parallel_comm (Megatron's 1F1B pairing; "
                                                    "DualPipe pairs its own)"),
        (settings.scatter_gather_tensors_in_pipeline and settings.tensor_model_parallel_size > 1
         and not settings.sequence_parallel, "scatter_gather_tensors_in_pipeline")) if bad]
    if not_modelled:
        raise StrategyError(f"schedule dualpipe with {not_modelled[0]} is not modelled")
# -- end v5-dualpipe


def check_a2a_overlap(settings: RunSettings, mtp_num_layers: int = 0) -> None:
    """Megatron-Core's rules for `overlap_moe_expert_parallel_comm` (TransformerConfig)."""
    wrong = [why for bad, why in (
        (settings.expert_model_parallel_size < 2, "expert_model_parallel_size > 1"),
        # z6-plansearch: TransformerConfig's pipeline and multi-token-prediction rules (Megatron-Core d98e8a64)
        (settings.pipeline_model_parallel_size > 1 and settings.virtual_pipeline_model_parallel_size == 1
         and not settings.pipeline_model_parallel_layout,
         "the interleaved schedule with pipelines (virtual_pipeline_model_parallel_size > 1 with "
         "pipeline_model_parallel_size > 1)"),
        (mtp_num_layers > 1, "at most one multi-token-prediction layer"),
        (settings.recompute_granularity == "full", "no full recomputation"),
        ("moe" in settings.recompute_modules and settings.recompute_granularity == "selective",
         "no moe in recompute_modules"),
        (settings.moe_shared_expert_overlap, "no moe_shared_expert_overlap"),
        (settings.dtype == "fp32", "a bf16 or fp16 model")) if bad]
    if wrong:
        raise StrategyError(f"overlap_moe_expert_parallel_comm needs {wrong[0]} (Megatron-Core's rule)")


def _unlike_torchtitan_llama(model: TransformerModel) -> list[str]:
    """What `model` has that torchtitan's Llama layer has not (empty: the same layer)."""
    return [what for what, differs in (
        ("normalization RMSNorm", model.normalization != "RMSNorm"), ("swiglu", not model.swiglu),
        ("position_embedding_type rope", model.position_embedding_type != "rope"),
        ("no dropout", model.hidden_dropout > 0 or model.attention_dropout > 0),
        ("no linear biases", model.add_bias_linear or model.add_qkv_bias), ("no qk_layernorm", model.qk_layernorm),
        ("no sandwich_norm", model.sandwich_norm),
        ("no multi-latent attention", model.multi_latent_attention), ("no experts", model.is_moe),
    ) if differs]


def check_elementwise_kernels(settings: RunSettings, model: TransformerModel) -> None:
    """`elementwise_kernels eager` prices torchtitan's Llama ops (`paraplan.predict.eager_ops`)
    and `selective_ac_option op` its per-op recomputation (`paraplan.predict.torchtitan_ac`):
    RMSNorm, rotary embedding, SwiGLU, no dropout, no biases, standard attention."""
    kernels, option = settings.elementwise_kernels, settings.selective_ac_option
    if kernels not in ELEMENTWISE_KERNELS:
        raise StrategyError(f"elementwise_kernels '{kernels}' is not one of {', '.join(ELEMENTWISE_KERNELS)}")
    if option not in ("", "op"):
        raise StrategyError(f"selective_ac_option '{option}': expected op or empty")
    for what, used in ((f"elementwise_kernels {kernels}", kernels == "eager"), ("selective_ac_option op", option)):
        unlike = _unlike_torchtitan_llama(model) if used else []
        if unlike:
            raise StrategyError(f"{what} prices torchtitan's Llama layer; '{model.name}' differs from it: expected "
                               f"{', '.join(unlike)}")  # y1-hostile: was "lacks no experts"
    if not option:
        return
    if settings.activation_func_fp8_input_store:  # y1-hostile: was priced as a cast whose copy nothing kept
        raise StrategyError("activation_func_fp8_input_store is Megatron-LM's fused bias-SwiGLU; selective_ac_option "
                            "op (torchtitan's per-op recomputation) recomputes SwiGLU from its bf16 input: expected "
                            "one of them")
    if settings.recompute_granularity != "selective" or settings.recompute_modules != ("core_attn",):
        raise StrategyError(f"selective_ac_option op needs recompute_granularity selective and the default "
                            f"recompute_modules (core_attn), got recompute_granularity "
                            f"{settings.recompute_granularity}, recompute_modules "
                            f"{' '.join(settings.recompute_modules)}")
    if settings.tensor_model_parallel_size > 1:
        raise StrategyError("selective_ac_option op is priced without tensor parallelism (its recomputation "
                            f"re-runs the all-gathers), got tensor_model_parallel_size "
                            f"{settings.tensor_model_parallel_size}")


# --- torchao Float8 (torchtitan), `paraplan.predict.torchao_fp8` ---------------------------------
def check_torchao_float8(settings: RunSettings, model: TransformerModel) -> None:
    """`fp8_recipe torchao_tensorwise` and its FSDP options, as torchtitan (December 2024)
    runs them and as far as `paraplan.predict.torchao_fp8` prices them."""
    from paraplan.core.run_settings import TORCHAO_FP8_RECIPE
    from paraplan.core.sharding import sharding_group_size

    torchao = settings.fp8_recipe == TORCHAO_FP8_RECIPE
    for key in ("enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp"):
        if getattr(settings, key) and not torchao:
            raise StrategyError(f"{key} needs dtype fp8 with fp8_recipe {TORCHAO_FP8_RECIPE}, got dtype "
                                f"{settings.dtype} fp8_recipe '{settings.fp8_recipe}'")
    if settings.precompute_float8_dynamic_scale_for_fsdp and not settings.enable_fsdp_float8_all_gather:
        raise StrategyError("precompute_float8_dynamic_scale_for_fsdp needs enable_fsdp_float8_all_gather "
                            "(it precomputes the scales of the float8 all-gather)")
    if settings.enable_fsdp_float8_all_gather:
        shard = sharding_group_size(settings) // settings.context_parallel_size
        if settings.zero_stage != 3 or shard < 2:
            raise StrategyError(f"enable_fsdp_float8_all_gather needs zero_stage 3 sharded over >= 2 data-parallel "
                                f"ranks (torchtitan turns it off without dp_shard), got zero_stage "
                                f"{settings.zero_stage}, data-parallel shard degree {shard}")
        if not settings.use_torch_fsdp2:
            raise StrategyError("enable_fsdp_float8_all_gather needs use_torch_fsdp2 true: torchao's float8 "
                                "all-gather is an extension of PyTorch's FSDP2 (fully_shard), got use_torch_fsdp2 "
                                "false")
    if not torchao:
        return
    unlike = [what for what, differs in (("experts", model.is_moe), ("multi-latent attention",
                                                                       model.multi_latent_attention),
                                         ("multi-token-prediction layers", model.mtp_num_layers > 0)) if differs]
    if unlike:
        raise StrategyError(f"fp8_recipe {TORCHAO_FP8_RECIPE} prices torchtitan's dense Llama linears; "
                            f"'{model.name}' has {', '.join(unlike)}")
    if settings.tensor_model_parallel_size > 1 and not settings.sequence_parallel:
        raise StrategyError(f"fp8_recipe {TORCHAO_FP8_RECIPE} with tensor_model_parallel_size "
                            f"{settings.tensor_model_parallel_size} needs sequence_parallel (torchtitan's Float8 "
                            "tensor parallelism shards the norms along the sequence and all-gathers FP8 inputs)")
    if settings.elementwise_kernels != "fused":
        raise StrategyError(f"fp8_recipe {TORCHAO_FP8_RECIPE} is priced as torch.compile runs it (elementwise_kernels "
                            f"fused, torchtitan's `training.compile`); eager Float8 casts are not modelled, got "
                            f"elementwise_kernels {settings.elementwise_kernels}")
    recompute = settings.recompute_granularity
    if recompute != "full" and not (recompute == "selective" and settings.selective_ac_option == "op"):
        raise StrategyError(f"fp8_recipe {TORCHAO_FP8_RECIPE} needs recompute_granularity full or selective with "
                            f"selective_ac_option op (torchtitan's activation checkpointing): without it each "
                            f"linear keeps its FP8 weight for the backward, which is not modelled; got "
                            f"recompute_granularity {recompute}")


def check_cross_entropy(settings: RunSettings) -> None:
    """`cross_entropy_impl torch` is torchtitan's loss (with t > 1 its loss parallelism;
    with p > 1 under `torch.distributed.pipelining`, `paraplan.predict.torch_pipelining`),
    whose December 2024 schedules did not include DualPipe."""
    impl = settings.cross_entropy_impl
    if impl not in CROSS_ENTROPY_IMPLS:
        raise StrategyError(f"cross_entropy_impl '{impl}' is not one of {', '.join(CROSS_ENTROPY_IMPLS)}")
    if impl == "torch" and settings.schedule == "dualpipe":
        raise StrategyError("cross_entropy_impl torch with schedule dualpipe: torchtitan's pipelines "
                            "(torch.distributed.pipelining's buffers and kept outputs) are not modelled under DualPipe")


# -- u3-fsdp2
def check_torch_fsdp2(settings: RunSettings) -> None:
    """`use_torch_fsdp2` names how a zero_stage 3 run shards (FSDP2); `optimizer_impl
    foreach` is priced on FSDP2's shards only (no separate 16-bit weight copy to write),
    and `fsdp_param_dtype` is the dtype of those shards, so both need FSDP2."""
    if settings.use_torch_fsdp2 and settings.zero_stage != 3:
        raise StrategyError(f"use_torch_fsdp2 needs zero_stage 3 (FSDP2 shards weights, gradients and optimizer "
                            f"state), got zero_stage {settings.zero_stage}")
    impl = settings.optimizer_impl
    if impl not in OPTIMIZER_IMPLS:
        raise StrategyError(f"optimizer_impl '{impl}' is not one of {', '.join(OPTIMIZER_IMPLS)}")
    if impl == "foreach" and not settings.use_torch_fsdp2:
        raise StrategyError("optimizer_impl foreach is priced on FSDP2's sharded weights: it needs "
                            "use_torch_fsdp2 true")
    kept = settings.fsdp_param_dtype
    if kept not in FSDP_PARAM_DTYPES:
        raise StrategyError(f"fsdp_param_dtype '{kept}' is not one of {', '.join(FSDP_PARAM_DTYPES)}")
    if kept != "fp32" and not settings.use_torch_fsdp2:
        raise StrategyError(f"fsdp_param_dtype {kept} is the dtype FSDP2 keeps its sharded parameters in: it needs "
                            "use_torch_fsdp2 true (Megatron-LM's own optimizers keep fp32 main params)")
    if kept == "bf16" and settings.dtype not in ("bf16", "fp8"):
        raise StrategyError(f"fsdp_param_dtype bf16 with dtype {settings.dtype}: expected dtype bf16 or fp8 (bf16 "
                            "parameters computed in a wider dtype are not modelled)")
# -- end u3-fsdp2
