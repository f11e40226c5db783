"""The re-timing's lower bound (`retime.costs_lower_bound_s`): rank r's compute, counted
from when micro-batch 0's forward reaches it, never exceeds the engine's makespan."""

import numpy as np
import pytest

from paraplan.plan.transformer.retime import costs_lower_bound_s
from paraplan.sim.engine import PipelineCosts, execute
from paraplan.sim.schedules import cached_orders


def test_uniform_1f1b_bound_is_the_fill_plus_the_last_rank_busy_time():
    # p = 4, M = 8, F = 1, B = 2: the last rank starts after 3 forwards, then runs 8 x 3
    costs = PipelineCosts.uniform(4, 1.0, 2.0)
    assert costs_lower_bound_s(costs, "1f1b", 4, 1, 8) == pytest.approx(3 * 1.0 + 8 * 3.0)
    # the engine's 1F1B: (M + p - 1)(F + B) = 33 s, above the bound's 27 s
    run = execute(cached_orders("1f1b", 4, 8), costs, 8)
    assert run.makespan_s == pytest.approx(33.0)


def test_transfers_delay_the_fill():
    costs = PipelineCosts.uniform(4, 1.0, 2.0, send_s=0.5)
    assert costs_lower_bound_s(costs, "1f1b", 4, 1, 8) == pytest.approx(3 * 1.5 + 8 * 3.0)


@pytest.mark.parametrize(("schedule", "p", "v", "m"), [("1f1b", 4, 1, 8), ("gpipe", 3, 1, 5),
                                                       ("interleaved_1f1b", 4, 2, 8), ("zb_h1", 4, 1, 8)])
def test_bound_below_the_engine_makespan_for_uneven_stages(schedule, p, v, m):
    rng = np.random.default_rng(7)
    for _ in range(20):
        nv = p * v
        costs = PipelineCosts(rng.random(nv), rng.random(nv) * 2, rng.random(nv) * 0.5,
                              rng.random(nv - 1) * 0.3, rng.random(nv - 1) * 0.3)
        run = execute(cached_orders(schedule, p, m, 1, v), costs, m)
        assert costs_lower_bound_s(costs, schedule, p, v, m) <= run.makespan_s * (1 + 1e-12)
