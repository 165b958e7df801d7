"""Training-time budget shared by both trainers (``run.max_train_seconds``, ``run.budget_clock``).

Used for equal-budget method comparisons (``scripts/compare_*_methods.sh``) and for cluster time limits: the loop
stops after the step (VLM) or epoch (flow) during which the budget ran out, then saves and exports as at a normal
end. The time spent is part of the checkpoint, so a resumed run continues the same budget.

Clocks:

* ``wall`` - ``time.perf_counter``: what a user waits for.
* ``cpu``  - ``time.process_time``: CPU seconds of this process, summed over its threads. On a shared machine
  this is barely affected by other jobs, so budgets stay comparable between runs; with several torch threads it
  counts thread-seconds (one second of 2 busy threads = 2 s).
"""
from __future__ import annotations

import time
from typing import Callable, Optional

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


class TimeBudget:
    """Accumulates the seconds spent in training laps; ``exhausted`` once they reach ``max_seconds`` (> 0).

    ``max_seconds <= 0`` means no limit. ``clock`` is ``"wall"`` or ``"cpu"`` (see the module docstring), or any
    zero-argument callable returning seconds (tests pass a fake clock).
    """

    def __init__(self, max_seconds: float = 0.0, clock: str | Callable[[], float] = "wall", spent: float = 0.0):
        if isinstance(clock, str):
            if clock not in CLOCKS:
                raise ValueError(f"budget clock must be one of {sorted(CLOCKS)}, got {clock!r}")
            clock = CLOCKS[clock]
        if spent < 0:
            raise ValueError(f"spent seconds must be >= 0, got {spent}")
        self.max_seconds = float(max_seconds)
        self.spent = float(spent)
        self._clock = clock
        self._t0: Optional[float] = None

    @property
    def enabled(self) -> bool:
        return self.max_seconds > 0

    def start(self) -> None:
        """Begin a lap (call before the work that counts)."""
        self._t0 = self._clock()

    def lap(self) -> float:
        """End the lap: add its seconds to ``spent`` and start the next one. Returns the total spent."""
        now = self._clock()
        if self._t0 is not None:
            self.spent += max(0.0, now - self._t0)
        self._t0 = now
        return self.spent

    @property
    def exhausted(self) -> bool:
        return self.enabled and self.spent >= self.max_seconds

    def state_dict(self) -> dict:
        return {"spent": self.spent}

    def load_state_dict(self, state: Optional[dict]) -> None:
        self.spent = float((state or {}).get("spent", 0.0))


__all__ = ["TimeBudget", "CLOCKS"]
