"""The builder parts of the engine's input (`paraplan.sim.builder`, `paraplan.core.layer_split`)."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.core.layer_split import even_layer_counts, even_layer_ranges, layer_ranges
from paraplan.sim.builder.grad_buckets import equal_buckets, filled_buckets
from paraplan.sim.builder.placement import strided_group_nodes
from paraplan.sim.builder.rank_memory import ParamState, chunks_by_rank, rank_memory


def test_even_split_gives_the_first_parts_one_layer_more():
    assert even_layer_counts(10, 4) == [3, 3, 2, 2]
    assert even_layer_counts(96, 8) == [12] * 8
    assert even_layer_ranges(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert layer_ranges([2, 0, 5]) == [(0, 2), (2, 2), (2, 7)]


def test_strided_groups_count_the_nodes_their_ranks_sit_on():
    assert strided_group_nodes(8, 1, 8) == 1  # a tensor-parallel group inside one node
    assert strided_group_nodes(4, 8, 8) == 4  # data-parallel over t = 8: one rank per node
    assert strided_group_nodes(8, 2, 8) == 2  # 0, 2, ..., 14
    assert strided_group_nodes(3, 3, 8) == 1  # 0, 3, 6: one node, though 3 x 3 > 8


def test_filled_buckets_close_at_the_cap_from_the_last_layer_down():
    bwd_s = np.array([1.0, 1.0, 1.0, 1.0])
    two = filled_buckets(np.full(4, 10.0), bwd_s, 15.0)
    assert two.size_bytes.tolist() == [20.0, 20.0]
    assert two.ready_fraction.tolist() == [0.5, 1.0]  # when layers 2 and 0 finish their backward
    assert two.lowest_layer.tolist() == [2, 0]
    rest = filled_buckets(np.full(4, 10.0), bwd_s, 25.0)
    assert rest.size_bytes.tolist() == [30.0, 10.0]
    assert rest.ready_fraction.tolist() == [0.75, 1.0]
    assert rest.lowest_layer.tolist() == [1, 0]
    untimed = filled_buckets(np.full(2, 10.0), np.zeros(2), 10.0)
    assert untimed.ready_fraction.tolist() == [1.0, 1.0]


def test_equal_buckets_are_megatron_ddp_buckets():
    buckets = equal_buckets(100e6, 40e6)
    assert (buckets.count, buckets.each) == (3, pytest.approx(100e6 / 3))
    assert buckets.ready_fractions == [1 / 3, 2 / 3, 1.0]
    assert equal_buckets(0.0, 40e6).count == 1


def test_rank_memory_is_megatron_bytes_per_parameter():
    # 1e9 parameters, bf16 with a distributed optimizer over 8 ranks: 2 + 4 + 12 / 8 bytes each
    dense = ParamState(1e9, 2, 4, 12, optimizer_shards=8)
    experts = ParamState(1e8, 2, 4, 12, grad_shards=2, optimizer_shards=2)
    mem = rank_memory([dense, experts], np.array([5.0, 7.0]), working_bytes=3.0)
    assert (mem.weights_bytes, mem.gradients_bytes, mem.optimizer_bytes) == (2.2e9, 4.2e9, 2.1e9)
    assert mem.weight_state_bytes == pytest.approx(8.5e9)
    assert mem.working_bytes == 3.0


def test_chunks_by_rank_reads_virtual_stages_chunk_major():
    # virtual stage c x p + r is chunk c of rank r
    assert chunks_by_rank(np.arange(6.0), 2).tolist() == [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]


def test_embedding_and_head_parameters_follow_megatron():
    from paraplan.predict.models import PRESETS
    from paraplan.sim.builder.transformer_params import position_params, rank_head_params, rank_vocab_params

    gpt3 = PRESETS["gpt3-175b"]  # vocabulary 50,257 padded to 51,200 (a multiple of 128 x 8), tied output
    assert rank_vocab_params(gpt3, 8) == 51_200 * 12_288 / 8
    assert position_params(gpt3) == 2048 * 12_288
    # pipelined: the last stage holds its own copy of the output layer beside the final LayerNorm
    assert rank_head_params(gpt3, 8, 16, rank_vocab_params(gpt3, 8), 0) == 24_576 + 51_200 * 12_288 / 8
    assert rank_head_params(gpt3, 8, 1, rank_vocab_params(gpt3, 8), 0) == 24_576  # tied on one stage
    llama = PRESETS["llama3-70b"]  # rotary positions, untied output
    assert position_params(llama) == 0
    t, p = np.array([4.0, 8.0]), np.array([1.0, 1.0])
    vocab = rank_vocab_params(llama, t)
    assert vocab.tolist() == [128_512 * 8192 / 4, 129_024 * 8192 / 8]  # multiples of 128 x t
    assert rank_head_params(llama, t, p, vocab, 0).tolist() == (8192 + vocab).tolist()
