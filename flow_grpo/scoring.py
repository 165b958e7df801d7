"""Reward scoring in one place: every reward call of a flow run (rollout images, ODE completions of step credits,
eval images, win rates) goes through the run's :class:`RewardStack` (each component wrapped in
:class:`ResilientReward`: timeout, retries, drop-or-stop, non-finite policy) and :func:`finish_scores`, which
validates the reward dict and returns the named tensors ``(total (N,), {component: (N,), "valid": (N,) bool})``.
Pref-GRPO's win rates replace the totals in :func:`apply_win_rates`."""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Callable, Optional, Sequence

import torch

from flow_grpo.rewards import Reward
from flow_grpo.rewards.base import check_finite_numpy, check_shapes
from mmgrpo.engine.dist import gather_rows, process_group
from mmgrpo.engine.errors import RewardCallFailed, RewardTimeout
from mmgrpo.engine.reward_calls import CallStats, RetryPolicy, call_with_retries
from mmgrpo.utils.logging import get_logger

from .distributed import sync_failure

log = get_logger("flow_grpo.scoring")

RewardFn = Callable[..., dict]


def _total_reward(scores: dict, weights: Optional[dict]) -> torch.Tensor:
    if not scores:
        raise ValueError("reward function returned no scores")
    if weights:
        missing = [k for k in weights if k not in scores]
        if missing:
            raise KeyError(f"reward weights name {missing} but the reward returned {sorted(scores)}")
        return sum(float(w) * torch.as_tensor(scores[k], dtype=torch.float32) for k, w in weights.items())
    for key in ("total", "avg"):
        if key in scores:
            return torch.as_tensor(scores[key], dtype=torch.float32)
    if len(scores) == 1:
        return torch.as_tensor(next(iter(scores.values())), dtype=torch.float32)
    raise ValueError(f"reward returned several components {sorted(scores)}: give reward weights")


def score_rewards(reward_fn: RewardFn, images, prompts, metadata, weights=None) -> tuple[torch.Tensor, dict]:
    """Call the typed reward ``fn(images_uint8_nhwc, prompts, metadata) -> dict[name, (N,)]``; returns the
    weighted total (N,) fp32 and the components. The total is ``sum_k weights[k] * scores[k]`` if ``weights`` is
    given, else ``scores["total"]`` (MultiReward), ``scores["avg"]`` or the single score. An optional bool
    ``"valid"`` entry (a reward built with ``nan_policy="drop"``) marks samples to leave out: their total is set to 0
    and ``components["valid"]`` is returned. A non-finite total of a valid sample raises with the sample indices."""
    return finish_scores(dict(reward_fn(images, list(prompts), list(metadata))), len(prompts), weights)


def merge_scores(parts: Sequence[dict], sizes: Sequence[int]) -> dict:
    """Concatenate per-chunk reward dicts along the batch. A chunk without ``"valid"`` counts as all valid; other
    keys missing from some chunk (e.g. diagnostics of a reward whose call was dropped) are left out."""
    if len(parts) == 1:
        return dict(parts[0])
    keys = set(parts[0])
    for p in parts[1:]:
        keys &= set(p)
    out = {k: torch.cat([torch.as_tensor(p[k]).reshape(-1).cpu() for p in parts]) for k in sorted(keys - {"valid"})}
    if any("valid" in p for p in parts):
        out["valid"] = torch.cat([torch.as_tensor(p["valid"]).reshape(-1).bool().cpu() if "valid" in p
                                  else torch.ones(n, dtype=torch.bool) for p, n in zip(parts, sizes)])
    return out


def finish_scores(scores: dict, n: int, weights: Optional[dict] = None) -> tuple[torch.Tensor, dict]:
    """Validate a reward dict for ``n`` samples and compute the total (see :func:`score_rewards`)."""
    scores = dict(scores)
    valid = scores.pop("valid", None)
    valid = torch.ones(n, dtype=torch.bool) if valid is None else torch.as_tensor(valid).reshape(-1).bool().cpu()
    scores = {k: torch.as_tensor(v, dtype=torch.float32).reshape(-1).cpu() for k, v in scores.items()}
    for k, v in list(scores.items()) + [("valid", valid)]:
        if v.shape[0] != n:
            raise ValueError(f"reward component {k!r} has {v.shape[0]} values for {n} images")
    total = _total_reward(scores, weights)
    bad = torch.nonzero(~torch.isfinite(total) & valid).flatten().tolist()
    if bad:
        raise ValueError(f"non-finite reward for samples {bad[:20]}")
    total = torch.where(valid, total, torch.zeros_like(total))
    scores["valid"] = valid
    return total, scores



def _timeout_error(name: str) -> Callable[[float], BaseException]:
    return lambda timeout: RewardTimeout(f"reward {name!r} did not return within {timeout:g} s")


