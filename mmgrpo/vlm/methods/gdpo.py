r"""GDPO (Group reward-Decoupled normalization Policy Optimization, multi-reward RL) in the VLM trainer.

With M reward components :math:`R^{(m)}` (IoU, format, length, ...) and weights :math:`w_m`, plain GRPO normalises
the weighted sum, so different reward combinations collapse onto the same advantage (IoU 1 + format 0 and IoU 0
+ format 1 look alike when w = 1). GDPO normalises every component within its group first and sums afterwards,
then standardises the sum over the batch:

.. math::
    A^{(m)}_i = \frac{R^{(m)}_i-\mu^{(m)}_g}{\sigma^{(m)}_g+\epsilon},\qquad
    A'_i = \sum_m w_m A^{(m)}_i,\qquad A_i = \frac{A'_i-\text{mean}_B A'}{\text{std}_B A'+\epsilon}

The math lives in :func:`mmgrpo.core.advantages.multi_reward_advantages` (``mode="normalize_then_sum"``); this
module decides which columns of the trainer's reward dict are the components.

Choices: the components are the rewards named in ``reward.weights`` (with their weights) plus any *additive terms*
the trainer or other methods put into ``total`` (T-GRPO's ``temporal`` bonus, DAPO's ``overlong`` penalty), each
normalised as its own component with weight 1 (pass ``extra_weights`` to change that). A component that is
constant in a group contributes 0 there (:func:`group_advantages`); a group constant in every component gets
exactly 0. ``renormalize=False`` skips the batch standardisation (TRL's ``normalize_then_sum`` keeps it).
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from mmgrpo.core.advantages import AdvantageOutput, multi_reward_advantages

__all__ = ["gdpo_components", "gdpo_advantages"]


def gdpo_components(rewards: Mapping[str, Tensor], weights: Mapping[str, float],
                    extra: Mapping[str, float] | None = None) -> tuple[dict[str, Tensor], dict[str, float]]:
    """The (name -> (N,) reward) components and their weights: every ``weights`` key (must be in ``rewards``)
    plus the ``extra`` additive terms present in ``rewards``. Raises naming a weighted reward that is missing."""
    missing = [k for k in weights if k not in rewards]
    if missing:
        raise KeyError(f"gdpo: reward(s) {missing} are in reward.weights but the reward function returned only "
                       f"{sorted(rewards)}")
    comps = {k: torch.as_tensor(rewards[k]).double() for k in weights}
    w = {k: float(v) for k, v in weights.items()}
    for k, v in (extra or {}).items():
        if k in rewards and k not in comps:
            comps[k] = torch.as_tensor(rewards[k]).double()
            w[k] = float(v)
    if not comps:
        raise ValueError("gdpo needs at least one reward component (reward.weights is empty)")
    return comps, w


def gdpo_advantages(rewards: Mapping[str, Tensor], weights: Mapping[str, float], group_ids: Tensor,
                    valid: Tensor | None = None, extra: Mapping[str, float] | None = None,
                    renormalize: bool = True, **adv_kwargs) -> AdvantageOutput:
    """GDPO advantages (N,) of the components chosen by :func:`gdpo_components`; ``adv_kwargs``: scale, eps,
    unbiased, clamp (as :func:`mmgrpo.core.group_advantages`). Invalid rows get 0 and enter no statistic."""
    comps, w = gdpo_components(rewards, weights, extra)
    if valid is not None:  # a dropped row may hold NaN: keep it out of every statistic
        v = torch.as_tensor(valid, dtype=torch.bool)
        comps = {k: torch.where(v, x, torch.zeros_like(x)) for k, x in comps.items()}
        adv_kwargs["valid"] = v
    return multi_reward_advantages(comps, group_ids, weights=w, mode="normalize_then_sum",
                                   renormalize=renormalize, **adv_kwargs)


# ----------------------------------------------------------------------------------------------- trainer hook
from mmgrpo.vlm.methods.base import Estimator, VLMMethod  # noqa: E402  (the pure functions above need no trainer)

#: additive reward terms other methods put into ``total``; GDPO normalises each as its own component
ADDITIVE_TERMS = {"temporal": 1.0, "overlong": 1.0}


class GDPO(VLMMethod):
    """``methods.gdpo.enabled``: the advantage of every row is :func:`gdpo_advantages` of the reward components
    (``reward.weights`` + additive terms) instead of the group-normalised weighted total. Group statistics are
    taken on this process's whole groups; the batch standardisation sums over every process (the numbers of a
    1-process run). Every process runs the same collectives, also one without rows."""

    name = "gdpo"
    needs_whole_groups = True

    @classmethod
    def check(cls, cfg):
        if not cfg.methods.gdpo.enabled:  # called for every registered method
            return
        ts = cfg.methods.tempsamp_r1
        if ts.enabled and ts.mode != "none":
            raise ValueError("methods.gdpo normalises every reward component itself; methods.tempsamp_r1.mode="
                             f"{ts.mode!r} shapes / anchors the weighted total, which GDPO does not use. "
                             "Use methods.tempsamp_r1.mode=none with methods.gdpo")
        if cfg.methods.ngrpo.enabled:
            raise ValueError("methods.gdpo and methods.ngrpo both replace the advantage estimator; enable one")

    def advantage_estimator(self) -> Estimator:
        return Estimator(local=self._advantages)

    def _advantages(self, rb, r, kw):
        from mmgrpo.engine.dist import global_sum

        o, eps = self.cfg.methods.gdpo, kw.get("eps", 1e-4)
        valid = kw.get("valid")
        valid = torch.ones(rb.n, dtype=torch.bool) if valid is None else torch.as_tensor(valid, dtype=torch.bool)
        if rb.n:
            out = gdpo_advantages(rb.rewards, self.cfg.reward.weights, rb.group_ids, valid=valid,
                                  extra=ADDITIVE_TERMS, renormalize=False, scale=kw.get("scale", "group"), eps=eps)
        else:
            z = torch.zeros(0)
            out = AdvantageOutput(z, z.bool(), 0.0, z, z, 0)
        if not o.renormalize:
            return out
        a = out.advantages.double()
        # batch standardisation over all processes' valid rows (two passes: mean, then squared deviations)
        n = global_sum(float(valid.sum()))
        mu = global_sum(float(a[valid].sum())) / max(n, 1.0)
        ss = global_sum(float(((a - mu)[valid] ** 2).sum()))
        sd = (ss / (n - 1)) ** 0.5 if n > 1 else 0.0
        a = torch.where(valid & ~out.zero_std_mask, (a - mu) / (sd + eps), torch.zeros_like(a))
        out.advantages = a.to(torch.float32)
        return out
