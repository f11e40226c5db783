"""The cross-entropy loss's transient memory and passes per implementation
(`paraplan.predict.loss_ops`): Megatron-Core's in-place `vocab_parallel_cross_entropy`
holds the 16-bit logits beside its fp32 buffer (e bytes per logit); PyTorch's
`F.cross_entropy` on `logits.float()` (torchtitan) holds two fp32 gradients beside
log_softmax's kept output in its backward (8 bytes per logit). The last stage's working
set is the larger of the loss's moment and the backward's, never their sum."""

from dataclasses import replace

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel, InputFileError
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import run_structure
from paraplan.predict.edge_ops import head_work
from paraplan.predict.loss_ops import loss_transient_bytes, loss_transient_bytes_per_logit
from paraplan.predict.ops import layer_work
from paraplan.predict.runtable import read_run_table
from paraplan.predict.work import KernelKind

GPT = TransformerModel("gpt", num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                       vocab_size=50304)  # a multiple of 128: no padding
A100 = load_cluster("dgx-a100")
COMM = ConstantBandwidthModel(100e9, 20e9)
B = 2
LOGITS = B * 2048 * 50304  # tokens x V on one rank (t = 1)


def settings(**kw) -> RunSettings:
    return RunSettings(**{"micro_batch_size": B, "global_batch_size": B, **kw})


@pytest.mark.parametrize(("impl", "dtype", "per_logit"), [
    ("megatron", "bf16", 2),  # the 16-bit logits beside the fp32 buffer; the gradient cast beside it
    ("megatron", "fp8", 2),  # the LM head stays in bf16
    ("megatron", "fp32", 0),  # .float() is the logits themselves, modified in place; no cast
    ("torch", "bf16", 8),  # backward: nll's and log_softmax's fp32 gradients (forward: 2 + 4 = 6)
    ("torch", "fp32", 8),
])
def test_transient_bytes_per_logit(impl, dtype, per_logit):
    e = 4 if dtype == "fp32" else 2
    assert loss_transient_bytes_per_logit(e, impl) == per_logit
    s = settings(dtype=dtype, cross_entropy_impl=impl)
    assert loss_transient_bytes(GPT, s) == pytest.approx(per_logit * LOGITS)


def test_vocabulary_parallel_and_context_parallel_ranks_hold_their_share():
    """t = 4: V / 4 logits per rank; c = 2: half the tokens."""
    split = settings(tensor_model_parallel_size=4, context_parallel_size=2, data_parallel_size=1)
    assert GPT.padded_vocab_size(4) == 50688  # padded to a multiple of 128 x 4
    assert loss_transient_bytes(GPT, split) == pytest.approx(2 * (B * 2048 / 2) * (50688 / 4))


@pytest.mark.parametrize(("impl", "per_logit"), [("megatron", 2), ("torch", 8)])
def test_the_single_stage_working_set_is_the_loss_transient(impl, per_logit):
    """No recomputation, no sharding: the loss is the only transient."""
    st = run_structure(GPT, settings(cross_entropy_impl=impl), A100, COMM)
    assert st.memory[0].working_bytes == pytest.approx(per_logit * LOGITS)


def test_only_the_last_pipeline_stage_runs_the_loss():
    s = settings(pipeline_model_parallel_size=2, global_batch_size=4 * B)
    st = run_structure(GPT, s, A100, COMM)
    assert [m.working_bytes for m in st.memory] == pytest.approx([0.0, 2 * LOGITS])


def test_the_working_set_is_the_larger_moment_not_the_sum():
    """Full recomputation rebuilds a layer after the loss's backward: the working set is
    max(layer, loss), whichever is larger (an 8,192-token vocabulary: one case each way)."""
    model = replace(GPT, vocab_size=8192)
    logits = B * 2048 * 8192
    full = settings(recompute_granularity="full")
    layer = layer_work(model, replace(full, recompute_granularity="none")).activation_bytes
    assert 2 * logits < layer < 8 * logits
    for impl, per_logit in (("megatron", 2), ("torch", 8)):
        st = run_structure(model, replace(full, cross_entropy_impl=impl), A100, COMM)
        assert st.memory[0].working_bytes == pytest.approx(max(layer, per_logit * logits))


def test_zero3_loss_moment_keeps_the_gathered_weights_not_the_unsharded_gradients():
    """ZeRO-3, one micro-batch: the backward's moment is the root unit and two layers
    gathered, (r + 2 u) w, plus the largest unit's gradient max(u, r) g; the loss's moment
    is its transient beside the gathered weights only."""
    s = settings(data_parallel_size=8, global_batch_size=8 * B, zero_stage=3, cross_entropy_impl="torch")
    st = run_structure(GPT, s, A100, COMM)
    root, unit = GPT.embedding_params() + GPT.output_params(), GPT.layer_params
    gathered = (root + 2 * unit) * 2
    backward = gathered + max(root, unit) * 4
    assert 8 * LOGITS + gathered > backward
    assert st.memory[0].working_bytes == pytest.approx(8 * LOGITS + gathered)


