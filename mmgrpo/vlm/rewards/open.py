"""Open rewards for ``mmgrpo train``: ``reward.weights`` may name, besides the built-in rewards of
:mod:`mmgrpo.vlm.rewards.registry`,

* ``judge``: the model-based judge of free-form answers (:mod:`mmgrpo.vlm.rewards.judge`, options
  ``reward.kwargs.judge.*``);
* ``remote``: a text reward (the judge) served by :mod:`mmgrpo.vlm.rewards.server`
  (:mod:`mmgrpo.vlm.rewards.remote`, options ``reward.kwargs.remote.*``: ``url``, ``timeout``, ``retries``, ...);
* **your own reward by import path**, ``'package.module:factory'`` (the flow front-end's plugin mechanism,
  :mod:`mmgrpo.utils.plugins`): ``factory(**reward.kwargs['package.module:factory'])`` is called once at setup and
  returns the reward, a callable with this signature::

      reward(completions: list[str], samples: list[dict]) -> scores
          completions: the N decoded completions of the step's rows (group members are adjacent);
          samples:     the N canonical samples they answer (fields: mmgrpo.vlm.rewards.tasks);
          scores:      N floats (list, tuple, numpy or torch (N,)), or a dict with key "score" (N floats) and any
                       diagnostics "<key>": (N,) (logged as reward/<key>, never trained on).

  A NaN score drops its row (``reward.on_nonfinite``); a call that raises or times out is retried then dropped
  (``reward.retries`` / ``timeout`` / ``on_failure``), as for every reward. **This imports and runs your code**:
  the module's top level on import, the factory and the reward at every step. A config holding an import path is
  code: only run configs and overrides you trust.

``total = sum_k w_k r_k`` over every weighted reward, built-in or not. The built-in rewards keep their checks and
``parse_failed`` (a run with only open rewards has no task parser: ``parse_failed`` is all False).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

from mmgrpo.utils.plugins import import_object, is_import_path

__all__ = ["OPEN_REWARDS", "OpenRewardFn", "is_open_reward", "split_weights", "build_open_rewards"]

# built-in open rewards: name -> factory (import path, loaded only when weighted)
OPEN_REWARDS: dict[str, str] = {"judge": "mmgrpo.vlm.rewards.judge:JudgeReward",
                                  "remote": "mmgrpo.vlm.rewards.remote:RemoteTextReward"}


def is_open_reward(name: str) -> bool:
    return name in OPEN_REWARDS or is_import_path(name)


def split_weights(weights: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """(built-in registry rewards, open rewards) of ``reward.weights``."""
    builtin = {k: float(w) for k, w in weights.items() if not is_open_reward(k)}
    return builtin, {k: float(w) for k, w in weights.items() if is_open_reward(k)}


def build_open_rewards(names: Sequence[str], kwargs: Mapping[str, Mapping[str, Any]]) -> dict[str, Callable]:
    """``{name: reward}``: each open reward's factory called with ``reward.kwargs[name]``."""
    unknown = sorted(set(kwargs) - set(names))
    if unknown:
        raise ValueError(f"reward.kwargs has {unknown}, which reward.weights does not weight (open rewards: "
                         f"{sorted(names)})")
    out = {}
    for name in names:
        spec = OPEN_REWARDS.get(name, name)
        factory = import_object(spec, f"reward.weights key {name!r}")
        kw = dict(kwargs.get(name) or {})
        try:
            out[name] = factory(**kw)
        except TypeError as e:
            raise ValueError(f"reward.kwargs.{name}: {e}") from e
        if not callable(out[name]):
            raise ValueError(f"reward.weights key {name!r}: the factory returned {type(out[name]).__name__}, not a "
                             "callable reward(completions, samples)")
    return out


def _scores(name: str, raw: Any, n: int) -> tuple[list[float], dict[str, list[float]]]:
    """(scores, diagnostics) of one open reward's output, checked to hold N values each."""
    extra: dict[str, list[float]] = {}
    if isinstance(raw, Mapping):
        if "score" not in raw:
            raise ValueError(f"reward {name!r} returned a dict without 'score' (keys {sorted(raw)})")
        extra = {k: _floats(name, k, v, n) for k, v in raw.items() if k != "score"}
        raw = raw["score"]
    return _floats(name, "score", raw, n), extra


def _floats(name: str, key: str, v: Any, n: int) -> list[float]:
    if hasattr(v, "tolist"):
        v = v.tolist()
    try:
        vals = [float(x) for x in v]
    except (TypeError, ValueError) as e:
        raise ValueError(f"reward {name!r} returned {key!r} that is not N numbers: {e}") from e
    if len(vals) != n:
        raise ValueError(f"reward {name!r} returned {len(vals)} {key!r} values for {n} completions")
    return vals


def score_tensors(lists: Mapping[str, list]) -> dict[str, Any]:
    """A ``score()`` result as the trainer takes it (both the built-in ``RewardFn`` and :class:`OpenRewardFn`):
    float32 tensors, ``parse_failed`` a bool tensor. Here, not in ``registry``, because ``registry`` imports this
    module."""
    import torch  # only at the trainer boundary

    res = {k: torch.tensor(v, dtype=torch.float32) for k, v in lists.items() if k != "parse_failed"}
    res["parse_failed"] = torch.tensor(lists["parse_failed"], dtype=torch.bool)
    return res


class OpenRewardFn:
    """The run's reward: the built-in :class:`~mmgrpo.vlm.rewards.registry.RewardFn` (or None) plus the open rewards;
    ``score`` returns lists, ``__call__`` tensors, like ``RewardFn``."""

    def __init__(self, builtin: Optional[Any], open_rewards: Mapping[str, Callable], weights: Mapping[str, float]):
        self.builtin, self.open = builtin, dict(open_rewards)
        self.weights = dict(weights)
        #: rewards a ground truth need not score 1 on (``mmgrpo check``)
        self.unchecked = tuple(self.open)

    @property
    def names(self) -> list[str]:
        return list(self.weights)

    def score(self, completions: Sequence[Any], samples: Sequence[Mapping[str, Any]]) -> dict[str, list]:
        from .parsing import completion_text

        n = len(completions)
        if n != len(samples):
            raise ValueError(f"{n} completions but {len(samples)} samples")
        if self.builtin is not None:
            out = self.builtin.score(completions, samples)
        else:
            out = {"total": [0.0] * n, "parse_failed": [False] * n}
        texts = [completion_text(c) or "" for c in completions]
        for name, fn in self.open.items():
            vals, extra = _scores(name, fn(texts, samples), n)
            out[name] = vals
            w = self.weights[name]
            out["total"] = [t + w * v if w else t for t, v in zip(out["total"], vals)]  # NaN drops the row
            for k, v in extra.items():
                out[k if k.startswith(f"{name}/") or "/" in k else f"{name}/{k}"] = v
        return out

    def __call__(self, completions: Sequence[Any], samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return score_tensors(self.score(completions, samples))

    def __repr__(self) -> str:
        return f"OpenRewardFn(builtin={self.builtin!r}, open={list(self.open)}, weights={self.weights})"

