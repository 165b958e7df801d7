"""The one stop-and-checkpoint path both recipes take (mmgrpo.engine.guard.RunGuard): every early end writes a
checkpoint of the current state first, flushes the metrics and raises the error that names it. The end-to-end
counterparts (a real signal -> checkpoint -> resume, bitwise, one and two processes) are
tests/trainer/test_preemption.py (VLM) and tests/flow_grpo/test_trainer_preemption.py (flow)."""
import os
import signal

import pytest

from mmgrpo.engine.errors import TrainingInterrupted, TrainingStopped
from mmgrpo.engine.guard import RunGuard


class Run:
    """A recipe in miniature: its position, its checkpoint writer (which reports back to the guard), its log."""

    def __init__(self, limit=2):
        self.position, self.writes, self.events = 0, [], []
        self.guard = RunGuard(limit)
        self.guard.attach(save=self.save, position=lambda: self.position, unit="step",
                          flush=lambda: self.events.append("flush"))

    def save(self, **kw):
        path = f"/ck/step-{self.position}" + ("-halted" if kw.get("halted") else "")
        self.writes.append((self.position, kw))
        self.events.append("save")
        if not kw.get("halted"):
            self.guard.saved(self.position, path)
        return path


def test_interrupt_reuses_this_positions_checkpoint_and_writes_one_otherwise():
    r = Run()
    r.position = 3
    r.save()  # the loop's periodic save at step 3
    with pytest.raises(TrainingInterrupted, match="stopped at step 3; checkpoint written: /ck/step-3") as e:
        r.guard.interrupt()
    assert e.value.checkpoint == "/ck/step-3" and r.writes == [(3, {})]  # not written twice
    assert r.events == ["save", "flush"]
    r.position = 4  # a step later: nothing saved here yet
    with pytest.raises(TrainingInterrupted, match=r"stopped at step 4 \(its rollouts were discarded\)"):
        r.guard.interrupt("its rollouts were discarded")
    assert r.writes == [(3, {}), (4, {})] and r.events[-2:] == ["save", "flush"]  # saved before the flush


def test_stop_rewrites_the_checkpoint_unless_told_the_state_is_the_saved_one():
    r = Run()
    r.save()
    with pytest.raises(TrainingStopped, match=r"training stopped at step 0: bad reward; checkpoint written: "
                                              r"/ck/step-0 \(resume with run.resume_from=auto\)"):
        r.guard.stop("bad reward")
    assert r.writes == [(0, {}), (0, {})]  # counts changed since the save: written again
    with pytest.raises(TrainingStopped):
        r.guard.stop("bad reward", reuse=True)
    assert len(r.writes) == 2


def test_halt_names_the_count_the_cause_and_the_limit_and_can_save_elsewhere():
    r = Run(limit=2)
    assert not r.guard.skipped("non-finite loss") and r.guard.skipped("non-finite gradients")
    with pytest.raises(TrainingStopped, match=r"training stopped at step 0: 2 consecutive optimizer steps were "
                                              r"skipped \(no optimizer step of this run was applied\) \(last cause: "
                                              r"non-finite gradients; run.max_consecutive_skips=2\); check it"):
        r.guard.halt("run.max_consecutive_skips", applied_any=False, advice="check it")
    with pytest.raises(TrainingStopped) as e:  # the flow recipe: the state goes to halted/, resumed by its path
        r.guard.halt("optim.max_consecutive_skips", applied_any=True, advice="fix it", resume_by_path=True,
                     halted=True)
    msg = str(e.value)
    assert "(no optimizer step" not in msg and msg.endswith(
        "the state was written to /ck/step-0-halted (continue with run.resume_from=/ck/step-0-halted after fixing "
        "the cause)")
    assert r.writes[-1] == (0, {"halted": True}) and e.value.checkpoint == "/ck/step-0-halted"


def test_stop_if_asked_rolls_back_then_stops_or_interrupts():
    r = Run()
    rolled = []
    r.guard.stop_if_asked(rolled.append, "its rollouts were discarded")  # nothing asked: the step goes on
    assert rolled == [] and r.writes == []
    r.guard.request_stop("a reward call failed (reward.on_failure=stop)")
    with pytest.raises(TrainingStopped, match="training stopped at step 0: a reward call failed"):
        r.guard.stop_if_asked(rolled.append, "its rollouts were discarded")
    assert rolled == [False] and len(r.writes) == 1
    r2 = Run()
    with r2.guard.watching_signals():
        os.kill(os.getpid(), signal.SIGTERM)  # handled: a flag, not the end of the process
        with pytest.raises(TrainingInterrupted, match=r"SIGTERM received: stopped at step 0 \(its samples"):
            r2.guard.stop_if_asked(rolled.append, "its samples were discarded", reuse=True)
    assert rolled == [False, True] and r2.writes == [(0, {})]


def test_a_guard_without_a_checkpoint_writer_says_so():
    with pytest.raises(RuntimeError, match="attach"):
        RunGuard(0).stop("x")


def test_check_trained_fails_a_run_with_no_applied_step_or_no_reward_signal_at_all():
    from mmgrpo.engine.errors import NothingTrained

    r = Run()
    no_signal, none_applied = (lambda: "only KL"), (lambda: "all skipped")
    r.guard.check_trained(0, 0, 0, False, no_signal, none_applied)  # no step run: nothing to judge
    r.guard.check_trained(3, 2, 2, False, no_signal, none_applied)  # one step of three had a signal
    r.guard.check_trained(3, 2, 3, True, no_signal, none_applied)  # run.allow_no_reward_signal
    with pytest.raises(NothingTrained, match="only KL"):
        r.guard.check_trained(3, 2, 3, False, no_signal, none_applied)
    with pytest.raises(NothingTrained, match="all skipped"):
        r.guard.check_trained(3, 0, 0, True, no_signal, none_applied)
    assert r.events == ["flush", "flush"] and r.writes == []  # flushed, never a checkpoint


def test_a_requested_stop_keeps_its_cause_and_the_first_request_wins():
    r = Run()
    first, second = RuntimeError("reward server down"), ValueError("later")
    r.guard.request_stop("a reward call failed", cause=first)
    r.guard.request_stop("something else", cause=second)
    rolled = []
    with pytest.raises(TrainingStopped, match="training stopped at step 0: a reward call failed") as e:
        r.guard.stop_if_asked(rolled.append, note="")
    assert e.value.__cause__ is first and rolled == [False]  # the traceback of the failure stays with the stop
