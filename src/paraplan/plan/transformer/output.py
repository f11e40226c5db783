"""An LLM plan as table rows, in `paraplan predict`'s column names: one row per plan
kept, best first, with the data-parallel baselines' iteration times beside it.

Every plan answered was re-timed by the exact engine (`search.py`), so its memory
columns are the engine's, as `paraplan predict` writes them: the peak, the pipeline
rank it is on and that rank's parts at that moment, adding up to the peak
(`paraplan.predict.peak_memory.PeakMemory`).

Every row names the overlaps it assumed (`tp_comm_overlap`, `overlap_p2p_comm`, the MoE
overlaps), a MoE model's own router (`moe_router_score_function`,
`moe_router_enable_expert_bias`, `moe_router_topk_scaling_factor`, `moe_router_pre_softmax`:
`paraplan.core.moe_router_model`), its FP8
recipe (`fp8_recipe`, with dtype fp8), how it splits the layers
(`account_for_*_in_pipeline_split`) and ZeRO-3's choices (`fsdp_reshard_after_forward`,
`sharded_grad_reduce`), so `paraplan predict` on the row's settings prices the same run."""

from __future__ import annotations

from paraplan.core.run_settings import DEFAULT_FP8_RECIPE, FLEX_BACKEND_NAMES
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.search import BASELINES, PlanResult
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.peak_memory import PEAK_MEMORY_COLUMNS
from paraplan.predict.predictor import RunPrediction, plausibility

PLAN_COLUMNS: tuple[str, ...] = (
    "rank", "model", "num_parameters", "active_parameters", "num_gpus", "global_batch_size", "seq_length",
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size", "context_parallel_size",
    "cp_comm_type", "expert_model_parallel_size", "expert_tensor_parallel_size", "micro_batch_size",
    "virtual_pipeline_model_parallel_size",
    "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "recompute_granularity",
    "recompute_method", "recompute_num_layers", "sequence_parallel", "zero_stage", "fsdp_reshard_after_forward",
    "sharded_grad_reduce",
    "use_distributed_optimizer", "overlap_grad_reduce",
    "overlap_param_gather", "tp_comm_overlap", "overlap_p2p_comm", "overlap_moe_expert_parallel_comm",
    "moe_shared_expert_overlap", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
    "moe_flex_dispatcher_num_sms", "moe_router_score_function", "moe_router_enable_expert_bias",
    "moe_router_topk_scaling_factor", "moe_router_pre_softmax", "schedule", "dtype", "fp8_recipe", "use_flash_attn",
    "predicted_iteration_s",
    "predicted_tokens_per_s", "predicted_tflops_per_gpu", "predicted_mfu", "predicted_peak_memory_bytes",
    *PEAK_MEMORY_COLUMNS, "bubble_fraction", "fits_memory", "plausibility", *(f"{name}_s" for name in BASELINES),
    "search_s", "calibration",
)


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _chosen(value: str) -> str:
    return "" if value == "default" else value


def baseline_cell(prediction: RunPrediction | None) -> str:
    """A baseline's iteration time; empty when it cannot run or does not fit."""
    if prediction is None or not prediction.fits_memory:
        return ""
    return f"{prediction.iteration_s:.6g}"


