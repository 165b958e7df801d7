"""Graceful stop on SIGTERM / SIGINT (cluster preemption, Ctrl-C) for the training loops.

:class:`StopOnSignal` replaces the SIGTERM and SIGINT handlers while a training loop runs. The first signal only
sets a flag; the loop polls it (:meth:`StopOnSignal.agreed`, a max-reduction over processes so that every process
stops at the same step) at its step / epoch boundaries, writes a checkpoint and raises :class:`mmgrpo.engine.errors.TrainingInterrupted`;
both CLIs turn that into exit code 6 (:data:`mmgrpo.utils.exit_codes.INTERRUPTED`) and one line naming the checkpoint.

A *second* signal aborts at once: the default action of that signal is restored and the signal re-sent, so the
process dies by it (the shell sees 128 + signal number) without running any more Python. Nothing is corrupted:
checkpoints are renamed into place atomically (see :mod:`mmgrpo.utils.checkpoint`), so a write cut short leaves only
a temp dir that the next run removes, and the last complete checkpoint still loads.

Copies of one signal that arrive together count once: a terminal's Ctrl-C reaches the launcher
(``accelerate launch`` / ``torchrun``) and the workers, and the launcher forwards it to the workers again a few
milliseconds later. Only a signal at least :data:`REPEAT_WINDOW` seconds after the first aborts.

Python runs signal handlers between bytecodes of the main thread: a process blocked inside one long native call
(e.g. a collective waiting for a dead peer) notices a signal only when that call returns; SIGKILL always works and
leaves the last complete checkpoint.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable, Optional

__all__ = ["StopOnSignal", "REPEAT_WINDOW"]

REPEAT_WINDOW = 1.0  # seconds: signals closer than this to the first one are copies of it, not a second request

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopOnSignal:
    """Context manager: while active, SIGTERM / SIGINT set :attr:`signum` instead of killing the process.

    Outside the main thread (where Python cannot install handlers) it does nothing and never reports a signal; a
    signal that was ignored (SIG_IGN: SIGINT of a background job started with ``&``, ``nohup``) stays ignored. The
    previous handlers are restored on exit.
    """

    def __init__(self, signals=_SIGNALS, repeat_window: float | None = None,
                 announce: Callable[[str], None] | None = None):
        self.signals = tuple(signals)
        self.repeat_window = float(REPEAT_WINDOW if repeat_window is None else repeat_window)
        self.signum: Optional[int] = None
        self._t_first = 0.0
        self._old: dict[int, object] = {}
        self._announce = announce or (lambda msg: os.write(2, msg.encode()))  # os.write: safe inside a handler
        self.stopped_by_peer = False

    # ------------------------------------------------------------------ install / restore
    def install(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                if signal.getsignal(s) is signal.SIG_IGN:  # e.g. SIGINT of a background job (`cmd &`), nohup
                    continue
                self._old[s] = signal.signal(s, self._handle)
        return self

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()

    def __enter__(self) -> "StopOnSignal":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.restore()

    def _handle(self, signum: int, frame) -> None:
        now = time.monotonic()
        if self.signum is None:
            self.signum, self._t_first = signum, now
            self._announce(f"\n{signal.Signals(signum).name} received: stopping at the next step boundary, then "
                           "writing a checkpoint (send it again to abort at once)\n")
        elif now - self._t_first >= self.repeat_window:
            self._announce(f"\n{signal.Signals(signum).name} received again: aborting now (the last complete "
                           "checkpoint is kept)\n")
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    # ------------------------------------------------------------------ polling
    @property
    def requested(self) -> bool:
        """A signal reached this process."""
        return self.signum is not None

    @property
    def name(self) -> str:
        if self.signum is not None:
            return signal.Signals(self.signum).name
        return "a signal on another process" if self.stopped_by_peer else "no signal"

    def agreed(self, reduce_max: Callable[[float], float] | None = None) -> bool:
        """Collective when ``reduce_max`` is given (call it at the same point on every process): True on every
        process if a signal reached any of them."""
        local = float(self.signum is not None)
        stop = (reduce_max(local) if reduce_max is not None else local) > 0
        if stop and self.signum is None:
            self.stopped_by_peer = True
        return stop
