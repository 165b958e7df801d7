"""mmgrpo.engine.reward_calls: the retry / timeout / back-off policy of both trainers, checked against a fake
clock (the schedule backoff * 2**k is written out by hand), real short timeouts and the counters."""
import threading
import time

import pytest

from mmgrpo.engine.errors import RewardCallFailed, RewardTimeout
from mmgrpo.engine.reward_calls import CallStats, RetryPolicy, call_with_retries, run_with_timeout


class FakeClock:
    def __init__(self):
        self.now, self.waits = 0.0, []

    def sleep(self, s):
        self.waits.append(s)
        self.now += s


def failing(n_fail, exc=ConnectionError("down"), value=7):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= n_fail:
            raise exc
        return value
    return fn, calls


def test_schedule_on_a_fake_clock_and_counters():
    clock, st, seen = FakeClock(), CallStats(), []
    fn, calls = failing(3)
    out = call_with_retries(fn, RetryPolicy(retries=4, backoff=0.25), stats=st, sleep=clock.sleep,
                            on_attempt_failed=lambda a, e, w: seen.append((a, type(e).__name__, w)))
    assert out == 7 and len(calls) == 4
    assert clock.waits == [0.25, 0.5, 1.0] and clock.now == 1.75  # 0.25 * (1 + 2 + 4)
    assert seen == [(0, "ConnectionError", 0.25), (1, "ConnectionError", 0.5), (2, "ConnectionError", 1.0)]
    assert (st.calls, st.retries, st.timeouts, st.failures) == (1, 3, 0, 0)


def test_exhausted_call_raises_chained_with_default_and_custom_message():
    clock, st, seen = FakeClock(), CallStats(), []
    fn, calls = failing(99, RuntimeError("boom"))
    with pytest.raises(RewardCallFailed, match=r"^judge failed 3 time\(s\); last error: RuntimeError: boom$") as ei:
        call_with_retries(fn, RetryPolicy(retries=2, backoff=1.0), stats=st, what="judge", sleep=clock.sleep,
                          on_attempt_failed=lambda a, e, w: seen.append(w))
    assert isinstance(ei.value.__cause__, RuntimeError) and len(calls) == 3
    assert clock.waits == [1.0, 2.0] and seen == [1.0, 2.0, None]  # None: no wait after the last attempt
    assert (st.calls, st.retries, st.failures) == (1, 2, 1)
    with pytest.raises(RewardCallFailed, match=r"^custom 1 ValueError$"):
        call_with_retries(failing(9, ValueError("v"))[0], RetryPolicy(retries=0), stats=st,
                          failure_message=lambda n, e: f"custom {n} {type(e).__name__}")
    assert (st.calls, st.retries, st.failures) == (2, 2, 2)


def test_zero_backoff_never_sleeps_and_interrupts_pass_through():
    clock = FakeClock()
    with pytest.raises(RewardCallFailed):
        call_with_retries(failing(9)[0], RetryPolicy(retries=3, backoff=0.0), sleep=clock.sleep)
    assert clock.waits == []
    fn, calls = failing(9, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        call_with_retries(fn, RetryPolicy(retries=3, backoff=0.0))
    assert len(calls) == 1  # not retried


def test_check_failure_is_a_failed_attempt():
    outs = iter([[1], [1, 2], [1, 2]])

    def check(out):
        if len(out) != 2:
            raise ValueError("wrong count")
    st = CallStats()
    assert call_with_retries(lambda: next(outs), RetryPolicy(retries=2, backoff=0.0), stats=st, check=check) == [1, 2]
    assert st.retries == 1 and st.failures == 0


def test_timeout_abandons_a_hung_attempt_and_is_counted():
    release, st = threading.Event(), CallStats()
    t0 = time.monotonic()
    with pytest.raises(RewardCallFailed, match="TimeoutError: no answer within 0.05 s"):
        call_with_retries(lambda: release.wait(10), RetryPolicy(retries=1, backoff=0.0, timeout=0.05), stats=st)
    assert time.monotonic() - t0 < 5.0 and (st.timeouts, st.retries, st.failures) == (2, 1, 1)
    release.set()
    # the caller's own error type and the counted type (the flow trainer counts only its RewardTimeout)
    st = CallStats()
    with pytest.raises(RewardCallFailed, match="RewardTimeout: slow 0.05"):
        call_with_retries(lambda: time.sleep(1), RetryPolicy(retries=0, timeout=0.05), stats=st,
                          timeout_error=lambda t: RewardTimeout(f"slow {t:g}"), timeout_type=RewardTimeout)
    assert st.timeouts == 1
    st = CallStats()
    with pytest.raises(RewardCallFailed):  # a TimeoutError raised by the reward itself is not "our" timeout
        call_with_retries(failing(9, TimeoutError("socket"))[0], RetryPolicy(retries=0), stats=st,
                          timeout_type=RewardTimeout)
    assert st.timeouts == 0


def test_run_with_timeout_returns_reraises_and_runs_inline_without_timeout():
    assert run_with_timeout(lambda: threading.current_thread().name, 5.0, thread_name="t-x") == "t-x"
    assert run_with_timeout(lambda: threading.current_thread().name, 0.0) == threading.current_thread().name
    with pytest.raises(KeyError):
        run_with_timeout(lambda: {}["k"], 5.0)


def test_policy_validation_and_thread_safe_counts():
    with pytest.raises(ValueError, match=">= 0"):
        RetryPolicy(retries=-1)
    assert [RetryPolicy(backoff=0.5).delay(k) for k in range(4)] == [0.5, 1.0, 2.0, 4.0]
    st = CallStats()
    ths = [threading.Thread(target=lambda: [st.add(retries=1) for _ in range(2000)]) for _ in range(4)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert st.retries == 8000


def test_both_trainers_use_the_engine_policy(monkeypatch):
    """The VLM reward calls and the flow ResilientReward both go through the engine's call_with_retries."""
    from types import SimpleNamespace

    import numpy as np

    import flow_grpo.scoring as fs
    import mmgrpo.vlm.rewards.scoring as vs
    from mmgrpo.engine import reward_calls as rc

    used = []
    real = rc.call_with_retries

    def spy(*a, **k):
        used.append(1)
        return real(*a, **k)
    monkeypatch.setattr(vs, "call_with_retries", spy)
    monkeypatch.setattr(fs, "call_with_retries", spy)
    scorer = vs.RewardScorer(None, None, "total", SimpleNamespace(retries=0, retry_backoff=0.0, timeout=0.0),
                             {"reward_retries": 0, "reward_timeouts": 0}, guard=None)
    assert scorer.call(lambda t, s: {"total": len(t)}, ["a", "b"], [{}, {}], "reward") == {"total": 2}
    r = fs.ResilientReward(lambda im, p, m: {"s": np.ones(len(p), dtype=np.float32)}, "s", retries=0)
    r(np.zeros((2, 4, 4, 3), dtype=np.uint8), ["a", "b"], [{}, {}])
    assert used == [1, 1]
    assert r.counters == {"calls": 1, "retries": 0, "timeouts": 0, "failed_calls": 0, "dropped": 0}
