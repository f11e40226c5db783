"""torchtitan's DTensor output layer (`cross_entropy_impl torch`, t > 1): ColwiseParallel
all-gathers the final norm's sequence shard to `Replicate()` before the matmul, which
saves the gathered input for its weight gradient: e x (tokens - tokens / t) x h held per
micro-batch beyond Megatron's ColumnParallelLinear, which saves the shard and gathers it
again in the backward (`paraplan.predict.loss_ops.gathered_head_input_bytes`)."""

import pytest

from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.edge_ops import head_work
from paraplan.predict.loss_ops import gathered_head_input_bytes

GPT = TransformerModel("gpt", num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                       vocab_size=50304)
B = 2
TOKENS = B * 2048


def settings(**kw) -> RunSettings:
    base = {"micro_batch_size": B, "global_batch_size": B, "tensor_model_parallel_size": 4,
            "sequence_parallel": True}
    return RunSettings(**{**base, **kw})


def test_the_dtensor_head_keeps_the_gathered_input():
    """t = 4, bf16: 2 x (4,096 - 1,024) x 1,024 bytes more than Megatron's head."""
    torch, mega = settings(cross_entropy_impl="torch"), settings(cross_entropy_impl="megatron")
    extra = 2 * (TOKENS - TOKENS / 4) * 1024
    assert gathered_head_input_bytes(GPT, torch) == pytest.approx(extra)
    assert head_work(GPT, torch).activation_bytes - head_work(GPT, mega).activation_bytes == pytest.approx(extra)


@pytest.mark.parametrize("kw", [
    {"cross_entropy_impl": "megatron"},  # Megatron saves the shard
    {"cross_entropy_impl": "torch", "sequence_parallel": False},  # the input is whole already
    {"cross_entropy_impl": "torch", "tensor_model_parallel_size": 1, "sequence_parallel": False},
])
def test_nothing_more_without_a_gather(kw):
    assert gathered_head_input_bytes(GPT, settings(**kw)) == 0
