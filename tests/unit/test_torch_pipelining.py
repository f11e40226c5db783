"""What `torch.distributed.pipelining` holds as torchtitan runs it (`cross_entropy_impl torch`
with p > 1; `paraplan.predict.torch_pipelining`), with A one micro-batch's activation between
stages and L its logits tensor: each stage keeps every micro-batch's output (A, or L on the
last stage) from its forward to the iteration's end and every input gradient (A) from its
backward; M input buffers on a stage that receives (its first block's saved input) and M
gradient buffers on a stage that sends are allocated once; after the last backward the
last stage concatenates its M logits tensors."""

from dataclasses import replace

import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel, StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import run_structure
from paraplan.predict.calibration import load_calibration
from paraplan.predict.loss_ops import loss_transient_bytes, loss_transient_bytes_per_logit
from paraplan.predict.predictor import predict_settings
from paraplan.predict.torch_pipelining import runs_torch_pipelining, torch_pipelining_memory

GPT = TransformerModel("gpt", num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                       vocab_size=50304)  # a multiple of 128: no padding
A100 = load_cluster("dgx-a100")
COMM = ConstantBandwidthModel(100e9, 20e9)
CAL = load_calibration()
B, M = 2, 4
TOKENS = B * 2048
A = 2 * TOKENS * 1024  # bf16 activation between stages (t = 1)
L = 2 * TOKENS * 50304  # bf16 logits of one micro-batch
LOGITS = TOKENS * 50304


def settings(**kw) -> RunSettings:
    base = {"micro_batch_size": B, "global_batch_size": M * B, "pipeline_model_parallel_size": 2,
            "cross_entropy_impl": "torch"}
    return RunSettings(**{**base, **kw})


@pytest.mark.parametrize(("e", "loss_parallel", "per_logit"), [
    (2, False, 8),  # forward: logits + fp32 copy (6); backward, logits dropped or kept apart: two fp32 gradients
    (4, False, 8),  # fp32: .float() copies nothing; the backward's 8
    (2, True, 12),  # loss parallelism: forward logits, copy and shifted (10), backward three fp32 tensors (12)
])
def test_the_loss_transient_is_the_backwards_which_never_includes_the_logits(e, loss_parallel, per_logit):
    assert loss_transient_bytes_per_logit(e, "torch", loss_parallel) == per_logit


def test_what_each_stage_holds():
    mem = torch_pipelining_memory(GPT, settings())
    assert mem is not None
    assert (mem.boundary_bytes, mem.logits_bytes, mem.microbatches) == (pytest.approx(A), pytest.approx(L), M)
    first = (mem.kept_output_bytes(0), mem.kept_input_grad_bytes(0), mem.buffer_bytes(0), mem.received_input_bytes(0))
    assert first == pytest.approx((A, 0, M * A, 0))  # sends: outputs kept, M gradient buffers
    last = (mem.kept_output_bytes(1), mem.kept_input_grad_bytes(1), mem.buffer_bytes(1), mem.received_input_bytes(1))
    assert last == pytest.approx((L, A, M * A, A))  # receives: M input buffers, input gradients kept
    assert mem.iteration_end_bytes(0) == pytest.approx(M * A + M * A)
    assert mem.iteration_end_bytes(1) == pytest.approx(M * A + M * (L + A) + M * L)
    assert loss_transient_bytes(GPT, settings()) == pytest.approx(8 * LOGITS)


def test_a_middle_stage_receives_and_sends():
    """p = 4, v = 2: virtual stage 5 (chunk 1 of rank 1) has both kinds of buffer."""
    mem = torch_pipelining_memory(GPT, settings(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2,
                                                global_batch_size=4 * B))
    assert mem is not None and mem.virtual_stages == 8
    assert mem.buffer_bytes(5) == pytest.approx(2 * 4 * A)
    assert (mem.kept_output_bytes(5), mem.kept_output_bytes(7)) == pytest.approx((A, L))


def test_loss_parallel_ranks_keep_their_shards():
    """t = 4 with sequence parallelism, c = 2: A over 4 x 2, the logits' V / 4 columns of half the tokens."""
    mem = torch_pipelining_memory(GPT, settings(tensor_model_parallel_size=4, context_parallel_size=2,
                                                sequence_parallel=True))
    assert mem is not None
    assert mem.boundary_bytes == pytest.approx(A / 8)
    assert mem.logits_bytes == pytest.approx(2 * (TOKENS / 2) * (50688 / 4))


