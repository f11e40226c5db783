"""Where the interleaved schedule's weight all-gathers run (`paraplan.sim.param_gather_run`):
chunks 0 and 1 launched with the iteration, chunk c >= 2 when the rank starts the forward
j - r (j: chunk c - 1's first virtual micro-batch), each waited for by its chunk's first
forward (Megatron-Core's `forward_backward_pipelining_with_interleaving`, `align_param_gather`)."""

import numpy as np
import pytest

from paraplan.sim.engine import PipelineCosts, execute
from paraplan.sim.param_gather_run import ChunkGathers, gather_added_s, place_gathers, run_gather_added_s
from paraplan.sim.schedules import cached_orders

# one rank's forwards, 1 s each, two micro-batches per chunk, waiting 3 s before chunks 1 and 2
FWD_START = np.array([0.0, 1.0, 5.0, 6.0, 10.0, 11.0])
FWD_CHUNK = np.array([0, 0, 1, 1, 2, 2])
SHARE = 0.25


def added(chunk_s, rank=0):
    return gather_added_s(np.array(chunk_s), rank, FWD_START, FWD_CHUNK, FWD_START, FWD_START + 1.0, SHARE)


def test_first_chunk_waited_for_the_rest_beside_the_forwards():
    # chunk 0's 0.5 s before the first forward; chunk 1's 2 s beside chunk 0's two forwards;
    # chunk 2's 2 s launched at chunk 1's first forward, beside its two: 0.5 + 0.25 x (2 + 2)
    assert added([0.5, 2.0, 2.0]) == pytest.approx(0.5 + SHARE * 4.0)


def test_a_gather_beside_an_idle_compute_stream_slows_nothing():
    # chunk 1's 4 s: 2 s beside chunk 0's forwards, the other 2 s while the rank waits for
    # micro-batch 0 to come round: only the 2 s beside compute cost the share
    assert added([0.5, 4.0, 2.0]) == pytest.approx(0.5 + SHARE * (2.0 + 2.0))


def test_a_gather_longer_than_its_window_delays_the_chunk():
    # chunk 1's 6 s end 1 s past its chunk's first forward (5 s + the 0.5 s chunk 0 added):
    # 0.5 + 1 waited; chunk 2 then launches 1.5 s later and still fits its window
    assert added([0.5, 6.0, 2.0]) == pytest.approx(0.5 + 1.0 + SHARE * (2.0 + 2.0))


def test_a_later_rank_launches_chunk_c_a_forward_per_rank_earlier():
    # rank 1: chunk 2's gather launched at its forward j - 1 = 1 (1 s, 1.5 s after chunk 0's
    # wait), queued behind chunk 1's (0.5-2.5 s), so it runs 2.5-4.5 s, 2-4 s of the run's
    # time: all of it in the wait before chunk 1, beside no forward
    assert added([0.5, 2.0, 2.0], rank=1) == pytest.approx(0.5 + SHARE * (2.0 + 0.0))


def test_on_the_engine_run_p2_v2():
    # p = 2, v = 2, M = 2, F = 1, B = 2, free transfers: rank 0 runs F(c0, 0..1) at 0-2 s and
    # F(c1, 0..1) at 2-4 s; rank 1 its first forward at 1 s. Gathers 0.5 s (chunk 0) and 1 s
    # (chunk 1): rank 0 waits 0.5 s, then chunk 1's 1 s beside F(c0, 0); rank 1's chunk 0
    # ends before its first forward and chunk 1 (0.5-1.5 s) overlaps it 0.5 s
    run = execute(cached_orders("interleaved_1f1b", 2, 2, 1, 2), PipelineCosts.uniform(4, 1.0, 2.0), 2)
    gathers = ChunkGathers(np.array([[0.5, 1.0], [0.5, 1.0]]), SHARE)
    assert run_gather_added_s(gathers, run, 2) == pytest.approx([0.5 + SHARE * 1.0, SHARE * 0.5])



def test_placed_intervals_in_the_runs_time():
    # the first case's gathers as the timeline shows them: chunk 0 before the first forward
    # (which the rank then starts 0.5 s late), chunk 1 beside chunk 0's forwards, chunk 2
    # from chunk 1's first forward
    placed = place_gathers(np.array([0.5, 2.0, 2.0]), 0, FWD_START, FWD_CHUNK, FWD_START, FWD_START + 1.0, SHARE)
    assert placed.start_s == pytest.approx([0.0, 0.0, 5.0])
    assert placed.end_s == pytest.approx([0.5, 2.0, 7.0])