def _memory_bytes(passwork) -> float:
    k = passwork.kernels
    return float(k.bytes[k.kind == KernelKind.MEMORY].sum())


def test_loss_passes_per_implementation():
    """Per logit, bf16 (e = 2). Megatron: cast e + 4, max 4, subtract 8, exp 8, sum 4,
    normalise 8 forward; multiply by grad_output 8 and cast 4 + e backward, plus its small
    kernels over the tokens (187 and 85 bytes per token, test_megatron_loss_passes.py).
    PyTorch: cast e + 4, log_softmax 16 (three reads, one write) forward; nll's zero fill
    4, log_softmax backward 16, cast 4 + e backward. The norms' passes are the same in both."""
    mega = head_work(GPT, settings())
    torch = head_work(GPT, settings(cross_entropy_impl="torch"))
    tokens = B * 2048
    assert _memory_bytes(mega.forward) - _memory_bytes(torch.forward) == pytest.approx(
        (38 - 22) * LOGITS + 187 * tokens)
    assert _memory_bytes(torch.backward) - _memory_bytes(mega.backward) == pytest.approx(
        (26 - 14) * LOGITS - 85 * tokens)
    assert mega.activation_bytes == torch.activation_bytes  # both keep one fp32 value per logit


def test_torchtitan_loss_parallel_transient_and_passes():
    """t = 4 (torchtitan's loss parallelism, DTensor's `_log_softmax` and
    `_nll_loss_and_log_softmax_backward`): forward e + 4 + 4 beyond the kept result
    (logits, copy, shifted and exp(shifted)), backward 12 (zeros with the one-hot,
    exp(x), their sum, then the product); passes per logit forward e + 4 + 4 + 8 + 8 +
    4 + 8 = 36 + e (Megatron's too, which adds 187 bytes per token), backward 4 + 8 + 12 +
    8 + 4 + e = 36 + e (Megatron's 12 + e and 85 per token)."""
    assert loss_transient_bytes_per_logit(2, "torch", loss_parallel=True) == 12
    assert loss_transient_bytes_per_logit(4, "torch", loss_parallel=True) == 12
    t4 = settings(tensor_model_parallel_size=4, sequence_parallel=True, cross_entropy_impl="torch")
    t4.check(GPT)
    logits = B * 2048 * GPT.padded_vocab_size(4) / 4  # every token, V / t columns
    assert loss_transient_bytes(GPT, t4) == pytest.approx(12 * logits)
    plain = head_work(GPT, replace(t4, cross_entropy_impl="megatron"))
    parallel = head_work(GPT, t4)
    tokens = B * 2048
    assert _memory_bytes(parallel.forward) - _memory_bytes(plain.forward) == pytest.approx(-187 * tokens)
    assert _memory_bytes(parallel.backward) - _memory_bytes(plain.backward) == pytest.approx(
        (38 - 14) * logits - 85 * tokens)


HEADER = ("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,tensor_model_parallel_size,"
          "pipeline_model_parallel_size,data_parallel_size,global_batch_size,cross_entropy_impl")


def test_run_table_column(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + "\nx,4,1024,16,2048,50304,1,1,2,8,torch\ny,4,1024,16,2048,50304,1,1,2,8,\n")
    rows = read_run_table(path)[1]
    assert [r.settings.cross_entropy_impl for r in rows] == ["torch", "megatron"]


def test_run_table_bad_value_names_the_column(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + "\nx,4,1024,16,2048,50304,1,1,2,8,liger\n")
    with pytest.raises(InputFileError) as err:
        read_run_table(path)
    assert "runs.csv:2: column 'cross_entropy_impl': expected one of megatron, torch, got 'liger'" in str(err.value)


def test_peak_adds_the_loss_transient_to_the_held_activations():
    """One stage, one micro-batch: peak = weight state + the micro-batch's activations +
    the loss's transient (the engine's `iteration_memory.memory_peaks`)."""
    from paraplan.predict.build import kernel_times_by_pass, price
    from paraplan.predict.device_model import DeviceEfficiency
    from paraplan.sim.execution import run_iteration

    eff = DeviceEfficiency()
    peaks = {}
    for impl in ("megatron", "torch"):
        st = run_structure(GPT, settings(cross_entropy_impl=impl), A100, COMM)
        model = price(st, kernel_times_by_pass([st], eff)[0], eff)
        mem = st.memory[0]
        peaks[impl] = float(run_iteration(model, timeline=False).peak_memory_bytes[0])
        assert peaks[impl] == pytest.approx(mem.weight_state_bytes + float(np.sum(mem.activation_bytes_per_chunk))
                                            + mem.working_bytes)
    assert peaks["torch"] - peaks["megatron"] == pytest.approx(6 * LOGITS)