def plan_rows(model: TransformerModel, result: PlanResult, calibration: str,
              efficiency: DeviceEfficiency) -> list[dict[str, str]]:
    """The plans as rows; `plausibility` flags an MFU outside anything published
    (`paraplan.predict.predictor.plausibility`)."""
    baselines = {f"{name}_s": baseline_cell(result.baselines.get(name)) for name in BASELINES}
    rows = []
    for rank, plan in enumerate(result.plans, start=1):
        s = plan.settings
        tokens = s.global_batch_size * model.seq_length / plan.iteration_s
        rows.append({
            "rank": str(rank), "model": model.name, "num_parameters": str(model.num_parameters),
            "active_parameters": str(model.active_parameters), "num_gpus": str(s.num_gpus),
            "global_batch_size": str(s.global_batch_size), "seq_length": str(model.seq_length),
            "tensor_model_parallel_size": str(s.tensor_model_parallel_size),
            "pipeline_model_parallel_size": str(s.pipeline_model_parallel_size),
            "data_parallel_size": str(s.data_parallel_size), "context_parallel_size": str(s.context_parallel_size),
            "cp_comm_type": s.cp_comm_type if s.context_parallel_size > 1 else "",
            "expert_model_parallel_size": str(s.expert_model_parallel_size),
            "expert_tensor_parallel_size": str(s.expert_tensor_parallel),
            "micro_batch_size": str(s.micro_batch_size),
            "virtual_pipeline_model_parallel_size": str(s.virtual_pipeline_model_parallel_size),
            "decoder_first_pipeline_num_layers": str(s.decoder_first_pipeline_num_layers or ""),
            "decoder_last_pipeline_num_layers": str(s.decoder_last_pipeline_num_layers or ""),
            "account_for_embedding_in_pipeline_split": _flag(s.account_for_embedding_in_pipeline_split),
            "account_for_loss_in_pipeline_split": _flag(s.account_for_loss_in_pipeline_split),
            "recompute_granularity": s.recompute_granularity, "recompute_method": s.recompute_method,
            "recompute_num_layers": str(s.recompute_num_layers) if s.recompute_method else "",
            "sequence_parallel": _flag(s.sequence_parallel),
            "zero_stage": str(s.zero_stage),
            # ZeRO-3's choices where the plan makes them (`space.ZERO3_PIPELINED`); empty: the default
            "fsdp_reshard_after_forward": _chosen(s.fsdp_reshard_after_forward),
            "sharded_grad_reduce": _chosen(s.sharded_grad_reduce),
            "use_distributed_optimizer": _flag(s.use_distributed_optimizer),
            "overlap_grad_reduce": _flag(s.overlap_grad_reduce), "overlap_param_gather": _flag(s.overlap_param_gather),
            "tp_comm_overlap": _flag(s.tp_comm_overlap),
            # Megatron-LM turns it off for every schedule but the interleaved one
            "overlap_p2p_comm": _flag(s.p2p_overlapped),
            "overlap_moe_expert_parallel_comm": _flag(s.overlap_moe_expert_parallel_comm),
            "moe_shared_expert_overlap": _flag(s.moe_shared_expert_overlap),
            "moe_token_dispatcher_type": s.moe_token_dispatcher_type if model.is_moe else "",
            "moe_flex_dispatcher_backend": (s.moe_flex_dispatcher_backend if s.moe_token_dispatcher_type == "flex"
                                            else ""),
            "moe_flex_dispatcher_num_sms": str(s.moe_flex_dispatcher_num_sms or ""),
            # the model's own router (`paraplan.core.moe_router_model`); empty for a dense model
            "moe_router_score_function": s.moe_router_score_function if model.is_moe else "",
            "moe_router_enable_expert_bias": _flag(s.moe_router_enable_expert_bias) if model.is_moe else "",
            "moe_router_topk_scaling_factor": f"{s.moe_router_topk_scaling_factor:g}" if model.is_moe else "",
            "moe_router_pre_softmax": _flag(s.moe_router_pre_softmax) if model.is_moe else "",
            "schedule": s.pipeline_schedule, "dtype": s.dtype,
            "fp8_recipe": (s.fp8_recipe or DEFAULT_FP8_RECIPE) if s.dtype == "fp8" else "",
            "use_flash_attn": _flag(s.use_flash_attn),
            "predicted_iteration_s": f"{plan.iteration_s:.6g}", "predicted_tokens_per_s": f"{tokens:.6g}",
            "predicted_tflops_per_gpu": f"{plan.tflops_per_gpu:.6g}", "predicted_mfu": f"{plan.mfu:.6g}",
            "predicted_peak_memory_bytes": f"{plan.peak_memory_bytes:.0f}", **plan.peak_memory.cells(),
            "bubble_fraction": f"{plan.bubble_fraction:.6g}", "fits_memory": _flag(plan.fits_memory),
            "plausibility": plausibility(plan.mfu, efficiency),
            **baselines, "search_s": f"{result.search_s:.4g}", "calibration": calibration,
        })
    return rows


def describe(plan: RunPrediction) -> str:
    """One line a person reads: 'TP 8, PP 8, DP 16, micro-batch 1, v 3, selective recomputation, ...'."""
    s = plan.settings
    parts = [f"TP {s.tensor_model_parallel_size}",
             *([f"CP {s.context_parallel_size} ({s.cp_comm_type})"] if s.context_parallel_size > 1 else []),
             f"PP {s.pipeline_model_parallel_size}", f"DP {s.data_parallel_size}"]
    if s.expert_model_parallel_size > 1 or s.expert_tensor_parallel_size:
        parts.append(f"EP {s.expert_model_parallel_size}, ETP {s.expert_tensor_parallel}")
        if s.moe_token_dispatcher_type == "flex":
            parts.append(f"{FLEX_BACKEND_NAMES[s.moe_flex_dispatcher_backend]} dispatcher")
    parts.append(f"micro-batch {s.micro_batch_size}")
    if s.virtual_pipeline_model_parallel_size > 1:
        parts.append(f"v {s.virtual_pipeline_model_parallel_size}")
    if s.uneven_pipeline_split:
        parts.append(f"first/last stage {s.decoder_first_pipeline_num_layers or 'even'}/"
                     f"{s.decoder_last_pipeline_num_layers or 'even'} layers")
    counted = [what for what, on in (("embedding", s.account_for_embedding_in_pipeline_split),
                                     ("loss", s.account_for_loss_in_pipeline_split)) if on]
    if counted:
        parts.append(f"{' and '.join(counted)} counted as a layer")
    if s.pipeline_model_parallel_size > 1:
        parts.append(s.pipeline_schedule)
    if s.recompute_method == "block":
        parts.append(f"full recomputation of the first {s.recompute_num_layers} layers of each model chunk")
    elif s.recompute_method == "uniform":
        parts.append(f"full recomputation in groups of {s.recompute_num_layers} layers")
    else:
        parts.append(f"{s.recompute_granularity} recomputation" if s.recompute_granularity != "none"
                     else "no recomputation")
    if s.sequence_parallel:
        parts.append("sequence parallel")
    if s.tp_comm_overlap:
        parts.append("TP comm overlap")
    if s.overlap_moe_expert_parallel_comm:
        parts.append("EP all-to-all overlap")
    if s.moe_shared_expert_overlap:
        parts.append("shared-expert overlap")
    if s.use_distributed_optimizer:
        parts.append("distributed optimizer")
    elif s.zero_stage == 3 and s.fsdp_reshard_after_forward == "never":
        parts.append("ZeRO-3 (weights gathered once per iteration, gradients reduce-scattered after the last "
                     "micro-batch)")
    elif s.zero_stage:
        parts.append(f"ZeRO-{s.zero_stage}")
    return ", ".join(parts)