@pytest.mark.parametrize("kw", [{"cross_entropy_impl": "megatron"}, {"pipeline_model_parallel_size": 1}])
def test_only_torchtitans_pipelines_hold_them(kw):
    s = settings(**kw)
    assert not runs_torch_pipelining(s)
    assert torch_pipelining_memory(GPT, s) is None
    assert all(m.kept_output_bytes_per_chunk is None and m.kept_input_grad_bytes_per_chunk is None
               and m.iteration_end_bytes == 0 for m in run_structure(GPT, s, A100, COMM).memory)


def test_rank_memory_against_megatrons_loss():
    """The same run with Megatron's loss: the working sets gain the buffers (and the last
    stage the torch loss's 8 per logit for Megatron's 2), the last stage's per-micro-batch
    activations lose the received input."""
    torch = run_structure(GPT, settings(), A100, COMM).memory
    mega = run_structure(GPT, settings(cross_entropy_impl="megatron"), A100, COMM).memory
    assert torch[0].working_bytes == pytest.approx(mega[0].working_bytes + M * A)
    assert mega[1].working_bytes == pytest.approx(2 * LOGITS)
    assert torch[1].working_bytes == pytest.approx(8 * LOGITS + M * A)
    assert list(torch[1].activation_bytes_per_chunk) == pytest.approx([mega[1].activation_bytes_per_chunk[0] - A])
    assert list(torch[1].kept_output_bytes_per_chunk) == pytest.approx([L])
    assert list(torch[1].kept_input_grad_bytes_per_chunk) == pytest.approx([A])


def test_1f1b_peaks():
    """1F1B, p = 2, M = 4. The first stage peaks after its last forward with two
    micro-batches in flight and all four outputs kept: Megatron's activations + 4 A. The
    last stage (one in flight) peaks at the last loss: its activations less the received
    input, the four logits tensors and three input gradients (B0-B2)."""
    (torch, _), (mega, _) = predict_settings(GPT, [settings(), settings(cross_entropy_impl="megatron")], A100,
                                             CAL.comm_model(A100), CAL.efficiency)
    t, m = torch.memory_at_peak, mega.memory_at_peak
    assert t.activation_bytes[0] == pytest.approx(m.activation_bytes[0] + M * A)
    assert t.activation_bytes[1] == pytest.approx(m.activation_bytes[1] - A + M * L + (M - 1) * A)
    assert t.working_bytes[1] == pytest.approx(8 * LOGITS + M * A)
    assert torch.peak_memory_bytes[1] == pytest.approx(t.state_bytes[1] + t.activation_bytes[1] + t.working_bytes[1])


def test_the_concatenation_after_the_last_backward_can_be_the_peak():
    """A vocabulary of 2^20 on a small model, M = 8: after the last backward the last
    stage holds its buffers, outputs, input gradients and the concatenation, beside the
    weight state alone, more than at the last loss."""
    model = replace(GPT, vocab_size=2**20, num_layers=2, hidden_size=256, num_attention_heads=4)
    s = settings(micro_batch_size=1, global_batch_size=8)
    a, logits = 2 * 2048 * 256, 2 * 2048 * 2**20
    (result, _), = predict_settings(model, [s], A100, CAL.comm_model(A100), CAL.efficiency)
    at = result.memory_at_peak
    end = 8 * a + 8 * (logits + a) + 8 * logits
    assert at.working_bytes[1] == pytest.approx(end)
    assert at.activation_bytes[1] == at.gradient_accumulator_bytes[1] == 0
    assert result.peak_memory_bytes[1] == pytest.approx(at.state_bytes[1] + end)


def test_torchtitans_loss_under_dualpipe_is_an_error():
    with pytest.raises(StrategyError) as err:
        settings(schedule="dualpipe").check(GPT)
    assert str(err.value) == ("cross_entropy_impl torch with schedule dualpipe: torchtitan's pipelines "
                              "(torch.distributed.pipelining's buffers and kept outputs) are not modelled "
                              "under DualPipe")
