"""Megatron-Core's DDP buffers as core_r0.8.0 lays them out (`paraplan.predict.megatron_ddp`):
bucket size max(40M, 1M x DP), the embedding's gradient one bucket at the end of the
first rank's backward, one bucket per chunk on later pipeline ranks and later chunks,
the first all-gather of `overlap_param_gather` waited for, the whole gradient buffer
zeroed every iteration."""

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel
from paraplan.core.comm import Group
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import after_sync_s, kernel_times_by_pass, price, run_structure
from paraplan.predict.device_model import DeviceEfficiency, memory_time_s
from paraplan.predict.megatron_ddp import (
    chunk_buckets,
    first_gather_params,
    megatron_bucket_params,
    unsharded_zeroing_bytes,
    uses_megatron_buckets,
)

# the Megatron-Core H100 table's 1.7B model (README, commit 937571cf)
GPT = TransformerModel("gpt", num_layers=24, hidden_size=2048, num_attention_heads=16, seq_length=4096,
                       vocab_size=131072, untie_embeddings_and_output_weights=True)
H100 = load_cluster("dgx-h100")
COMM = ConstantBandwidthModel(300e9, 40e9)
EFF = DeviceEfficiency()


def mcore(**kw) -> RunSettings:
    base = dict(data_parallel_size=48, micro_batch_size=4, global_batch_size=192, use_distributed_optimizer=True,
                overlap_grad_reduce=True, overlap_param_gather=True)
    return RunSettings(**{**base, **kw})


def test_bucket_size_is_megatrons_default_for_the_data_parallel_group():
    assert megatron_bucket_params(mcore(data_parallel_size=8)) == 40_000_000
    assert megatron_bucket_params(mcore()) == 48_000_000
    assert megatron_bucket_params(mcore(data_parallel_size=8, context_parallel_size=16)) == 128_000_000


def test_only_megatrons_own_overlapping_ddp_uses_the_layout():
    assert uses_megatron_buckets(mcore())
    assert not uses_megatron_buckets(mcore(overlap_grad_reduce=False, overlap_param_gather=False))
    assert not uses_megatron_buckets(RunSettings(data_parallel_size=8, DDP_impl="torch", overlap_grad_reduce=True))
    assert not uses_megatron_buckets(RunSettings(data_parallel_size=8, zero_stage=3, overlap_grad_reduce=True))


def test_the_first_chunk_ends_with_the_embeddings_bucket_others_are_one_bucket():
    layout = chunk_buckets(1_000e6, 250e6, True, 48e6)
    assert len(layout.params) == 16 + 1  # ceil(750 / 48) equal buckets, then the embedding's
    assert layout.params[:16] == pytest.approx([750e6 / 16] * 16)
    assert layout.params[-1] == 250e6 and layout.ready_fraction[-1] == 1.0
    assert layout.ready_fraction[:16] == pytest.approx([(k + 1) / 16 for k in range(16)])
    assert chunk_buckets(1_000e6, 250e6, False, 48e6) == chunk_buckets(1_000e6, 0.0, False, 48e6)
    assert chunk_buckets(1_000e6, 0.0, False, 48e6).params == (1_000e6,)
    assert chunk_buckets(1_000e6, 0.0, False, 48e6).ready_fraction == (1.0,)
    assert first_gather_params(1_000e6, 250e6, 48e6) == 250e6


def test_the_17b_rows_reduction_ends_with_its_embeddings_reduce_scatter():
    st = run_structure(GPT, mcore(), H100, COMM)
    (sync,) = st.grad_sync
    embedding = GPT.vocab_size * GPT.hidden_size + GPT.seq_length * GPT.hidden_size  # words + learned positions
    rest = st.rank_params[0] - embedding
    count = int(np.ceil(rest / 48e6))
    assert sync.bucket_s.shape == (count + 1,)
    group = Group(48, 6)  # TP 1: 8 DP ranks per node
    assert sync.bucket_s[-1] == pytest.approx(COMM.time_s("reduce_scatter", embedding * 4, group))
    assert sync.bucket_s[0] == pytest.approx(COMM.time_s("reduce_scatter", rest / count * 4, group))
    assert sync.ready_fraction[-1] == 1.0


def test_later_pipeline_ranks_and_chunks_reduce_each_chunk_as_one_bucket():
    s = mcore(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, data_parallel_size=24,
              schedule="interleaved_1f1b", micro_batch_size=1)
    st = run_structure(GPT, s, H100, COMM)
    first, last = st.grad_sync
    assert list(last.chunk) == [1, 0] and list(last.ready_fraction) == [1.0, 1.0]
    assert list(first.chunk[:1]) == [1] and first.ready_fraction[0] == 1.0  # chunk 1: one bucket
    assert (first.chunk == 0).sum() > 2  # chunk 0 of rank 0: the only one cut into buckets


def test_the_first_all_gather_is_paid_on_the_first_rank_only():
    on, off = (run_structure(GPT, mcore(overlap_param_gather=flag), H100, COMM) for flag in (True, False))
    embedding = GPT.vocab_size * GPT.hidden_size + GPT.seq_length * GPT.hidden_size
    assert on.after_sync_comm_s[0] == pytest.approx(COMM.time_s("all_gather", embedding * 2, Group(48, 6)))
    assert off.after_sync_comm_s[0] == pytest.approx(COMM.time_s("all_gather", off.rank_params[0] * 2, Group(48, 6)))
    s = mcore(pipeline_model_parallel_size=2, data_parallel_size=24, micro_batch_size=1)
    two = run_structure(GPT, s, H100, COMM)
    assert two.after_sync_comm_s[1] == 0.0 and two.after_sync_comm_s[0] > 0.0


def test_the_whole_gradient_buffer_is_zeroed_not_only_the_optimizer_shard():
    st = run_structure(GPT, mcore(), H100, COMM)
    n = float(st.rank_params[0])
    assert unsharded_zeroing_bytes(mcore(), st.rank_params, st.rank_params / 48, 4)[0] == pytest.approx(n * 47 / 48 * 4)
    plain = mcore(use_distributed_optimizer=False, overlap_param_gather=False)
    assert unsharded_zeroing_bytes(plain, st.rank_params, st.rank_params, 4)[0] == 0.0
    without = run_structure(GPT, mcore(use_distributed_optimizer=False, overlap_param_gather=False), H100, COMM)
    step = after_sync_s(st, EFF)[0] - st.after_sync_comm_s[0]
    shard_step = memory_time_s(n / 48 * st.precision.optimizer_step_bytes, st.speed, EFF, 4)
    assert step == pytest.approx(shard_step + memory_time_s(n * 47 / 48 * 4, st.speed, EFF, 1))
    assert price(without, kernel_times_by_pass([without], EFF)[0], EFF).after_sync_s[0] == pytest.approx(
        memory_time_s(n * without.precision.optimizer_step_bytes, without.speed, EFF, 4))
