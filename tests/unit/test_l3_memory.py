"""Peak memory of Llama 3 405B's 8K-token configurations (Dubey et al. 2024, Sec. 3.3.2,
Table 4: TP8, PP16 with V = 8, FSDP keeping the gathered weights to the backward and
accumulating FP32 gradients over the micro-batches), term by term from closed forms.

On one pipeline rank holding P parameters (after TP) with d-way sharding:
- sharded state: P (2 + 4 + 12) / d (bf16 weights, fp32 gradients, Adam's fp32 state);
- gathered bf16 weights, kept from the first forward to the last backward: 2 P;
- unsharded fp32 gradient accumulators, allocated by each model chunk's first backward
  and held to the reduce-scatter after the last micro-batch: 4 P once all chunks have
  run a backward;
- activations: Megatron's interleaved schedule keeps (p - r - 1) 2 + (v - 1) p forward
  chunk-micro-batches in its warm-up, one more in the steady state, and all M v
  forwards first where the warm-up reaches them (Megatron-Core's schedules.py).
With M = 32 per DP rank (DP64) chunk 0's first backward is the ((v - 1) p + 1)-th
backward, inside the steady state, so every accumulator is live at the activation peak;
with M = 16 (DP128) the forwards all run first and the accumulators grow only as the
backward frees activations. That, not the weight state, is why the 8K-GPU row needs
more memory than the 16K-GPU one (docs/fsdp.md)."""

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel
from paraplan.core.run_settings import RunSettings
from paraplan.predict.build import build_execution
from paraplan.predict.device_model import DeviceEfficiency
from paraplan.predict.models import load_model
from paraplan.predict.ops import layer_activation_bytes
from paraplan.sim.execution import run_iteration

H100 = load_cluster("dgx-h100")
COMM = ConstantBandwidthModel(100e9, 20e9)  # memory does not depend on the links
MODEL = load_model("llama3-405b", 8192)
T, P, V, GLOBAL_BATCH = 8, 16, 8, 2048
H, KV, FFN, S, HEADS = 16384, 8 * 128, 53248, 8192, 128
SHARDED_BYTES_PER_PARAM = 2 + 4 + 12


def settings(dp: int) -> RunSettings:
    return RunSettings(
        tensor_model_parallel_size=T, pipeline_model_parallel_size=P, data_parallel_size=dp,
        global_batch_size=GLOBAL_BATCH, micro_batch_size=1, virtual_pipeline_model_parallel_size=V,
        account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True,
        sequence_parallel=True, zero_stage=3, fsdp_reshard_after_forward="never",
        sharded_grad_reduce="last_microbatch", overlap_grad_reduce=True, overlap_param_gather=True,
        dtype="bf16", use_flash_attn=True, schedule="interleaved_1f1b")


def layer_act_bytes() -> int:
    """Korthikanti et al. 2022 with flash attention, no dropout, SwiGLU, GQA, per rank:
    norm inputs and outputs 4 e sh/t, Q K V e s (h + 2 kv)/t, the output projection's
    input e sh/t, the MLP's gate, up and SwiGLU output 3 e s ffn/t, and flash
    attention's fp32 softmax statistics 4 s a/t."""
    return 2 * S * (6 * H + 2 * KV + 3 * FFN) // T + 4 * S * HEADS // T


def layer_params() -> float:
    """One layer's parameters on one TP rank: attention (Q, O: h x h; K, V: h x kv),
    SwiGLU MLP (3 h ffn), two RMSNorm weights."""
    return (2 * H * H + 2 * H * KV + 3 * H * FFN + 2 * H) / T


def inflight(rank: int, microbatches: int) -> int:
    """Megatron-Core's interleaved 1F1B (`get_pp_rank_microbatches`, micro-batch group
    N = p): forward chunk-micro-batches held on pipeline rank `rank`: the warm-up
    2 (p - r - 1) + (v - 1) N and the steady state's next forward; every forward first
    where the warm-up reaches the total M v."""
    total = microbatches * V
    warmup = (P - rank - 1) * 2 + (V - 1) * P
    return total if warmup >= total else warmup + 1


def predicted(dp: int):
    model = build_execution(MODEL, settings(dp), H100, COMM, DeviceEfficiency())
    return model, run_iteration(model, timeline=False)


def test_layer_activation_and_parameters_closed_forms():
    assert layer_act_bytes() == 533_200_896
    assert layer_activation_bytes(MODEL, settings(64)) == pytest.approx(layer_act_bytes(), rel=1e-12)
    model, _ = predicted(64)
    # rank 1 holds 8 full layers (126 layers + embedding + loss = 128 slots over 16 x 8 chunks)
    assert model.memory[1].activation_bytes_per_chunk == pytest.approx([layer_act_bytes()] * V, rel=1e-12)
    stage = 8 * layer_params()
    assert model.memory[1].weights_bytes == pytest.approx(2 * stage / 64, rel=1e-9)


@pytest.mark.parametrize("dp", [64, 128])
def test_inflight_chunk_microbatches_follow_megatrons_warmup(dp):
    """M = 32: 2 (p - r - 1) + (v - 1) p + 1 (143 on rank 0, 113 on the last); M = 16:
    all 128 forwards first on ranks 0-7, 127 down to 113 on ranks 8-15."""
    m = GLOBAL_BATCH // dp
    _, result = predicted(dp)
    assert list(result.inflight_microbatches) == [inflight(r, m) for r in range(P)]


@pytest.mark.parametrize(("dp", "accumulators_live"), [(64, 8), (128, 1)])
def test_rank1_peak_is_state_weights_accumulators_and_activations(dp, accumulators_live):
    """Rank 1 (8 full layers, the largest peak): sharded state 18 P / d, gathered weights
    2 P, and at the activation peak
    - M = 32: all 8 chunks' fp32 accumulators (4 P) beside 141 chunk-micro-batches
      (chunk 0's first backward is the 113th backward, the steady state runs 116);
    - M = 16: the forwards all ran first; the peak is right after the first backward
      (chunk 7, micro-batch 0): 127 chunk-micro-batches and one chunk's accumulators."""
    m = GLOBAL_BATCH // dp
    stage = 8 * layer_params()
    act = layer_act_bytes()
    held = inflight(1, m) * act if accumulators_live == V else (inflight(1, m) - 1) * act
    expected = SHARDED_BYTES_PER_PARAM * stage / dp + 2 * stage + 4 * accumulators_live * stage / V + held
    _, result = predicted(dp)
    assert result.peak_memory_bytes[1] == pytest.approx(expected, rel=1e-9)
    assert float(np.max(result.peak_memory_bytes)) == pytest.approx(expected, rel=1e-9)


def test_the_8k_row_peaks_above_the_16k_row_by_the_schedule_not_the_weight_state():
    """The difference is the sharded state's halving (-9 P / 64), 13 more chunk-micro-
    batches in flight and 7 chunks' accumulators live at the peak: about 19.1 GB."""
    stage = 8 * layer_params()
    act = layer_act_bytes()
    diff = (SHARDED_BYTES_PER_PARAM * stage / 64 - SHARDED_BYTES_PER_PARAM * stage / 128
            + (141 - 127) * act + 4 * 7 * stage / V)
    (_, r8k), (_, r16k) = predicted(64), predicted(128)
    assert r8k.peak_memory_bytes.max() - r16k.peak_memory_bytes.max() == pytest.approx(diff, rel=1e-9)
    assert diff == pytest.approx(19.07e9, rel=1e-3)
