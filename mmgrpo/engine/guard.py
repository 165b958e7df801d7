"""Everything that can end a run early, the same for both recipes: :class:`RunGuard`.

A run stops before its last step when

* SIGTERM / SIGINT reaches a process (cluster preemption, Ctrl-C; :class:`mmgrpo.utils.signals.StopOnSignal`): every
  process polls :meth:`RunGuard.signalled` at the same points (a max-reduction), so all stop at the same step;
* a fault policy asks for it (a reward call failed for good with ``reward.on_failure=stop``, a non-finite reward
  with ``reward.on_nonfinite=error``): :meth:`RunGuard.request_stop` on the process that saw it,
  :meth:`RunGuard.stop_requested` on every process;
* optimizer steps were skipped ``max_consecutive_skips`` times in a row (non-finite advantages, loss or gradients, or
  no valid group): :meth:`RunGuard.skipped` returns True (:class:`SkipHalt`, checkpointed);
* the training-time budget is spent (``run.max_train_seconds``; :class:`mmgrpo.utils.budget.TimeBudget`,
  checkpointed): :meth:`RunGuard.out_of_budget`, collective, then the run ends normally.

Every early end takes the same path, for both recipes: write a checkpoint of the current state (collective; its
folder is then known on every process), flush the metrics, raise -- :meth:`RunGuard.interrupt` (a signal:
:class:`~mmgrpo.engine.errors.TrainingInterrupted`, exit code 6; the checkpoint of this step / epoch is reused if
one was written), :meth:`RunGuard.stop` (a fault policy: :class:`~mmgrpo.engine.errors.TrainingStopped`, exit
code 3), :meth:`RunGuard.halt` (skipped steps in a row: a ``stop`` with the skip message), and
:meth:`RunGuard.stop_if_asked` (after a rollout: a signal or a stop request discards the rollout -- the recipe's
``rollback`` -- then interrupts or stops). The recipe hands the guard its checkpoint writer once
(:meth:`RunGuard.attach`); its ``save`` reports each checkpoint back (:meth:`RunGuard.saved`). The guard's own state
(skips, budget) is checkpointed (:meth:`state_dict`). A run that applied no optimizer step never ends as a success:
:meth:`check_trained` raises :class:`~mmgrpo.engine.errors.NothingTrained` (exit code 4).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping, NoReturn, Optional, Union

from mmgrpo.engine.dist import any_process, broadcast_object, global_max
from mmgrpo.engine.errors import NothingTrained, TrainingInterrupted, TrainingStopped
from mmgrpo.utils.budget import TimeBudget
from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.signals import StopOnSignal

log = get_logger("mmgrpo.guard")

__all__ = ["RunGuard", "SkipHalt"]


class SkipHalt:
    """Non-finite skip-and-halt state: skipped optimizer steps in a row, the last cause, and the limit at which the
    run stops (``0`` / ``None``: never)."""

    def __init__(self, limit: Optional[int] = None):
        self.limit = int(limit or 0)
        self.consecutive = 0
        self.last_cause: Optional[str] = None

    def skipped(self, cause: str, n: int = 1) -> bool:
        """Record ``n`` skipped steps; True if the run must stop (``limit`` reached)."""
        self.consecutive += int(n)
        self.last_cause = cause
        return self.halt_due

    def applied(self) -> None:
        """An optimizer step was applied: the run of skips ends."""
        self.consecutive = 0

    @property
    def halt_due(self) -> bool:
        return bool(self.limit) and self.consecutive >= self.limit

    def state_dict(self) -> dict:
        return {"consecutive_skips": self.consecutive, "last_skip_cause": self.last_cause}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        self.consecutive = int(sd["consecutive_skips"])
        self.last_cause = sd.get("last_skip_cause")


class RunGuard:
    """Signals, stop requests, skipped steps in a row and the time budget of one run (see the module docstring).

    ``device``: where the cross-process reductions run (None: the process group's default)."""

    def __init__(self, max_consecutive_skips: Optional[int], max_train_seconds: float = 0.0,
                 budget_clock: str = "wall", device: Any = None):
        self.skips = SkipHalt(max_consecutive_skips)
        self.budget = TimeBudget(max_train_seconds, budget_clock)
        self.budget_clock = budget_clock
        self.budget_stopped = False
        self.signals: Optional[StopOnSignal] = None
        self.stop_reason: Optional[str] = None
        self.stop_cause: Optional[BaseException] = None  # the error behind a requested stop, chained onto it
        self.device = device
        # the recipe's checkpoint writer and where the run is (attach), the newest checkpoint (saved)
        self._save: Optional[Callable[..., Any]] = None
        self._position: Callable[[], int] = lambda: 0
        self._flush: Callable[[], None] = lambda: None
        self.unit = "step"
        self.last_save: Optional[tuple[int, Optional[str]]] = None  # (position, folder) of the newest checkpoint

    # ------------------------------------------------------------------ checkpoints
    def attach(self, save: Callable[..., Any], position: Callable[[], int], unit: str,
               flush: Callable[[], None] = lambda: None) -> None:
        """The recipe's checkpoint writer (collective; returns the folder on the main process, keyword arguments
        such as ``metric`` / ``halted`` pass through), where the run is (``position()``: the step / epoch counter,
        ``unit``: its name in messages) and how its metrics are flushed."""
        self._save, self._position, self.unit, self._flush = save, position, unit, flush

    @property
    def where(self) -> str:
        return f"{self.unit} {self._position()}"

    def saved(self, position: int, path: Any) -> None:
        """The recipe wrote (or resumed from) the checkpoint of ``position``: a stop at the same position may reuse
        it."""
        self.last_save = (int(position), None if path is None else str(path))

    def saved_here(self) -> bool:
        """A checkpoint of the current position exists (written or resumed from)."""
        return self.last_save is not None and self.last_save[0] == self._position()

    def checkpoint(self, reuse: bool = True, **save_kw: Any) -> Optional[str]:
        """Collective: the checkpoint of the current state (``reuse``: the one of this position if written already);
        its folder on every process. The metrics are flushed."""
        if self._save is None:
            raise RuntimeError("RunGuard.attach(save=...) was not called: the guard cannot write a checkpoint")
        path = self.last_save[1] if reuse and self.saved_here() and not save_kw else self._save(**save_kw)
        path = broadcast_object(str(path) if path is not None else None)
        self._flush()
        return path

    # ------------------------------------------------------------------ the ways a run ends early (one path)
    def interrupt(self, note: str = "") -> NoReturn:
        """SIGTERM / SIGINT: checkpoint (reused if this position's is written) and raise
        :class:`TrainingInterrupted` on every process (exit code 6)."""
        where = self.where + (f" ({note})" if note else "")
        path = self.checkpoint()
        log.warning("interrupted by %s at %s: checkpoint %s", self.signal_name, where, path)
        raise TrainingInterrupted(self.signal_name, where, path)

    def stop(self, reason: Union[str, Callable[[Optional[str]], str]], resume_hint: bool = True, reuse: bool = False,
             cause: Optional[BaseException] = None, **save_kw: Any) -> NoReturn:
        """A fault policy: write a checkpoint of the current state and raise :class:`TrainingStopped` (exit code 3).
        ``reason``: the message after "training stopped at <step / epoch>: ", or a function of the checkpoint
        folder giving the whole message (then ``resume_hint=False``: it says how to resume). ``reuse``: the state is
        the one of this position's checkpoint, if written (nothing counted since), else it is rewritten. ``cause``:
        the error behind the stop, chained (``raise ... from``) so its traceback stays with the stop."""
        path = self.checkpoint(reuse=reuse, **save_kw)
        msg = reason(path) if callable(reason) else f"training stopped at {self.where}: {reason}"
        log.error(msg)
        raise TrainingStopped(msg, path, resume_hint=resume_hint) from cause

    def halt(self, limit_key: str, applied_any: bool, advice: str, resume_by_path: bool = False,
             **save_kw: Any) -> NoReturn:
        """``max_consecutive_skips`` optimizer steps skipped in a row: :meth:`stop` with a message naming the count,
        the last cause and ``limit_key``. ``resume_by_path``: the state goes elsewhere than the resumable checkpoints
        (the flow recipe's ``halted/``), the message names the folder to resume from."""
        never = "" if applied_any else " (no optimizer step of this run was applied)"
        msg = (f"training stopped at {self.where}: {self.consecutive_skips} consecutive optimizer steps were skipped"
               f"{never} (last cause: {self.last_skip_cause}; {limit_key}={self.skips.limit}); {advice}")
        if resume_by_path:
            self.stop(lambda p: f"{msg}; the state was written to {p} (continue with run.resume_from={p} after "
                                "fixing the cause)", resume_hint=False, **save_kw)
        self.stop(msg, **save_kw)

    def stop_if_asked(self, rollback: Callable[[bool], None], note: str, reuse: bool = False) -> None:
        """Collective, after a rollout (the same collectives ran everywhere): if any process asked for a stop
        (:meth:`request_stop`) or a signal reached one, the rollout is discarded -- ``rollback(signalled)`` restores
        the state before it (``signalled``: nothing of it is kept, not even its counts) -- and the run stops
        (:meth:`stop`; ``reuse``: the rolled-back state is the checkpointed one, nothing of the rollout is counted)
        or is interrupted (:meth:`interrupt`, ``note`` says what was discarded)."""
        stop = self.stop_requested()
        signalled = not stop and self.signalled()
        if not (stop or signalled):
            return
        rollback(signalled)
        if signalled:
            self.interrupt(note)
        self.stop(self.stop_reason or "another process requested a stop (see its log)", reuse=reuse,
                  cause=self.stop_cause)

    # ------------------------------------------------------------------ signals
    @contextlib.contextmanager
    def watching_signals(self) -> Iterator["RunGuard"]:
        """While the loop runs, SIGTERM / SIGINT set a flag instead of killing the process."""
        with StopOnSignal() as self.signals:
            try:
                yield self
            finally:
                self.signals = None

    def signalled(self) -> bool:
        """Collective: True on every process if a signal reached any of them."""
        return self.signals is not None and self.signals.agreed(lambda x: global_max(x, self.device))

    @property
    def signal_name(self) -> str:
        return self.signals.name if self.signals is not None else "no signal"

    # ------------------------------------------------------------------ fault policies
    def request_stop(self, reason: str, cause: Optional[BaseException] = None) -> None:
        """Ask for a stop (this process); the loop stops once every process has finished the same collectives.
        ``cause``: the error behind it (the first request's is chained onto the :class:`TrainingStopped`)."""
        if self.stop_reason is None:
            self.stop_reason, self.stop_cause = reason, cause
        log.error("stop requested: %s", reason)

    def stop_requested(self) -> bool:
        """Collective: True on every process if any process asked for a stop."""
        return any_process(self.stop_reason is not None, self.device)

    # ------------------------------------------------------------------ skipped steps
    def skipped(self, cause: str, n: int = 1) -> bool:
        """Record ``n`` skipped optimizer steps; True when ``max_consecutive_skips`` in a row are reached."""
        return self.skips.skipped(cause, n)

    def applied(self) -> None:
        self.skips.applied()

    @property
    def consecutive_skips(self) -> int:
        return self.skips.consecutive

    @property
    def last_skip_cause(self) -> str:
        return self.skips.last_cause or "unknown"

    # ------------------------------------------------------------------ time budget
    def out_of_budget(self, after: str = "") -> bool:
        """Collective when a budget is set: every process stops after the same step (``after``: where the run is,
        for the log line written when the budget is found spent)."""
        if not self.budget.enabled:
            return False
        if any_process(self.budget.exhausted, self.device):
            if not self.budget_stopped:
                log.info("run.max_train_seconds=%g reached after %s (%.1f s, %s clock)", self.budget.max_seconds,
                         after or "this step", self.budget.spent, self.budget_clock)
            self.budget_stopped = True
        return self.budget_stopped

    # ------------------------------------------------------------------ the end of a run
    def check_trained(self, steps_run: int, applied: int, no_signal: int, allow_no_signal: bool,
                      why_no_signal: Callable[[], str], why_nothing_applied: Callable[[], str]) -> None:
        """The end of a run of ``steps_run`` > 0 steps / epochs: it fails (:class:`NothingTrained`, after a flush; no
        final weights) if none of its ``applied`` optimizer steps was applied (``why_nothing_applied()``: the
        message), or if every step had no reward signal (``no_signal`` of them; only KL / method terms were applied:
        ``why_no_signal()``) unless ``allow_no_signal`` (``run.allow_no_reward_signal``: rehearsals)."""
        if steps_run <= 0 or (applied > 0 and (no_signal < steps_run or allow_no_signal)):
            return
        self._flush()
        raise NothingTrained(why_no_signal() if applied > 0 else why_nothing_applied())

    def state_dict(self) -> dict:
        return {**self.skips.state_dict(), "budget": self.budget.state_dict()}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        self.skips.load_state_dict(sd)
        self.budget.load_state_dict(sd.get("budget"))
