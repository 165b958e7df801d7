"""StopOnSignal: the first SIGTERM / SIGINT only sets a flag, copies within the repeat window count once, a later
second signal kills the process by that signal; handlers are restored; the flag is agreed through a max-reduction."""
import os
import signal
import sys
import time

from mmgrpo.utils.signals import StopOnSignal


def _in_child(fn):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn()
            code = 0
        finally:
            os._exit(code)
    _, st = os.waitpid(pid, 0)
    return st


def test_first_signal_sets_the_flag_and_handlers_are_restored():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    msgs = []
    with StopOnSignal(announce=msgs.append) as sig:
        assert not sig.requested and not sig.agreed()
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt
        assert sig.requested and sig.name == "SIGINT" and sig.agreed()
        os.kill(os.getpid(), signal.SIGTERM)  # a copy within the repeat window: ignored, process alive
        assert sig.signum == signal.SIGINT
    assert {s: signal.getsignal(s) for s in before} == before
    assert len(msgs) == 1 and "SIGINT received" in msgs[0] and "again to abort" in msgs[0]


def test_agreed_uses_the_reduction_and_names_a_peer():
    sig = StopOnSignal()
    assert sig.agreed(lambda x: max(x, 1.0)) and sig.stopped_by_peer and sig.name == "a signal on another process"
    assert not StopOnSignal().agreed(lambda x: x)


def test_second_signal_after_the_window_kills_by_that_signal():
    def first_then_second(sig_first, sig_second, window):
        def fn():
            with StopOnSignal(repeat_window=window, announce=lambda m: None):
                os.kill(os.getpid(), sig_first)
                time.sleep(window + 0.05)
                os.kill(os.getpid(), sig_second)
                time.sleep(5)  # not reached: the second signal kills at once
        return fn

    st = _in_child(first_then_second(signal.SIGTERM, signal.SIGTERM, 0.05))
    assert os.WIFSIGNALED(st) and os.WTERMSIG(st) == signal.SIGTERM
    st = _in_child(first_then_second(signal.SIGTERM, signal.SIGINT, 0.05))
    assert os.WIFSIGNALED(st) and os.WTERMSIG(st) == signal.SIGINT


def test_an_ignored_signal_stays_ignored():
    def fn():
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a shell does for `cmd &`
        with StopOnSignal(announce=lambda m: None) as sig:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert not sig.requested
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN

    st = _in_child(fn)
    assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0