class ResilientReward(Reward):
    """One reward component with fault handling (issue "Reliability").

    Each call is tried ``1 + retries`` times; an attempt fails if the reward raises or exceeds ``timeout``
    seconds; attempt k+1 starts ``backoff * 2**k`` s after attempt k failed. If every attempt fails:
    ``on_failure="drop"`` returns score 0 with ``valid=False`` for every sample of the call (counted in
    ``counters["dropped"]``, logged), ``"stop"`` raises :class:`RewardCallFailed`.

    An output with the wrong number of scores (or not numeric) counts as a failed attempt, like an exception.
    Non-finite scores are not retried (they are not transient): they follow ``nan_policy`` ("drop" ->
    ``valid=False``; "raise" -> ``RewardError``). The wrapped reward's own ``nan_policy`` is bypassed (its
    ``score`` is called directly) so that this policy applies to every component alike. Output keys of a reward
    whose ``name`` differs from the config key are renamed to the config key (``R -> key``, ``R/aux -> key/aux``).
    """

    def __init__(self, fn: Callable, name: str, retries: int = 2, backoff: float = 1.0, timeout: float = 0.0,
                 on_failure: str = "drop", nan_policy: str = "drop"):
        super().__init__(name=name, nan_policy=nan_policy)
        if on_failure not in ("drop", "stop"):
            raise ValueError(f"on_failure must be 'drop' or 'stop', got {on_failure!r}")
        if retries < 0 or backoff < 0 or timeout < 0:
            raise ValueError("reward retries, retry_backoff and timeout must be >= 0")
        self.fn = fn
        # videos pass through a plain callable or a video reward; an image Reward is refused by MultiReward
        self.accepts_video = not isinstance(fn, Reward) or fn.accepts_video
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.timeout = float(timeout)
        self.on_failure = on_failure
        self.stats = CallStats()  # calls / retries / timeouts / failures, counted by the shared retry policy
        self.dropped = 0
        self._lock = self.stats.lock

    @property
    def counters(self) -> dict[str, int]:
        """A snapshot: calls, retries, timeouts, failed_calls, dropped (samples of dropped calls)."""
        st = self.stats
        with self._lock:
            return {"calls": st.calls, "retries": st.retries, "timeouts": st.timeouts, "failed_calls": st.failures,
                    "dropped": self.dropped}

    def _raw(self, imgs, prompts, md, **kw):
        if isinstance(self.fn, Reward):
            return self.fn.score(imgs, prompts, md, **kw)
        return self.fn(imgs, prompts, md, **kw)

    def _rename(self, raw: Any) -> Any:
        if not isinstance(raw, Mapping):
            return {self.name: raw}
        own = getattr(self.fn, "name", None)
        if not own or own == self.name or self.name in raw:
            return raw
        out = {}
        for k, v in raw.items():
            if k == own:
                k = self.name
            elif k.startswith(own + "/"):
                k = self.name + k[len(own):]
            out[k] = v
        return out

    def _evaluate(self, imgs, prompts, md, **kw):
        import numpy as np

        n = imgs.shape[0]

        def warn(attempt: int, exc: BaseException, wait: Optional[float]) -> None:
            log.warning("reward %r: attempt %d/%d failed: %s: %s", self.name, attempt + 1, self.retries + 1,
                        type(exc).__name__, exc)

        def failed(attempts: int, last: BaseException) -> str:
            return f"reward {self.name!r} failed {attempts} time(s) on a batch of {n}: {type(last).__name__}: {last}"

        try:  # an output with the wrong number of scores fails its attempt (``check``), it does not crash
            raw = call_with_retries(
                lambda: self._raw(imgs, prompts, md, **kw), RetryPolicy(self.retries, self.backoff, self.timeout),
                stats=self.stats, check=lambda out: check_shapes(self._rename(out), n, self.name),
                on_attempt_failed=warn, timeout_error=_timeout_error(self.name), timeout_type=RewardTimeout,
                failure_message=failed, thread_name=f"reward-{self.name}", sleep=time.sleep)
        except RewardCallFailed as exc:
            if self.on_failure == "stop":
                raise RewardCallFailed(f"{exc} (reward.on_failure=stop)") from exc.__cause__
            with self._lock:
                self.dropped += n
            log.error("%s; dropping its %d samples (reward.on_failure=drop)", exc, n)
            return {self.name: np.zeros(n, dtype=np.float32), "valid": np.zeros(n, dtype=bool)}
        return check_finite_numpy(self._rename(raw), n, self.name, self.nan_policy)


def _import_factory(spec: str) -> Callable:
    from mmgrpo.utils.plugins import import_object  # the plugin mechanism both front-ends share

    mod, _, attr = spec.partition(":")
    if not mod or not attr:
        raise ValueError(f"reward.pairwise_scorer must be 'package.module:factory', got {spec!r}")
    return import_object(spec, "reward.pairwise_scorer")


