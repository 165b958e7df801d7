import time

import pytest

from mmgrpo.utils.budget import TimeBudget


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_budget_accumulates_laps_and_resumes():
    clk = FakeClock()
    b = TimeBudget(10.0, clock=clk)
    b.start()
    clk.t += 4.0
    assert b.lap() == 4.0 and not b.exhausted
    clk.t += 3.5
    b.lap()
    assert b.spent == 7.5 and not b.exhausted
    # a resumed run continues the same budget
    b2 = TimeBudget(10.0, clock=clk)
    b2.load_state_dict(b.state_dict())
    b2.start()
    clk.t += 2.5
    b2.lap()
    assert b2.spent == 10.0 and b2.exhausted


def test_no_limit_and_bad_clock():
    clk = FakeClock()
    b = TimeBudget(0.0, clock=clk)
    b.start()
    clk.t += 1e6
    b.lap()
    assert not b.enabled and not b.exhausted
    with pytest.raises(ValueError, match="budget clock"):
        TimeBudget(1.0, clock="gpu")


def test_cpu_clock_ignores_sleep():
    b = TimeBudget(1.0, clock="cpu")
    b.start()
    time.sleep(0.2)
    assert b.lap() < 0.1  # sleeping costs no CPU time
    w = TimeBudget(1.0, clock="wall")
    w.start()
    time.sleep(0.05)
    assert w.lap() >= 0.05
