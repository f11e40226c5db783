"""torchtitan's loss under `torch.distributed.pipelining` (`paraplan.predict.pipelined_loss`):
the last stage keeps every micro-batch's e-byte logits from its forward to the iteration's
end, the loss's transient is the rest (8 fp32 bytes per logit, 12 under loss parallelism),
and after the last backward `merge_chunks` concatenates the M outputs: 2 M logits tensors
beside the weight state alone."""

from dataclasses import replace

import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel, StrategyError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import run_structure
from paraplan.predict.calibration import load_calibration
from paraplan.predict.loss_ops import loss_transient_bytes, loss_transient_bytes_per_logit
from paraplan.predict.pipelined_loss import pipelined_loss_memory, runs_pipelined_loss
from paraplan.predict.predictor import predict_settings

GPT = TransformerModel("gpt", num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                       vocab_size=50304)  # a multiple of 128: no padding
A100 = load_cluster("dgx-a100")
COMM = ConstantBandwidthModel(100e9, 20e9)
CAL = load_calibration()
B, M = 2, 4
LOGITS = B * 2048 * 50304  # tokens x V on one rank of the last stage (t = 1)


def settings(**kw) -> RunSettings:
    base = {"micro_batch_size": B, "global_batch_size": M * B, "pipeline_model_parallel_size": 2,
            "cross_entropy_impl": "torch"}
    return RunSettings(**{**base, **kw})


@pytest.mark.parametrize(("e", "loss_parallel", "per_logit"), [
    (2, False, 8),  # forward: logits + fp32 copy (6); backward, logits dropped or kept apart: two fp32 gradients
    (4, False, 8),  # fp32: .float() copies nothing; the backward's 8
    (2, True, 12),  # loss parallelism: forward logits, copy and shifted (10), backward three fp32 tensors (12)
])
def test_the_transient_is_the_backwards_which_never_includes_the_logits(e, loss_parallel, per_logit):
    assert loss_transient_bytes_per_logit(e, "torch", loss_parallel) == per_logit


def test_kept_output_and_iteration_end_bytes():
    """bf16: 2 bytes per logit kept per micro-batch; 2 M of them at the iteration's end;
    the loss's transient 8 per logit."""
    s = settings()
    mem = pipelined_loss_memory(GPT, s)
    assert mem is not None
    assert mem.kept_output_bytes == pytest.approx(2 * LOGITS)
    assert mem.iteration_end_bytes == pytest.approx(2 * M * 2 * LOGITS)
    assert loss_transient_bytes(GPT, s) == pytest.approx(8 * LOGITS)


def test_loss_parallel_ranks_keep_their_vocabulary_shard():
    """t = 4, c = 2: each rank keeps V / 4 columns of half the tokens."""
    s = settings(tensor_model_parallel_size=4, context_parallel_size=2, sequence_parallel=True)
    mem = pipelined_loss_memory(GPT, s)
    assert mem is not None
    assert mem.kept_output_bytes == pytest.approx(2 * (B * 2048 / 2) * (50688 / 4))
    assert loss_transient_bytes(GPT, s) == pytest.approx(12 * (B * 2048 / 2) * (50688 / 4))


@pytest.mark.parametrize("kw", [{"cross_entropy_impl": "megatron"}, {"pipeline_model_parallel_size": 1}])
def test_only_torchtitans_loss_in_a_pipeline_keeps_outputs(kw):
    s = settings(**kw)
    assert not runs_pipelined_loss(s)
    assert pipelined_loss_memory(GPT, s) is None
    assert all(m.kept_output_bytes_per_chunk is None and m.iteration_end_bytes == 0
               for m in run_structure(GPT, s, A100, COMM).memory)


def test_only_the_last_stage_keeps_the_logits():
    memory = run_structure(GPT, settings(), A100, COMM).memory
    assert memory[0].kept_output_bytes_per_chunk is None and memory[0].iteration_end_bytes == 0
    assert list(memory[1].kept_output_bytes_per_chunk) == pytest.approx([2 * LOGITS])
    assert memory[1].iteration_end_bytes == pytest.approx(2 * M * 2 * LOGITS)


def test_1f1b_last_stage_peaks_at_the_last_loss_with_every_logits_tensor_kept():
    """1F1B's last stage holds one micro-batch's activations at a time; at the last
    micro-batch's loss it also holds the M logits tensors and the loss's transient:
    torch's peak = Megatron's activations + M x 2 LOGITS, working 8 LOGITS."""
    (torch, _), (mega, _) = predict_settings(GPT, [settings(), settings(cross_entropy_impl="megatron")], A100,
                                             CAL.comm_model(A100), CAL.efficiency)
    t, m = torch.memory_at_peak, mega.memory_at_peak
    assert t.activation_bytes[1] == pytest.approx(m.activation_bytes[1] + M * 2 * LOGITS)
    assert t.working_bytes[1] == pytest.approx(8 * LOGITS)
    assert m.working_bytes[1] == pytest.approx(2 * LOGITS)
    assert torch.peak_memory_bytes[1] == pytest.approx(t.state_bytes[1] + t.activation_bytes[1] + 8 * LOGITS)
    assert torch.peak_memory_bytes[0] == pytest.approx(mega.peak_memory_bytes[0])  # the first stage: unchanged


def test_the_concatenation_after_the_last_backward_can_be_the_peak():
    """A vocabulary of 2^20 on a small model, M = 8: the 16 logits tensors after the last
    backward (beside the weight state alone) outweigh the last loss's moment."""
    model = replace(GPT, vocab_size=2**20, num_layers=2, hidden_size=256, num_attention_heads=4)
    s = settings(micro_batch_size=1, global_batch_size=8)
    logits = 2048 * 2**20
    (result, _), = predict_settings(model, [s], A100, CAL.comm_model(A100), CAL.efficiency)
    at = result.memory_at_peak
    assert at.working_bytes[1] == pytest.approx(2 * 8 * 2 * logits)
    assert at.activation_bytes[1] == at.gradient_accumulator_bytes[1] == 0
    assert result.peak_memory_bytes[1] == pytest.approx(at.state_bytes[1] + 2 * 8 * 2 * logits)


def test_torchtitans_loss_under_dualpipe_is_an_error():
    with pytest.raises(StrategyError) as err:
        settings(schedule="dualpipe").check(GPT)
    assert str(err.value) == ("cross_entropy_impl torch with schedule dualpipe: torchtitan's pipelined loss "
                              "(torch.distributed.pipelining's kept outputs) is not modelled under DualPipe")
