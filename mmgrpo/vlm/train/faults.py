"""Faults during training: reward calls that raise / hang, non-finite numbers, and stopping without losing the run.

* :func:`call_with_retries` runs a reward function with a per-call timeout (a daemon thread: a hung remote judge
  cannot block the run, nor the interpreter's exit) and exponential back-off retries (the shared policy of
  :mod:`mmgrpo.engine.reward_calls`);
* :func:`nonfinite_rows` finds rows whose rewards are NaN/inf;
* :class:`TrainingStopped` is raised by the trainer AFTER it wrote a checkpoint, with a message saying why and
  where to resume from (``mmgrpo train`` turns it into exit code 3, not a traceback);
* :class:`NothingTrained` is raised at the end of a run none of whose optimizer steps was applied (every step
  skipped: no valid group / reward, non-finite values); no final weights are written (exit code 4).

The exception classes are :mod:`mmgrpo.engine.errors` (one family for both trainers).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import torch

from mmgrpo.engine.reward_calls import CallStats, RetryPolicy
from mmgrpo.engine.reward_calls import call_with_retries as _call_with_retries
from mmgrpo.utils.logging import get_logger

log = get_logger("mmgrpo.train.faults")

__all__ = ["call_with_retries", "nonfinite_rows"]


def call_with_retries(fn: Callable[..., Any], args: tuple, retries: int = 2, backoff: float = 1.0,
                      timeout: float = 0.0, stats: CallStats | None = None, what: str = "reward function",
                      sleep: Callable[[float], None] = time.sleep) -> Any:
    """``fn(*args)`` with up to ``retries`` retries; wait ``backoff * 2**k`` s before retry k+1.

    ``timeout`` > 0 bounds every attempt (seconds); 0 = no bound (the call runs in the caller's thread).
    Raises :class:`RewardCallFailed` (chaining the last error) when every attempt failed.  KeyboardInterrupt and
    SystemExit are never swallowed.  The policy is :func:`mmgrpo.engine.reward_calls.call_with_retries`; this
    wrapper keeps the VLM trainer's signature and log line (a warning before each retry).
    """
    def warn(attempt: int, e: BaseException, wait: float | None) -> None:
        if wait is not None:
            log.warning("%s failed (attempt %d/%d: %s: %s); retrying in %.3g s", what, attempt + 1,
                        retries + 1, type(e).__name__, e, wait)

    return _call_with_retries(lambda: fn(*args), RetryPolicy(retries, backoff, timeout), stats=stats,
                              on_attempt_failed=warn, what=what, sleep=sleep)


def nonfinite_rows(rewards: Mapping[str, torch.Tensor], n: int, keys: list[str] | None = None) -> torch.Tensor:
    """(n,) bool: rows where any of the given reward tensors (default: all float ones) is NaN or inf."""
    bad = torch.zeros(n, dtype=torch.bool)
    for k, v in rewards.items():
        if keys is not None and k not in keys:
            continue
        v = torch.as_tensor(v)
        if v.dtype.is_floating_point and v.shape[:1] == (n,):
            bad |= ~torch.isfinite(v.reshape(n, -1)).all(1)
    return bad
