"""Size, count and bandwidth conventions of the bench stage (nccl-tests), and its CSV."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.comm.a2av import DIMS, GLOBAL_BATCHES, A2AVSample, draw_samples
from paraplan.comm.results import (
    A2AV_COLUMNS,
    COLUMNS,
    EXTRA_COLUMNS,
    bench_frame,
    summarize_times_us,
    table_row,
)
from paraplan.comm.sizes import ELEMENT_BYTES, element_bytes, element_count, message_sizes
from paraplan.core import ConfigError, busbw_factor


def test_sweep_is_nccl_tests_loop_min_times_factor_while_within_max():
    assert message_sizes(8, 64, 2, 2, 4) == [8, 16, 32, 64]
    # max off the grid is not added (nccl-tests: for size = min; size <= max; size *= f)
    assert message_sizes(8, 100, 2, 2, 4) == [8, 16, 32, 64]
    assert message_sizes(1024, 1048576, 4, 2, 4) == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert len(message_sizes(8, 16 * 2**20, 2, 2, 4)) == 22


def test_sizes_round_up_to_element_size_times_world_size_and_drop_duplicates():
    # 4 ranks of float32: every size a multiple of 16; 8 and 16 both become 16
    assert message_sizes(8, 64, 2, 4, 4) == [16, 32, 64]
    # 3 ranks: multiples of 12; rounding may pass max_bytes (64 -> 72)
    assert message_sizes(8, 64, 2, 3, 4) == [12, 24, 36, 72]
    # float64 on 8 ranks: quantum 64
    assert message_sizes(1, 256, 2, 8, 8) == [64, 128, 256]
    for dtype, elem in ELEMENT_BYTES.items():
        for world in (1, 2, 3, 4, 6, 8):
            sizes = message_sizes(1, 2**20, 2, world, elem)
            assert all(s % (elem * world) == 0 for s in sizes), (dtype, world)
            assert sizes == sorted(set(sizes))


@pytest.mark.parametrize(
    ("args", "key"),
    [((0, 64, 2), "min_bytes"), ((64, 8, 2), "max_bytes"), ((8, 64, 1), "factor")],
)
def test_bad_sweep_settings_name_the_option(args, key):
    with pytest.raises(ConfigError, match=key):
        message_sizes(*args, 2, 4)


def test_unknown_dtype_names_the_option():
    with pytest.raises(ConfigError, match=r"dtype.*complex64"):
        element_bytes("complex64")


def test_count_is_the_collective_calls_element_count():
    # one 1 KiB float32 buffer on 8 ranks
    assert element_count("all_reduce", 1024, 8, 4) == 256
    assert element_count("broadcast", 1024, 8, 4) == 256
    assert element_count("reduce", 1024, 8, 4) == 256
    # gathered output / scattered input / per-rank total: one rank's share
    assert element_count("all_gather", 1024, 8, 4) == 32
    assert element_count("reduce_scatter", 1024, 8, 4) == 32
    assert element_count("all_to_all", 1024, 8, 4) == 32
    # rccl-tests alltoall_perf -g 8: "128  4  float" (data/nccl-tests/08_...)
    assert element_count("all_to_all", 128, 8, 4) == 4
    # PARAM, 2 ranks: all_gather "1024  128" and all_reduce "1024  256"
    assert element_count("all_gather", 1024, 2, 4) == 128
    assert element_count("all_reduce", 1024, 2, 4) == 256


@pytest.mark.parametrize(
    ("collective", "n", "factor"),
    [
        ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 8, 1.75),
        ("all_gather", 2, 0.5), ("all_gather", 8, 0.875),
        ("reduce_scatter", 4, 0.75), ("all_to_all", 8, 0.875), ("all_to_allv", 4, 0.75),
        ("broadcast", 8, 1.0), ("reduce", 8, 1.0),
    ],
)
def test_busbw_is_algbw_times_the_nccl_tests_factor(collective, n, factor):
    assert busbw_factor(collective, n) == pytest.approx(factor)
    frame = bench_frame(collective, "gloo", n, 1, [10**6], [1], "float32", [1000.0])
    # 1e6 B in 1 ms = 1 GB/s algorithm bandwidth
    assert frame["algbw_GBps"].iloc[0] == pytest.approx(1.0)
    assert frame["busbw_GBps"].iloc[0] == pytest.approx(factor)


def test_bandwidths_reproduce_a_published_rccl_tests_row():
    # 08_mi355x_vultr_1x8_rccl_alltoall.txt: 134217728 B, 364.47 us -> 368.25 / 322.22 GB/s
    frame = bench_frame("all_to_all", "rccl", 8, 1, [134217728], [4194304], "float", [364.47])
    assert frame["algbw_GBps"].iloc[0] == pytest.approx(368.25, abs=0.005)
    assert frame["busbw_GBps"].iloc[0] == pytest.approx(322.22, abs=0.005)


def test_frame_has_the_design_columns_then_extras_and_drops_zero_sizes():
    frame = bench_frame(
        "all_reduce", "gloo", 2, 1, [0, 8, 16], [0, 2, 4], "float32", [0.0, 50.0, 60.0],
        time_p10_us=[0.0, 40.0, 55.0], time_p90_us=[0.0, 70.0, 80.0], in_place=True, host="h",
    )
    assert tuple(frame.columns) == COLUMNS + EXTRA_COLUMNS
    assert frame["size_bytes"].tolist() == [8, 16]
    assert frame["in_place"].tolist() == [True, True]
    assert frame["host"].tolist() == ["h", "h"]
    single = bench_frame("all_gather", "nccl", 8, 1, [64], [2], "float32", [9.5])
    assert np.isnan(single["time_p10_us"].iloc[0])  # imported logs have one time only
    extra = bench_frame("all_to_allv", "gloo", 2, 1, [64], [16], "float32", [9.5],
                        extra={"sample": [0], "global_batch": [256], "tables_per_rank": ["3-17"], "dim": [32]})
    assert tuple(extra.columns) == COLUMNS + EXTRA_COLUMNS + A2AV_COLUMNS


def test_non_positive_time_is_rejected():
    with pytest.raises(ValueError, match=r"^all_reduce: times must be positive and finite$"):
        bench_frame("all_reduce", "gloo", 2, 1, [8], [2], "float32", [0.0])


def test_median_and_percentiles_of_iteration_times():
    median, p10, p90 = summarize_times_us([i * 1e-6 for i in range(1, 11)])
    assert (median, p10, p90) == pytest.approx((5.5, 1.9, 9.1))


def test_table_row_reads_like_nccl_tests():
    frame = bench_frame("all_reduce", "gloo", 2, 1, [1048576], [262144], "float32", [1000.0],
                        time_p10_us=[900.0], time_p90_us=[1100.0])
    fields = table_row(frame.iloc[0]).split()
    assert fields == ["1048576", "262144", "float32", "sum", "-1", "1000.00", "900.00", "1100.00",
                      "1.049", "1.049"]


def test_a2av_exchange_shapes_follow_dlrm():
    sample = A2AVSample(0, global_batch=1024, tables_per_rank=(3, 17), dim=64)
    # each rank holds B/n = 512 samples; rank 0 sends 512 x 3 x 64 floats to every peer
    assert sample.input_split(0) == [512 * 3 * 64] * 2
    assert sample.input_split(1) == [512 * 17 * 64] * 2
    assert sample.output_split(0) == [512 * 3 * 64, 512 * 17 * 64]
    # size_bytes: the largest rank's input buffer, B/n x n x max T x D x 4
    assert sample.size_bytes == 512 * 2 * 17 * 64 * 4
    assert sample.tables_label == "3-17"


def test_a2av_samples_are_seeded_and_in_range():
    first = draw_samples(40, 4, seed=7)
    assert first == draw_samples(40, 4, seed=7)
    assert first != draw_samples(40, 4, seed=8)
    assert [s.sample for s in first] == list(range(40))
    for s in first:
        assert s.global_batch in GLOBAL_BATCHES and s.dim in DIMS
        assert len(s.tables_per_rank) == 4 and all(1 <= t <= 20 for t in s.tables_per_rank)
    # the draw covers the ranges, not one corner of them
    assert len({s.global_batch for s in first}) >= 4 and len({s.dim for s in first}) >= 3
