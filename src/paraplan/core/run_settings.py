"""How one training run executes: parallel degrees, batch, recomputation, optimizer
sharding, overlaps and precision, in Megatron-LM's argument names.

Every interlock between these settings and a model is checked in one place,
`RunSettings.check(model)`, which raises `StrategyError` naming the setting and
what was expected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from paraplan.core.errors import StrategyError
from paraplan.core.moe_router_settings import MoeRouterSettings, check_router
from paraplan.core.pipeline_split import (  # noqa: F401  (the split functions' former home)
    check_pipeline_split,
    embedding_loss_split,
    interleaved_uneven_split,
    layers_per_virtual_stage,
    pipeline_layer_split,
    pipeline_split_slots,
)
from paraplan.core.precision_settings import LowPrecisionStorageSettings, check_low_precision_storage
from paraplan.core.sharding import (
    GradReduce,
    ReshardAfterForward,
    check_sharding,
    expert_sharding_group_size,
    sharding_group_size,
)
from paraplan.core.transformer import TransformerModel

RecomputeGranularity = Literal["none", "selective", "full"]
Dtype = Literal["bf16", "fp16", "fp8", "fp32"]
PipelineSchedule = Literal["1f1b", "interleaved_1f1b", "gpipe", "zb_h1", "dualpipe"]
RECOMPUTE_GRANULARITIES: tuple[str, ...] = ("none", "selective", "full")
RECOMPUTE_METHODS: tuple[str, ...] = ("uniform", "block")
"""Megatron-LM's `--recompute-method` (`paraplan.predict.partial_recompute`)."""
MOE_RECOMPUTE_MODULES: tuple[str, ...] = ("moe_act", "moe", "shared_experts")
"""Megatron-Core's `--recompute-modules` of a MoE layer's block (`paraplan.predict.moe_ops`)."""
RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn", "mla_up_proj", "layernorm", "mlp", *MOE_RECOMPUTE_MODULES)
"""Megatron-Core's `--recompute-modules` that paraplan prices (`paraplan.predict.ops`, `moe_ops`)."""
DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8", "fp32")
PIPELINE_SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved_1f1b", "gpipe", "zb_h1", "dualpipe")
MoeDispatcher = Literal["alltoall", "flex"]
MOE_DISPATCHERS: tuple[str, ...] = ("alltoall", "flex")
FlexDispatcherBackend = Literal["deepep", "hybridep"]
FLEX_DISPATCHER_BACKENDS: tuple[str, ...] = ("deepep", "hybridep")
FLEX_BACKEND_NAMES: dict[str, str] = {"deepep": "DeepEP", "hybridep": "HybridEP"}
"""How the flex dispatcher's backends name themselves (their libraries' spelling)."""
CPCommType = Literal["p2p", "all_gather", "a2a", "torch_allgather", "torch_alltoall"]
CP_COMM_TYPES: tuple[str, ...] = ("p2p", "all_gather", "a2a", "torch_allgather", "torch_alltoall")
DDPImpl = Literal["local", "torch"]
DDP_IMPLS: tuple[str, ...] = ("local", "torch")
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}
Fp8Recipe = Literal["delayed", "tensorwise", "blockwise", "mxfp8", "torchao_tensorwise"]
FP8_RECIPES: tuple[str, ...] = ("delayed", "tensorwise", "blockwise", "mxfp8")
"""Megatron-LM's `--fp8-recipe` choices (`paraplan.predict.fp8_ops` prices each)."""
# torchao Float8 (torchtitan): `paraplan.predict.torchao_fp8`
TORCHAO_FP8_RECIPE = "torchao_tensorwise"
"""torchao's Float8Linear with dynamic tensorwise scaling (torchtitan's
`--float8.enable_float8_linear`; `paraplan.predict.torchao_fp8`)."""
FP8_RECIPE_CHOICES: tuple[str, ...] = (*FP8_RECIPES, TORCHAO_FP8_RECIPE)
DEFAULT_FP8_RECIPE = "delayed"
"""Megatron-LM's default `--fp8-recipe`: what an fp8 run with an empty `fp8_recipe` uses."""
AttentionBackend = Literal["flash", "fused", "unfused", "local", "auto"]
ATTENTION_BACKENDS: tuple[str, ...] = ("flash", "fused", "unfused", "local", "auto")
"""Megatron-LM's `--attention-backend` choices (`paraplan.kernels.attention_backends`
says which kernel each runs on which device)."""
FLASH_ATTENTION_VERSIONS: tuple[int, ...] = (0, 2, 3, 4)
"""Megatron-LM's `--flash-attention-version` pins (0: none)."""
FUSED_ATTENTION_BACKENDS: tuple[str, ...] = ("flash", "fused")
UNFUSED_ATTENTION_BACKENDS: tuple[str, ...] = ("unfused", "local")
ElementwiseKernels = Literal["fused", "eager"]
ELEMENTWISE_KERNELS: tuple[str, ...] = ("fused", "eager")
"""How the layer's norms, rotary embedding, activation and residual adds run
(`paraplan.predict.eager_ops`): fused kernels, or PyTorch's unfused ops one kernel each."""
CrossEntropyImpl = Literal["megatron", "torch"]
CROSS_ENTROPY_IMPLS: tuple[str, ...] = ("megatron", "torch")
"""Which code computes the loss (`paraplan.predict.loss_ops`): Megatron-Core's
`vocab_parallel_cross_entropy`, or PyTorch's `F.cross_entropy` on fp32 logits (torchtitan)."""
# -- u3-fsdp2: torch.optim's foreach step (paraplan.predict.fsdp2_passes)
OptimizerImpl = Literal["fused", "foreach"]
OPTIMIZER_IMPLS: tuple[str, ...] = ("fused", "foreach")
"""The optimizer step's code (`paraplan.predict.fsdp2_passes.optimizer_step_bytes`): one fused
Adam kernel (Megatron-LM's), or torch.optim.AdamW's multi-tensor path (torchtitan)."""
FsdpParamDtype = Literal["fp32", "bf16"]
FSDP_PARAM_DTYPES: tuple[str, ...] = ("fp32", "bf16")
"""The dtype FSDP2 keeps its sharded parameters in (`RunSettings.fsdp_param_dtype`)."""
FSDP_PARAM_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2}
# -- end u3-fsdp2
MAIN_GRAD_BYTES: dict[str, int] = {"bf16": 4, "fp16": 2, "fp8": 4, "fp32": 4}


