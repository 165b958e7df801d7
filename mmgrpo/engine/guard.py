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

The recipe decides what is saved before it raises :class:`~mmgrpo.engine.errors.TrainingInterrupted` /
:class:`~mmgrpo.engine.errors.TrainingStopped`; the guard keeps the state those decisions read and checkpoints it
(:meth:`state_dict`). A run that applied no optimizer step never ends as a success: :meth:`check_trained` raises
:class:`~mmgrpo.engine.errors.NothingTrained` (exit code 4).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Optional

from mmgrpo.engine.dist import any_process, global_max
from mmgrpo.engine.errors import NothingTrained
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
        self.device = device

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
    def request_stop(self, reason: str) -> None:
        """Ask for a stop (this process); the loop stops once every process has finished the same collectives."""
        if self.stop_reason is None:
            self.stop_reason = reason
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
    @staticmethod
    def check_trained(steps_run: int, applied: int, message: str) -> None:
        """A run of ``steps_run`` > 0 steps none of whose optimizer steps was applied fails (no final weights)."""
        if steps_run > 0 and applied <= 0:
            raise NothingTrained(message)

    def state_dict(self) -> dict:
        return {**self.skips.state_dict(), "budget": self.budget.state_dict()}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        self.skips.load_state_dict(sd)
        self.budget.load_state_dict(sd.get("budget"))
