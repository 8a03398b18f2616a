"""The scheduler's policy simulation (tools/scheduler_sim.py), which chose `gathered_enough`."""

from __future__ import annotations

import pytest

from tools.scheduler_sim import Costs, simulate


def test_a_lone_question_takes_its_preparation_and_its_steps():
    costs = Costs()
    alone = costs.preparation_ms(1) + 16 * costs.step(1)
    got = simulate(costs, rate_per_s=0.05, gather=True, questions=300, warmup=0)
    assert got.p50_ms == pytest.approx(alone) and got.p95_ms == pytest.approx(alone)
    assert got.mean_prepared_together == 1.0


@pytest.mark.parametrize("rate", [4.0, 21.15])
def test_gathering_newcomers_shortens_the_tail_at_light_and_heavy_load(rate):
    """At the H100 costs: preparing each arrival at once costs more preparations than the GPU has
    time for at 21 q/s (the queue grows), and gathering them shortens the p95 at both loads."""
    costs = Costs()
    at_once = simulate(costs, rate, gather=False, questions=1500)
    gathered = simulate(costs, rate, gather=True, questions=1500)
    assert gathered.p95_ms < at_once.p95_ms
    assert gathered.mean_prepared_together > at_once.mean_prepared_together
