"""Reward calls with retries, a per-attempt timeout and exponential back-off: the one policy both trainers use
(the VLM trainer through :class:`mmgrpo.vlm.rewards.scoring.RewardScorer`, the flow trainer through
:class:`flow_grpo.scoring.ResilientReward`).

Schedule: a call is tried ``1 + retries`` times; attempt ``k`` (0-based) fails if it raises, exceeds ``timeout``
seconds, or its result fails ``check``; after a failed attempt ``k < retries`` the caller waits
``backoff * 2**k`` seconds (no wait when that is 0).  When every attempt failed, :class:`RewardCallFailed` is
raised, chained to the last error.  KeyboardInterrupt / SystemExit are never swallowed.

The timeout runs the attempt in a daemon thread that is abandoned, not killed, when it does not answer (Python
cannot kill threads; a daemon thread keeps neither the run nor the interpreter's exit waiting).  ``timeout=0``
runs the attempt in the caller's thread.

What each trainer says is its own: the log line of a failed attempt (``on_attempt_failed``), the timeout
error (``timeout_error``) and the final message (``failure_message``).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from mmgrpo.engine.errors import RewardCallFailed

__all__ = ["CallStats", "RetryPolicy", "run_with_timeout", "call_with_retries"]


@dataclass
class CallStats:
    """Counters of one or many calls (thread-safe through :meth:`add`)."""

    calls: int = 0  # calls started
    retries: int = 0  # failed attempts that were retried
    failures: int = 0  # calls that failed for good
    timeouts: int = 0  # attempts that exceeded the timeout
    lock: Any = field(default_factory=threading.RLock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 2  # extra attempts after the first
    backoff: float = 1.0  # seconds before the first retry; doubles each retry
    timeout: float = 0.0  # seconds per attempt; 0 = unbounded

    def __post_init__(self):
        if self.retries < 0 or self.backoff < 0 or self.timeout < 0:
            raise ValueError("reward retries, retry_backoff and timeout must be >= 0")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (0-based) before the next one."""
        return self.backoff * (2 ** attempt)


def _default_timeout_error(timeout: float) -> BaseException:
    return TimeoutError(f"no answer within {timeout:g} s")


def _default_failure_message(what: str, attempts: int, last: BaseException) -> str:
    return f"{what} failed {attempts} time(s); last error: {type(last).__name__}: {last}"


def run_with_timeout(fn: Callable[[], Any], timeout: float,
                     timeout_error: Callable[[float], BaseException] = _default_timeout_error,
                     thread_name: str = "mmgrpo-reward") -> Any:
    """``fn()``; with ``timeout > 0`` in a daemon thread, raising ``timeout_error(timeout)`` if it has not returned
    after ``timeout`` seconds (the thread is abandoned).  An exception of ``fn`` is re-raised in the caller."""
    if not timeout or timeout <= 0:
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    th = threading.Thread(target=target, name=thread_name, daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        raise timeout_error(timeout)
    if "error" in box:
        raise box["error"]
    return box["value"]


def call_with_retries(fn: Callable[[], Any], policy: RetryPolicy, *, stats: Optional[CallStats] = None,
                      check: Optional[Callable[[Any], None]] = None,
                      on_attempt_failed: Optional[Callable[[int, BaseException, Optional[float]], None]] = None,
                      timeout_error: Callable[[float], BaseException] = _default_timeout_error,
                      failure_message: Optional[Callable[[int, BaseException], str]] = None,
                      timeout_type: type = TimeoutError,
                      what: str = "reward function", thread_name: str = "mmgrpo-reward",
                      sleep: Callable[[float], None] = time.sleep) -> Any:
    """``fn()`` under ``policy`` (see the module docstring); returns the first result that passes ``check``.

    ``check(result)`` runs in the caller's thread after the attempt returned; raising makes the attempt a failure.
    ``on_attempt_failed(attempt, error, wait)`` is called after each failed attempt, ``wait`` being the back-off
    before the next attempt, or None after the last one.  ``failure_message(attempts, last_error)`` words the
    final :class:`RewardCallFailed` (default: ``"<what> failed N time(s); last error: <Type>: <error>"``).
    ``stats`` counts calls, retries, timeouts (attempt errors that are instances of ``timeout_type``) and final
    failures.
    """
    stats = stats if stats is not None else CallStats()
    stats.add(calls=1)
    last: Optional[BaseException] = None
    attempts = policy.retries + 1
    for attempt in range(attempts):
        try:
            out = run_with_timeout(fn, policy.timeout, timeout_error, thread_name)
            if check is not None:
                check(out)
            return out
        except Exception as e:  # noqa: BLE001 - any failure of user code is a fault to handle (not ^C / exit)
            last = e
            stats.add(timeouts=int(isinstance(e, timeout_type)))
            wait = policy.delay(attempt) if attempt < policy.retries else None
            if on_attempt_failed is not None:
                on_attempt_failed(attempt, e, wait)
            if wait is not None:
                stats.add(retries=1)
                if wait > 0:
                    sleep(wait)
    stats.add(failures=1)
    msg = failure_message(attempts, last) if failure_message is not None else _default_failure_message(
        what, attempts, last)
    raise RewardCallFailed(msg) from last