class RewardStack:
    """The trainer's rewards: ``pointwise`` (a :class:`~flow_grpo.rewards.MultiReward` over the resilient
    components; ``out["total"] = sum_k w_k r_k``) and, in ``win_rate`` mode, ``pairwise`` (a resilient
    :class:`~flow_grpo.rewards.PairwisePreferenceReward`, called with explicit ``group_ids``).

    ``components``: optional ``{name: reward callable}`` instead of ``build_reward(name, **kwargs[name])`` for
    every name of ``weights`` (weights of injected names default to 1)."""

    def __init__(self, rc, components: Optional[Mapping[str, Callable]] = None):
        from flow_grpo.rewards import MultiReward, PairwisePreferenceReward, ScoreComparator, build_reward

        nan_policy = {"drop": "drop", "error": "raise"}[rc.on_nonfinite]  # config word -> flow_grpo.rewards
        if components is None:
            unknown = set(rc.kwargs) - set(rc.weights) - {"win_rate"}
            if unknown:
                raise ValueError(f"reward.kwargs for rewards without a weight: {sorted(unknown)}")
            comps = {k: build_reward(k, **dict(rc.kwargs.get(k, {}))) for k in rc.weights}
            weights = {k: float(w) for k, w in rc.weights.items()}
        else:
            if not isinstance(components, Mapping):
                raise TypeError(f"reward components must be a {{name: reward}} mapping, got {type(components).__name__}")
            comps = dict(components)
            weights = {k: float(rc.weights.get(k, 1.0)) for k in comps}
        if not comps:
            raise ValueError("no rewards: set reward.weights")
        kw = dict(retries=rc.retries, backoff=rc.retry_backoff, timeout=rc.timeout, on_failure=rc.on_failure,
                  nan_policy=nan_policy)
        self.mode = rc.mode
        self.weights = weights
        self.wrapped = {k: ResilientReward(fn, k, **kw) for k, fn in comps.items()}
        self.pointwise = MultiReward(weights, mode="per_reward" if rc.mode == "per_reward" else "weighted_sum",
                                     rewards=self.wrapped, nan_policy=nan_policy)
        self.pairwise = None
        if rc.mode == "win_rate":
            scorer = (_import_factory(rc.pairwise_scorer)(**dict(rc.kwargs.get("win_rate", {})))
                      if rc.pairwise_scorer else ScoreComparator(self.pointwise, key="total"))
            pref = PairwisePreferenceReward(scorer, name="win_rate", symmetric=rc.pairwise_symmetric,
                                            nan_policy=nan_policy)
            self.pairwise = ResilientReward(pref, "win_rate", **kw)
        self._seen = self._totals()

    def _totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in list(self.wrapped.values()) + ([self.pairwise] if self.pairwise is not None else []):
            for k, v in w.counters.items():  # a consistent snapshot of each reward's counters
                out[k] = out.get(k, 0) + v
        return out

    def take_counters(self) -> dict[str, int]:
        """Counter increments (calls, retries, timeouts, failed_calls, dropped) since the previous call."""
        now = self._totals()
        delta = {k: now[k] - self._seen.get(k, 0) for k in now}
        self._seen = now
        return delta


def apply_win_rates(traj, pairwise, prompts: list, meta: list, rank: int, world: int, device,
                    win_rate_weight: float = 1.0, pointwise_weight: float = 0.0) -> None:
    """Pref-GRPO: replace ``traj.rewards["total"]`` by the pairwise win rate of each valid sample inside its group
    (``pairwise``: the :class:`RewardStack`'s resilient pairwise reward), combined with the pointwise total as
    ``win_rate_weight * win_rate + pointwise_weight * pointwise_total`` (reward.win_rate_weight /
    reward.pointwise_weight; Pref-GRPO's CLIP term: a reward-level weighted sum, then the usual group
    normalisation). Groups may be split across processes:
    images are gathered, each process judges the groups ``sorted(gids)[rank::world]`` and the win rates are summed
    back (each sample is judged by one process). ``prompts`` / ``meta``: those of the gathered batch."""
    valid = traj.rewards["valid"]
    (imgs, gids, v), sl = gather_rows([traj.images, traj.group_ids, valid], device)
    n_all = gids.shape[0]
    owned = set(torch.unique(gids).tolist()[rank::world])
    idx = [i for i in range(n_all) if bool(v[i]) and int(gids[i]) in owned]
    wr = torch.zeros(n_all, dtype=torch.float64)
    bad = torch.zeros(n_all, dtype=torch.float64)
    err = None
    if idx:
        try:
            out = pairwise(imgs[idx], [prompts[i] for i in idx], [meta[i] for i in idx], group_ids=gids[idx].tolist())
            ok = torch.as_tensor(out.get("valid", torch.ones(len(idx), dtype=torch.bool))).bool()
            wr[idx] = torch.as_tensor(out["win_rate"]).double()
            bad[idx] = (~ok).double()
        except RewardCallFailed as exc:
            err = exc
    sync_failure(err)
    d = process_group()
    if d is not None:
        t = torch.stack([wr, bad]).to(device)
        d.all_reduce(t)
        wr, bad = t.cpu()[0], t.cpu()[1]
    new_valid = valid & (bad[sl] == 0)
    traj.rewards["pointwise_total"] = traj.rewards["total"]
    traj.rewards["win_rate"] = wr[sl].float()
    traj.rewards["valid"] = new_valid
    total = float(win_rate_weight) * wr[sl].float()
    if pointwise_weight:
        total = total + float(pointwise_weight) * traj.rewards["pointwise_total"].float()
    traj.rewards["total"] = torch.where(new_valid, total, torch.zeros(len(traj)))
