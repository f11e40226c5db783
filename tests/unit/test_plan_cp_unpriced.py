"""The transformer planner searches context parallelism only for the attention it is
priced for: a model with multi-latent attention (DeepSeek-V3) or sliding-window layers
(GPT-OSS, Gemma 3) at a long sequence is planned without CP, where the search used to
pick a CP candidate and then stop on predict's error."""

from dataclasses import replace

import pytest

from paraplan.core.errors import StrategyError
from paraplan.plan.transformer.space import SearchSpace, context_degrees
from paraplan.predict.models import PRESETS


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss-120b"])
def test_long_sequences_of_unpriced_attention_search_no_context_parallelism(name):
    model = replace(PRESETS[name], seq_length=131072)
    assert context_degrees(model, 256, SearchSpace(), flash=True) == [1]


def test_llama_at_the_same_length_still_searches_context_parallelism():
    """1,024-token chunks: 131,072 / (2 x 64); 256 GPUs: every power of two up to 64."""
    model = replace(PRESETS["llama3-70b"], seq_length=131072)
    assert context_degrees(model, 256, SearchSpace(), flash=True) == [1, 2, 4, 8, 16, 32, 64]


def test_naming_context_parallel_sizes_for_sliding_windows_is_one_error():
    model = replace(PRESETS["gpt-oss-120b"], seq_length=131072)
    with pytest.raises(StrategyError) as err:
        context_degrees(model, 256, SearchSpace(context_parallel_sizes=(1, 2, 4)), flash=True)
    assert str(err.value) == (
        "context_parallel_size 4 with sliding-window attention is not modelled (the context-parallel attention "
        "core prices full causal attention with one head width); search context_parallel_size 1 only "
        "(--context-parallel-sizes 1)")
    assert context_degrees(model, 256, SearchSpace(context_parallel_sizes=(1,)), flash=True) == [1]


@pytest.mark.parametrize(("sizes", "message"), [
    ((1, 3), "context_parallel_size 3 does not divide the 64 GPUs; expected sizes that do"),
    ((1, 4, 8), "context_parallel_size 8 does not split seq_length 1000 into 2 x 8 chunks; expected sizes that do"),
])
def test_named_context_parallel_sizes_that_cannot_run_are_one_error(sizes, message):
    """They were dropped without a word; CP 3 alone on 64 GPUs then read 'no parallel
    layout ... (TP must divide the heads ...; DP the global batch)'."""
    with pytest.raises(StrategyError) as err:
        context_degrees(replace(PRESETS["llama3-8b"], seq_length=1000), 64, SearchSpace(context_parallel_sizes=sizes),
                        flash=True)
    assert str(err.value) == message
