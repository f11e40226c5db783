"""The 1F1B/GPipe array recurrence gives the event loop's start times exactly."""

import numpy as np
import pytest

from paraplan.sim.engine import PipelineCosts, execute, execute_flushed
from paraplan.sim.schedules import cached_orders


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_recurrence_equals_the_event_loop_on_random_pipelines(schedule):
    rng = np.random.default_rng(7)
    for _ in range(60):
        p, m = int(rng.integers(1, 10)), int(rng.integers(1, 25))
        costs = PipelineCosts(rng.uniform(0.1, 2, p), rng.uniform(0.1, 3, p), np.zeros(p),
                              rng.uniform(0, 0.5, p - 1), rng.uniform(0, 0.5, p - 1))
        loop = execute(cached_orders(schedule, p, m, 1, 1), costs, m)
        rec = execute_flushed(p, m, costs, gpipe=schedule == "gpipe")
        assert np.array_equal(loop.kind, rec.kind) and np.array_equal(loop.microbatch, rec.microbatch)
        np.testing.assert_allclose(rec.start_s, loop.start_s, rtol=0, atol=1e-9)


def test_uniform_1f1b_closed_form():
    """(M + p - 1)(t_f + t_b) with free transfers."""
    p, m = 8, 32
    run = execute_flushed(p, m, PipelineCosts.uniform(p, 1.0, 2.0))
    assert run.makespan_s == pytest.approx((m + p - 1) * 3.0)
