"""Reward scoring in one place: every reward call of a flow run (rollout images, ODE completions of step credits,
eval images, win rates) goes through :func:`score_rewards` / :func:`finish_scores`, which validate the reward dict
and return the named tensors ``(total (N,), {component: (N,), "valid": (N,) bool})``. The fault handling of each
reward component (timeouts, retries, drop-or-stop) is :class:`ResilientReward` and the run's set of rewards is
:class:`RewardStack` (:mod:`flow_grpo.scoring`)."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

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

