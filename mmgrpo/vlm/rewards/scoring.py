"""Calling the run's reward functions: retries, timeouts and the fault policy (``reward.*``), the weighted total, and
which rows may take part (their reward exists and is finite).

:class:`RewardScorer` is built once per run from the reward functions and the ``reward`` config section; the VLM
recipe scores every rollout chunk, validation point and data-selection pass through it.

Faults: a reward call that raises or times out is retried with back-off (the shared policy of
:func:`mmgrpo.engine.reward_calls.call_with_retries`; a hung remote judge cannot block the run), then its rows are
dropped (counted) or the run stops (the guard's stop request, ``reward.on_failure=stop``); NaN/inf rewards drop their
rows (:meth:`RewardScorer.valid_rows`) or stop the run (``reward.on_nonfinite=error``). The counts go to the run's
``counters`` (``reward_failed_calls``, ``reward_retries``, ``reward_timeouts``, ``reward_failed_rows``,
``reward_nonfinite_rows``), a dict the scorer updates in place.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from mmgrpo.engine.errors import RewardCallFailed
from mmgrpo.engine.guard import RunGuard
from mmgrpo.engine.reward_calls import CallStats, RetryPolicy, call_with_retries
from mmgrpo.utils.logging import get_logger
from mmgrpo.vlm.data.task import sample_id

log = get_logger("mmgrpo.train")

__all__ = ["RewardScorer", "nonfinite_rows"]


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


class RewardScorer:
    """The run's rewards of completions. ``reward_fn(texts, samples) -> {name: (n,)}``; ``accuracy_fn`` (optional)
    gives the task's accuracy under ``acc_key``; ``reward_cfg``: the ``reward`` config section (weights, retries,
    timeout, fault policies); ``counters``: the run's fault counters (updated in place); ``guard``: where a stop is
    requested (``reward.on_failure=stop`` / ``on_nonfinite=error``)."""

    def __init__(self, reward_fn: Callable, accuracy_fn: Callable | None, acc_key: str, reward_cfg: Any,
                 counters: dict[str, int], guard: RunGuard):
        self.reward_fn, self.accuracy_fn, self.acc_key = reward_fn, accuracy_fn, acc_key
        self.cfg, self.counters, self.guard = reward_cfg, counters, guard

    def call(self, fn: Callable, texts: list[str], samples: list, what: str) -> dict | None:
        """``fn(texts, samples)`` with retries / timeout; None if it failed for good.

        A failed call never raises here: its rows are dropped (``reward.on_failure=drop``), or the failure is
        recorded and, once every process has finished the same collectives, the step stops the run
        (``on_failure=stop``)."""
        rc, counters = self.cfg, self.counters
        stats = CallStats()

        def warn(attempt: int, e: BaseException, wait: float | None) -> None:
            if wait is not None:
                log.warning("%s failed (attempt %d/%d: %s: %s); retrying in %.3g s", what, attempt + 1,
                            rc.retries + 1, type(e).__name__, e, wait)

        try:
            return call_with_retries(lambda: fn(texts, samples), RetryPolicy(rc.retries, rc.retry_backoff, rc.timeout),
                                     stats=stats, on_attempt_failed=warn, what=what)
        except RewardCallFailed as e:
            counters["reward_failed_calls"] += 1
            if rc.on_failure == "stop":
                self.guard.request_stop(f"{e} (reward.on_failure=stop)", cause=e)
            else:
                log.warning("%s; dropping its %d row(s) (reward.on_failure=drop)", e, len(texts))
            return None
        finally:
            counters["reward_retries"] += stats.retries
            counters["reward_timeouts"] += stats.timeouts

    def score(self, texts: list[str], samples: list[dict]) -> dict[str, torch.Tensor]:
        """Rewards of the rows; ``out["_failed"]`` (bool) marks rows whose reward call failed (rewards NaN)."""
        n = len(texts)
        out = self.call(self.reward_fn, texts, samples, "reward function")
        if out is None:
            return {"total": torch.full((n,), float("nan")), "parse_failed": torch.zeros(n, dtype=torch.bool),
                    "_failed": torch.ones(n, dtype=torch.bool)}
        out = {k: torch.as_tensor(v) for k, v in out.items()}
        if "total" not in out:
            out["total"] = sum(self.cfg.weights[k] * out[k].float() for k in self.cfg.weights)
        if "parse_failed" not in out:
            out["parse_failed"] = torch.zeros(n, dtype=torch.bool)
        for k, v in out.items():
            if v.shape[:1] != (n,):
                raise ValueError(f"reward function returned {k!r} with shape {tuple(v.shape)} for {n} completions")
        out["_failed"] = torch.zeros(n, dtype=torch.bool)
        return out

    def accuracy(self, texts: list[str], samples: list[Any], scored: dict | None = None) -> torch.Tensor:
        """Accuracy per row (``reward.accuracy_key``); NaN where the reward failed."""
        if scored is not None and self.acc_key in scored:
            return scored[self.acc_key].float()
        res = self.call(self.accuracy_fn or self.reward_fn, texts, samples, "accuracy reward")
        if res is None:
            return torch.full((len(texts),), float("nan"))
        return torch.as_tensor(res[self.acc_key] if self.acc_key in res else res["total"]).float()

    def valid_rows(self, rewards: dict[str, torch.Tensor], failed: torch.Tensor,
                   samples: Sequence[Any]) -> torch.Tensor:
        """A row takes part only if its reward call succeeded and its (weighted) rewards are finite; ``samples``: the
        rows' samples (named in the message)."""
        keys = ["total"] + [k for k in self.cfg.weights if k in rewards]
        nonfinite = nonfinite_rows(rewards, len(samples), keys) & ~failed
        self.counters["reward_failed_rows"] += int(failed.sum())
        if nonfinite.any():
            self.counters["reward_nonfinite_rows"] += int(nonfinite.sum())
            bad = nonfinite.nonzero().flatten().tolist()
            which = sorted({k for k in keys if not torch.isfinite(rewards[k][nonfinite]).all()})
            ids = [sample_id(samples[i]) for i in bad[:10]]
            msg = f"non-finite reward(s) {which} for {len(bad)} row(s) of sample(s) {ids}"
            if self.cfg.on_nonfinite == "error":
                self.guard.request_stop(msg + " (reward.on_nonfinite=error)")
            else:
                log.warning("%s: dropped from their groups (reward.on_nonfinite=drop)", msg)
        return ~failed & ~nonfinite