def main_grad_bytes(settings: RunSettings) -> int:
    """Bytes of one main gradient (Megatron's `main_grad` buffer): `MAIN_GRAD_BYTES` of
    the dtype, 2 with `grad_reduce_in_bf16` or `main_grads_dtype bf16`."""
    if settings.grad_reduce_in_bf16 or settings.main_grads_dtype == "bf16":
        return 2
    return MAIN_GRAD_BYTES[settings.dtype]
"""Bytes of one accumulated (main) gradient per parameter (Megatron-LM's mixed precision)."""


@dataclass(frozen=True)
class RunSettings(MoeRouterSettings, LowPrecisionStorageSettings):
    """One run's execution settings (the columns of a run table besides the model; the
    MoE router's in `MoeRouterSettings`, the precision-aware optimizer's in
    `LowPrecisionStorageSettings`)."""

    tensor_model_parallel_size: int = 1
    """t: ranks that split every layer's weights (Megatron's column/row split)."""
    pipeline_model_parallel_size: int = 1
    """p: pipeline stages."""
    data_parallel_size: int = 1
    """d: model replicas, each fed global_batch_size / d sequences per iteration."""
    context_parallel_size: int = 1
    """c: ranks that split every sequence (Megatron-Core's context parallelism): each holds
    s / c tokens of each sequence and the same weights; attention exchanges keys and
    values between them (`cp_comm_type`). Rank order tp-cp-dp-pp; the gradients are
    reduced over the d x c ranks that hold the same weights."""
    cp_comm_type: CPCommType = "p2p"
    """`p2p`: ring attention, key/value blocks passed around the c ranks in c - 1 steps,
    each step's transfer beside the previous step's attention; `all_gather`: keys and
    values of the whole sequence all-gathered before attention (Llama 3's CP), their
    gradients reduce-scattered after; `a2a`: Ulysses, an
    all-to-all of Q, K, V before attention (heads split over the c ranks, whole
    sequences) and of its output after; `torch_allgather` / `torch_alltoall`: PyTorch's
    `context_parallel` (torchtitan's CP) with rotate method allgather / alltoall: c
    flash-attention calls per pass merged in fp32, the key/value gradients passed
    around the ring in fp32 (`paraplan.predict.cp_ops`)."""
    global_batch_size: int = 1
    """B: sequences per iteration over all replicas."""
    micro_batch_size: int = 1
    """b: sequences per micro-batch on one replica."""
    virtual_pipeline_model_parallel_size: int = 1
    """v: model chunks per pipeline rank (interleaved 1F1B when > 1)."""
    recompute_granularity: RecomputeGranularity = "none"
    """`selective`: recompute the attention core in backward (Korthikanti et al. 2022);
    `full`: keep only each layer's input and recompute the layer."""
    recompute_method: str = ""
    """Megatron-LM's `--recompute-method` with `full`: `uniform` (the chunk's layers
    checkpointed in groups of `recompute_num_layers`) or `block` (only the first
    `recompute_num_layers` layers of each model chunk, the rest keep their activations);
    empty: every layer on its own (uniform 1). `paraplan.predict.partial_recompute`."""
    recompute_num_layers: int = 0
    """Megatron-LM's `--recompute-num-layers` with a `recompute_method`: the group size
    (uniform) or the layers recomputed per model chunk (block); 0 with no method."""
    recompute_modules: tuple[str, ...] = ("core_attn",)
    """With `selective`: what the backward recomputes (Megatron-Core's
    `--recompute-modules`, default core_attn): `core_attn` the attention core,
    `mla_up_proj` multi-latent attention's up projections and rotary parts (the core's
    Q, K, V are not kept), `layernorm` the two input norms (their outputs are not kept),
    `mlp` a dense MLP (only its input is kept)."""
    selective_ac_option: Literal["", "op"] = ""
    """torchtitan's `activation_checkpoint.selective_ac_option`; `op` with `selective`:
    torchtitan's per-op policy in place of `recompute_modules` (a layer keeps its input
    and the outputs of its attention kernel and of every second matmul, and recomputes
    the rest in its backward: `paraplan.predict.torchtitan_ac`); empty: Megatron's."""
    sequence_parallel: bool = False
    """Split norms and dropouts over the tensor-parallel ranks along the sequence;
    all-gather + reduce-scatter replace each all-reduce."""
    use_distributed_optimizer: bool = False
    """Megatron's distributed optimizer: optimizer state and main weights sharded over
    the data-parallel ranks; gradients reduce-scattered, weights all-gathered."""
    zero_stage: int = 0
    """DeepSpeed ZeRO: 1 shards optimizer state, 2 also gradients, 3 also weights (3 is
    PyTorch FSDP2 / Megatron-FSDP `optim_grads_params`: each layer's weights gathered
    before its forward and backward, prefetched beside the previous layer's compute)."""
    data_parallel_shard_degree: int = 0
    """torchtitan's: data-parallel ranks the sharded state is split over (with the
    context-parallel ranks, S x c); 0: all of them (`paraplan.core.sharding`)."""
    data_parallel_replicate_degree: int = 0
    """torchtitan's: copies of each shard (hybrid sharding, HSDP); 0: d / shard degree."""
    num_distributed_optimizer_instances: int = 1
    """Megatron-LM's: with the distributed optimizer, replicas of the sharded optimizer
    (each shards over d c / instances ranks)."""
    fsdp_reshard_after_forward: ReshardAfterForward = "default"
    """torchtitan's: with zero_stage 3, free gathered weights after the forward
    (`always`), keep them to the backward (`never`); `default`: never with pipelines."""
    use_torch_fsdp2: bool = False
    """Megatron-LM's `--use-torch-fsdp2` (torchtitan, NeMo AutoModel): with zero_stage 3,
    PyTorch FSDP2's per-parameter sharding as it runs (`paraplan.predict.fsdp_ops`): fp32
    sharded weights cast into each gather, the gathered weights copied out and the
    gradients copied into each reduce-scatter on the compute stream, the root unit
    (embedding, final norm, head) kept from its forward to its backward and
    reduce-scattered after the backward; False: ZeRO-3 without these copies."""
    optimizer_impl: OptimizerImpl = "fused"
    """`fused` (default): Megatron-LM's fused Adam, one kernel per step; `foreach`:
    torch.optim.AdamW(foreach=True) on FSDP2's shards after torch's
    `clip_grad_norm_` (torchtitan's default, `optimizer.fused = false`; needs use_torch_fsdp2)."""
    fsdp_param_dtype: FsdpParamDtype = "fp32"
    """With use_torch_fsdp2: the dtype of the model's own parameters, which FSDP2 shards and
    the optimizer updates, its gradients and torch.optim's moments following it (`fp32`:
    16 bytes per sharded parameter, as torchtitan builds the model; `bf16`: 8, as NeMo
    AutoModel builds it, `torch_dtype` auto; docs/fsdp.md)."""
    sharded_grad_reduce: GradReduce = "default"
    """With zero_stage 2 or 3: reduce-scatter the gradients after every micro-batch
    (`every_microbatch`, Megatron-FSDP) or once after the last (`last_microbatch`,
    FSDP2 under pipelines); `default`: every with 2, last with 3 (`paraplan.core.sharding`)."""
    overlap_grad_reduce: bool = False
    """Start gradient reduction in buckets during the last micro-batch's backward."""
    overlap_param_gather: bool = False
    """With sharded weights: all-gather the next iteration's weights during forward."""
    tp_comm_overlap: bool = False
    """Overlap tensor-parallel communication with the GEMMs around it (Megatron-Core with
    Transformer Engine's userbuffers; Megatron requires sequence parallelism for it):
    the forward all-gathers and reduce-scatters and the backward re-gathers run beside
    the GEMM that consumes or produces them. Megatron's default: off."""
    async_tensor_model_parallel_allreduce: bool = True
    """Run the backward all-reduce of a column-parallel layer's input gradient beside its
    weight-gradient GEMM (Megatron-LM since September 2021; the flag
    `--no-async-tensor-model-parallel-allreduce` turned it off until Megatron-Core made
    it unconditional, so the default is on). Megatron-DeepSpeed turns it off whenever
    DeepSpeed runs the model, as do Megatron-LM versions before it: then the all-reduce
    blocks the backward. With sequence parallelism the reduce-scatter and re-gather
    run asynchronously either way (as in both code bases)."""
    dtype: Dtype = "bf16"
    """Precision of weights, activations and GEMMs (fp8: the linear layers' GEMMs in 8
    bits with Transformer Engine, the rest in bf16; `paraplan.predict.fp8_ops`)."""
    fp8_recipe: Fp8Recipe | Literal[""] = ""
    """With dtype fp8, Megatron-LM's `--fp8-recipe`: `delayed` (per-tensor scales from an
    amax history), `tensorwise` (per-tensor current scaling), `blockwise` (1 x 128 / 128 x
    128 blocks, DeepSeek-V3's), `mxfp8` (Blackwell's 1 x 32 blocks); empty: Megatron's
    default, `DEFAULT_FP8_RECIPE`. `torchao_tensorwise`: torchao's Float8Linear as
    torchtitan runs it (`--float8.enable_float8_linear`: dynamic tensorwise scales, the
    output layer in bf16; `paraplan.predict.torchao_fp8`)."""
    # torchao Float8 (torchtitan): `paraplan.predict.torchao_fp8`
    enable_fsdp_float8_all_gather: bool = False
    """torchtitan's `--float8.enable_fsdp_float8_all_gather` (fp8_recipe torchao_tensorwise,
    zero_stage 3): each weight shard is cast to FP8 before FSDP's all-gather, which then
    moves 1 byte per weight instead of 2."""
    precompute_float8_dynamic_scale_for_fsdp: bool = False
    """torchtitan's `--float8.precompute_float8_dynamic_scale_for_fsdp` (with the float8
    all-gather): the weights' scales from one all-reduce of all amaxes per iteration,
    instead of one small all-reduce per weight before each all-gather."""
    schedule: PipelineSchedule | Literal[""] = ""
    """Pipeline schedule; empty: interleaved_1f1b when v > 1, else 1f1b. `dualpipe`:
    DeepSeek-V3's bidirectional DualPipe (`paraplan.sim.dualpipe`), each rank holding
    stage r and stage p - 1 - r, micro-batches fed from both ends, one's forward beside
    another's backward."""
    use_flash_attn: bool = True
    """Fused (flash) attention; False: the unfused product, softmax, dropout, product."""
    attention_backend: AttentionBackend = "auto"
    """Megatron-LM's `--attention-backend`: `flash` (FlashAttention-2), `fused` (cuDNN),
    `unfused`/`local` (the unfused path: `use_flash_attn` false), `auto` (Megatron's
    default: Transformer Engine's pick on the device, or the unfused path without
    `use_flash_attn`); which kernel on which device: `paraplan.kernels.attention_backends`."""
    elementwise_kernels: ElementwiseKernels = "fused"
    """`fused` (default): each norm, the rotary embedding, the activation and each residual
    add is one fused kernel (Megatron-LM with Transformer Engine; torchtitan with
    `training.compile`, which compiles each transformer block); `eager`: PyTorch's ops of
    torchtitan's Llama one kernel each, RMSNorm and rotary in fp32 (torchtitan without
    `training.compile`; `paraplan.predict.eager_ops`)."""
    cross_entropy_impl: CrossEntropyImpl = "megatron"
    """The cross-entropy loss's code (`paraplan.predict.loss_ops` prices each): `megatron`
    (default), Megatron-Core's `vocab_parallel_cross_entropy` without
    `--cross-entropy-loss-fusion`, in place on one fp32 copy of the logits; `torch`,
    PyTorch's `F.cross_entropy` on `logits.float()` as torchtitan runs it (with t > 1 its
    loss parallelism), whose fp32 copies and gradients coexist for a moment; with p > 1 it
    also stands for torchtitan's pipelines, `torch.distributed.pipelining`'s, which keep
    every stage's outputs (the last stage's logits) and input gradients to the
    iteration's end beside receive buffers allocated once per micro-batch
    (`paraplan.predict.torch_pipelining`)."""
    flash_attention_version: int = 0
    """Megatron-LM's `--flash-attention-version` (2, 3 or 4): the FlashAttention generation
    a run that runs FlashAttention uses; 0 (not pinned): FlashAttention-2, the package
    Transformer Engine installs with (FlashAttention-3 is a separate Hopper build)."""
    gradient_accumulation_fusion: bool = True
    """Weight-gradient GEMMs accumulate straight into the fp32 main gradients (Megatron
    since February 2022, its default); False: every micro-batch's weight gradient is
    written, then added to the main gradient by a memory-bound kernel (reads both,
    writes the sum)."""
    grad_reduce_in_bf16: bool = False
    """Megatron-LM's `--grad-reduce-in-bf16` (Megatron-Core's `grad_reduce_in_fp32` false,
    as NVIDIA's Megatron-Bridge performance recipes set it): the main-gradient buffer, its
    accumulation and its data-parallel reduction in bf16 (2 bytes per parameter instead
    of 4); the optimizer casts its shard to fp32 for the step (`main_grad_bytes`,
    `paraplan.predict.placement.Precision`). Only with dtype bf16 or fp8."""
    decoder_first_pipeline_num_layers: int = 0
    """Transformer layers on the first pipeline stage (all its model chunks together);
    0: Megatron's default, an even split (`pipeline_layer_split`)."""
    decoder_last_pipeline_num_layers: int = 0
    """Transformer layers on the last pipeline stage; 0: an even split."""
    account_for_embedding_in_pipeline_split: bool = False
    """Megatron-Core's: the embedding counts as one layer when the layers are split over
    the virtual stages, so the first virtual stage holds one transformer layer fewer
    (`embedding_loss_split`)."""
    account_for_loss_in_pipeline_split: bool = False
    """Megatron-Core's: the output layer and loss count as one layer, so the last virtual
    stage holds one transformer layer fewer."""
    pipeline_model_parallel_layout: str = ""
    """Megatron-Core's explicit layout, e.g. `Et|(tt|)*30mL` (`paraplan.core.pipeline_layout`):
    the layers of every virtual stage; v is its number of stages / p. Empty: the split
    the other settings give."""
    DDP_impl: DDPImpl = "local"
    """Data-parallel wrapper (Megatron-LM / Megatron-DeepSpeed `--DDP-impl`): `local`,
    Megatron's own DDP, reduces the gradient buffer after the backward unless
    `overlap_grad_reduce`; `torch`, PyTorch's DistributedDataParallel, reduces 25 MiB
    buckets of 16-bit gradients during the last micro-batch's backward."""
    expert_model_parallel_size: int = 1
    """EP: ranks that split a mixture-of-experts layer's routed experts (num_experts / EP
    each); tokens reach their experts by an all-to-all over the EP group. Megatron-Core's
    layout: the expert layers reuse each pipeline stage's TP x DP ranks, ordered
    expert-tensor rank fastest, then EP, then the expert-data-parallel rank."""
    expert_tensor_parallel_size: int = 0
    """ETP: ranks that split each routed expert's weights (column/row as the dense MLP);
    0: Megatron-Core's default, the tensor-parallel size."""
    moe_load_imbalance: float = 1.0
    """paraplan's: tokens the busiest rank of an expert-parallel group receives over the
    mean (dropless routing is never perfectly even); the dispatch/combine all-to-alls
    and the expert GEMMs are priced for that rank. 1.0: an even router."""
    moe_expert_capacity_factor: float = 0.0
    """Megatron-Core's: each expert takes at most this x its even share of a rank's
    routed tokens, the rest are dropped; 0: dropless (Megatron's None). It caps
    `moe_load_imbalance`."""
    moe_pad_expert_input_to_capacity: bool = False
    """Megatron-Core's: with a capacity factor, every expert's input is padded to its
    capacity (all-to-alls and expert GEMMs carry capacity x the even share)."""
    moe_shared_expert_overlap: bool = False
    """Megatron-Core's: the shared experts run after the router, beside the token
    dispatch and combine all-to-alls (else before the router, in series)."""
    moe_token_dispatcher_type: MoeDispatcher = "alltoall"
    """Megatron-Core's: `alltoall` (NCCL all-to-alls) or `flex`, whose kernels
    `moe_flex_dispatcher_backend` names (`paraplan.predict.moe_deepep`); Megatron's own
    default, allgather, is not modelled."""
    moe_flex_dispatcher_backend: FlexDispatcherBackend = "deepep"
    """Megatron-Core's: the flex dispatcher's kernels, DeepEP's normal kernels (`deepep`,
    its default) or NVIDIA's HybridEP (`hybridep`); priced at their published bandwidths
    (`paraplan.predict.moe_deepep`)."""
    moe_flex_dispatcher_num_sms: int = 0
    """Megatron-Core's (its deprecated `moe_hybridep_num_sms` / `moe_deepep_num_sms`): the
    SMs the flex dispatcher's kernels run on; 0: the backend's default (DeepEP 20,
    HybridEP 8 across nodes). Each backend is priced only at SM counts it was measured
    with (`paraplan.predict.moe_deepep`)."""
    overlap_moe_expert_parallel_comm: bool = False
    """Megatron-Core's: the 1F1B schedule runs one micro-batch's forward and another's
    backward layer by layer together, each one's dispatch and combine all-to-alls
    beside the other's attention or experts (`paraplan.predict.moe_ops`)."""

    overlap_p2p_comm: bool = True
    """Megatron-LM's (`--no-overlap-p2p-communication` turns it off; opt-in from May 2023,
    default since October 2023, absent before): the interleaved schedule's pipeline
    transfers run beside the next chunk's compute. Megatron sets it false for every other
    schedule, whose transfers block both ranks (`p2p_overlapped`, docs/pipeline-schedules.md)."""

    scatter_gather_tensors_in_pipeline: bool = False
    """Megatron-LM's `--scatter-gather-tensors-in-pipeline` (on by default from February
    2021, 72e4230b, until the transfers moved into Megatron-Core in January 2023,
    39b83c79, whose code no longer reads it; so paraplan's default is Megatron-Core's,
    off: set it true for Megatron-LM runs of 2021-2022 and for DeepSpeed's pipeline
    engine, which partitions transfers the same way over its model-parallel group).
    Without sequence parallelism each tensor-parallel rank sends 1/t of a pipeline
    transfer and the receiver re-assembles it with an all-gather over the tensor-parallel
    group; false: whole activations. No effect with sequence
    parallelism, whose activations are already split (`paraplan.predict.pipeline_p2p`)."""

    batch_p2p_sync: bool = True
    """Megatron-Core's (`ModelParallelConfig`, no command-line flag): a
    `torch.cuda.synchronize()` after each batched (blocking) pipeline exchange, which
    Megatron-LM's `_communicate` has called after every exchange since January 2021
    (27fc4689); the host then
    issues the next op's kernels while the GPU waits (`paraplan.predict.pipeline_p2p`).
    False for DeepSpeed's pipeline engine (Megatron-DeepSpeed), which sends with plain
    `dist.send` / `dist.recv`. No effect on overlapped transfers (`p2p_overlapped`)."""

    @property
    def p2p_overlapped(self) -> bool:
        """Pipeline transfers overlap compute: `overlap_p2p_comm` with model chunks (v > 1)."""
        return self.overlap_p2p_comm and self.virtual_pipeline_model_parallel_size > 1

    @property
    def pipeline_schedule(self) -> str:
        if self.schedule:
            return self.schedule
        return "interleaved_1f1b" if self.virtual_pipeline_model_parallel_size > 1 else "1f1b"

    @property
    def uneven_pipeline_split(self) -> bool:
        return bool(self.decoder_first_pipeline_num_layers or self.decoder_last_pipeline_num_layers)

    @property
    def explicit_pipeline_split(self) -> bool:
        """The run says how its layers split over the stages (first/last counts, the
        embedding or loss counted as a layer, or a layout): nothing to choose."""
        return bool(self.uneven_pipeline_split or self.account_for_embedding_in_pipeline_split
                    or self.account_for_loss_in_pipeline_split or self.pipeline_model_parallel_layout)

    def pipeline_split_slots(self, num_layers: int) -> int:
        """The layers plus the embedding / loss where they count as layers."""
        return pipeline_split_slots(self, num_layers)

    def layers_per_virtual_stage(self, num_layers: int) -> list[int]:
        """Transformer layers of each virtual stage (`paraplan.core.pipeline_split`)."""
        return layers_per_virtual_stage(self, num_layers)

    @property
    def num_gpus(self) -> int:
        return (self.tensor_model_parallel_size * self.context_parallel_size * self.pipeline_model_parallel_size
                * self.data_parallel_size)

    @property
    def data_context_parallel_size(self) -> int:
        """d x c: the ranks that hold the same weights (Megatron's dp-cp group): gradients
        are reduced and optimizer state / ZeRO shards are split over them."""
        return self.data_parallel_size * self.context_parallel_size

    @property
    def num_microbatches(self) -> int:
        """M = B / (d b): micro-batches per replica per iteration."""
        return self.global_batch_size // (self.data_parallel_size * self.micro_batch_size)

    @property
    def expert_tensor_parallel(self) -> int:
        """ETP with 0 resolved to the tensor-parallel size (Megatron-Core's default)."""
        return self.expert_tensor_parallel_size or self.tensor_model_parallel_size

    @property
    def expert_data_parallel_size(self) -> int:
        """Ranks holding the same expert shard: t c d / (EP x ETP) (Megatron-Core: the
        expert grid spans a pipeline stage's tensor, context and data-parallel ranks)."""
        ranks = self.tensor_model_parallel_size * self.context_parallel_size * self.data_parallel_size
        return max(ranks // (self.expert_model_parallel_size * self.expert_tensor_parallel), 1)

    @property
    def expert_optimizer_shards(self) -> int:
        """Ranks the expert weights' optimizer state is sharded over (1: not sharded):
        EDP / R (`paraplan.core.sharding`)."""
        sharded = self.use_distributed_optimizer or self.zero_stage >= 1
        return expert_sharding_group_size(self) if sharded else 1

    @property
    def optimizer_shards(self) -> int:
        """Ranks the optimizer state is sharded over (1: not sharded)."""
        sharded = self.use_distributed_optimizer or self.zero_stage >= 1
        return sharding_group_size(self) if sharded else 1

    def check(self, model: TransformerModel) -> None:
        """Raise `StrategyError` for settings that cannot run `model` (the rules of one
        feature each in `paraplan.core.run_settings_checks`)."""
        from paraplan.core import run_settings_checks as checks

        for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size",
                    "context_parallel_size", "global_batch_size", "micro_batch_size",
                    "virtual_pipeline_model_parallel_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StrategyError(f"{key} must be an integer >= 1, got {value!r}")
        if self.recompute_granularity not in RECOMPUTE_GRANULARITIES:
            raise StrategyError(
                f"recompute_granularity '{self.recompute_granularity}' is not one of "
                f"{', '.join(RECOMPUTE_GRANULARITIES)}"
            )
        checks.check_recompute_modules(self, model)
        checks.check_recompute_method(self)
        if self.dtype not in DTYPES:
            raise StrategyError(f"dtype '{self.dtype}' is not one of {', '.join(DTYPES)}")
        if self.zero_stage not in ZERO_STAGES:
            raise StrategyError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.DDP_impl not in DDP_IMPLS:
            raise StrategyError(f"DDP_impl '{self.DDP_impl}' is not one of {', '.join(DDP_IMPLS)}")
        if self.DDP_impl == "torch":
            if self.use_distributed_optimizer or self.zero_stage:
                raise StrategyError("DDP_impl torch cannot shard the optimizer: use_distributed_optimizer needs "
                                    "DDP_impl local (Megatron) and zero_stage runs under DeepSpeed's engine")
            if self.overlap_grad_reduce:
                raise StrategyError("overlap_grad_reduce is an option of DDP_impl local; torch's DDP always "
                                    "overlaps its gradient reduction")
        checks.check_attention_backend(self)
        checks.check_elementwise_kernels(self, model)
        checks.check_cross_entropy(self)
        checks.check_torch_fsdp2(self)  # u3-fsdp2
        if self.schedule and self.schedule not in PIPELINE_SCHEDULES:
            raise StrategyError(f"schedule '{self.schedule}' is not one of {', '.join(PIPELINE_SCHEDULES)}")
        t, p, v = (self.tensor_model_parallel_size, self.pipeline_model_parallel_size,
                   self.virtual_pipeline_model_parallel_size)
        d, b, batch = self.data_parallel_size, self.micro_batch_size, self.global_batch_size
        if batch % (d * b):
            raise StrategyError(
                f"global_batch_size {batch} is not divisible by data_parallel_size x micro_batch_size "
                f"= {d} x {b}"
            )
        if model.num_attention_heads % t:
            raise StrategyError(
                f"num_attention_heads {model.num_attention_heads} is not divisible by "
                f"tensor_model_parallel_size {t}"
            )
        if model.query_groups % t:
            raise StrategyError(
                f"num_query_groups {model.query_groups} is not divisible by tensor_model_parallel_size {t}"
            )
        if model.ffn_size % t:
            raise StrategyError(
                f"ffn_hidden_size {model.ffn_size} is not divisible by tensor_model_parallel_size {t}"
            )
        if self.sequence_parallel and model.seq_length % t:
            raise StrategyError(
                f"sequence_parallel needs seq_length {model.seq_length} divisible by "
                f"tensor_model_parallel_size {t}"
            )
        checks.check_context_parallel(self, model)
        if self.grad_reduce_in_bf16 and self.dtype not in ("bf16", "fp8"):
            raise StrategyError(f"grad_reduce_in_bf16 with dtype {self.dtype}: expected dtype bf16 or fp8 "
                                "(fp16 gradients are 16-bit already, fp32 ones stay fp32)")
        if self.fp8_recipe and (self.dtype != "fp8" or self.fp8_recipe not in FP8_RECIPE_CHOICES):
            expected = f"one of {', '.join(FP8_RECIPE_CHOICES)}" if self.dtype == "fp8" else "empty unless dtype fp8"
            raise StrategyError(f"fp8_recipe '{self.fp8_recipe}' with dtype {self.dtype}: expected {expected}")
        checks.check_torchao_float8(self, model)  # torchao Float8 (torchtitan)
        check_low_precision_storage(self, self.dtype, self.use_distributed_optimizer, self.zero_stage, self.fp8_recipe,
                                    model.swiglu,
                                    self.elementwise_kernels == "fused")  # w1-precopt
        check_pipeline_split(self, model)
        schedule = self.pipeline_schedule
        if v > 1 and schedule != "interleaved_1f1b":
            raise StrategyError(
                f"virtual_pipeline_model_parallel_size {v} needs schedule interleaved_1f1b, got {schedule}"
            )
        if v > 1 and p < (2 if self.overlap_p2p_comm else 3):  # Megatron: two ranks exchange twice per batch
            raise StrategyError(f"virtual_pipeline_model_parallel_size > 1 needs pipeline_model_parallel_size >= "
                                f"{2 if self.overlap_p2p_comm else '3 without overlap_p2p_comm'}")
        if schedule == "interleaved_1f1b" and v > 1 and self.num_microbatches % p:
            raise StrategyError(
                f"the interleaved schedule needs the number of micro-batches ({self.num_microbatches}) "
                f"divisible by pipeline_model_parallel_size {p}"
            )
        if schedule == "dualpipe":  # -- v5-dualpipe
            checks.check_dualpipe_settings(self)
        check_sharding(self, model)
        if self.overlap_param_gather and self.optimizer_shards == 1 and self.zero_stage < 3:
            raise StrategyError("overlap_param_gather needs use_distributed_optimizer or a zero_stage")
        checks.check_experts(self, model)
        check_router(self, model)  # v6-router
        checks.check_recompute_block(self, model)
