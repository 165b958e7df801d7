r"""BNPO (Beta Normalization Policy Optimization, Xiao et al. 2025, arXiv 2506.02864): ``methods.bnpo.enabled=true``.

The advantage of completion i of group g is :math:`(s_i - p_g)/f(p_g;\alpha,\beta)`: s the reward mapped to [0, 1]
(``min_reward`` / ``max_reward``), :math:`p_g` the group's mean (success rate), f the density of Beta(α, β) with
:math:`\alpha = \max(1+a/3, 1)`, :math:`\beta=\max(1+b/3,1)` and (a, b) the method-of-moments Beta fit of the step's
success rates (:func:`mmgrpo.core.advantage_variants.bnpo_advantages`, on the batch gathered over processes). The
release's choices are kept (1/f capped at 1e6; a group of one member has p = 0; the affine map for non-binary
rewards). Not BNPO: ``algo.agg=local_token_mean``, which TRL calls ``bnpo``.

Set ``max_reward`` to the task's largest weighted total (the demo: IoU 1 + 0.1 x format 1 = 1.1): a reward outside
the range is an error, not a silent clip.
"""
from __future__ import annotations

from mmgrpo.vlm.methods.base import Estimator, VLMMethod

__all__ = ["BNPO"]


class BNPO(VLMMethod):
    name = "bnpo"

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.bnpo
        if not o.enabled:
            return
        if not o.max_reward > o.min_reward:
            raise ValueError(f"methods.bnpo needs max_reward > min_reward, got {o.min_reward} / {o.max_reward}")
        if not o.max_weight > 0:
            raise ValueError(f"methods.bnpo.max_weight must be > 0, got {o.max_weight}")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.params = (float("nan"), float("nan"))

    def _gathered(self, rewards, group_ids, scale=None, eps=None, valid=None):
        from mmgrpo.core.advantage_variants import bnpo_advantages

        o = self.cfg.methods.bnpo
        out = bnpo_advantages(rewards, group_ids, valid=valid, min_reward=o.min_reward, max_reward=o.max_reward,
                              max_weight=o.max_weight)
        self.params = out.beta_params
        return out

    def advantage_estimator(self) -> Estimator:
        return Estimator(gathered=self._gathered)

    def end_of_step(self, rb, metrics: dict) -> None:
        metrics["bnpo/alpha"], metrics["bnpo/beta"] = self.params
