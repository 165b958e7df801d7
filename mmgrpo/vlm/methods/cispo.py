r"""CISPO (MiniMax-M1, arXiv 2506.13585): ``methods.cispo.enabled=true``.

The policy loss per token is :math:`-\mathrm{sg}(\mathrm{clip}(\rho, r_{min}, r_{max}))\,A\,\log\pi_\theta`
(:func:`mmgrpo.core.loss_variants.cispo_surrogate`), times the token weights, plus the KL term, aggregated as
``algo.agg``: PPO's min is gone, so a token whose ratio leaves the trust region keeps its gradient with a bounded
weight instead of being switched off. With ``algo.num_iterations=1`` the ratio is 1 and the update is GRPO's (the
recipe ``configs/compare/vlm/cispo.yaml`` takes two updates per rollout for that reason).

Choices: the cap ``max_ratio`` 5.0 (TRL reads its ``epsilon_high`` as this absolute cap; MiniMax-M1 tunes it and
leaves the lower bound off: ``min_ratio`` none); the loss value uses :math:`\log\rho` for :math:`\log\pi_\theta`
(same gradient, value 0 on-policy); ``algo.ratio_level=sequence`` gives CISPO on GSPO's sequence ratio.
"""
from __future__ import annotations

import functools

from mmgrpo.vlm.methods.base import PolicyLoss, VLMMethod, grpo_loss

__all__ = ["CISPO"]


def _surrogate(lr, li, max_ratio: float, min_ratio):
    from mmgrpo.core.loss_variants import cispo_surrogate

    return cispo_surrogate(lr, li.advantages, li.mask, max_ratio, min_ratio)


class CISPO(VLMMethod):
    name = "cispo"

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.cispo
        if not o.enabled:
            return
        if cfg.algo.loss_type != "clip":
            raise ValueError("methods.cispo replaces the clipped surrogate: it needs algo.loss_type=clip")
        if not o.max_ratio > 0 or (o.min_ratio is not None and not 0 <= o.min_ratio < o.max_ratio):
            raise ValueError(f"methods.cispo needs 0 <= min_ratio < max_ratio, got {o.min_ratio} / {o.max_ratio}")

    def loss(self) -> PolicyLoss:
        o = self.cfg.methods.cispo
        return PolicyLoss(functools.partial(grpo_loss, surrogate=functools.partial(
            _surrogate, max_ratio=o.max_ratio, min_ratio=o.min_ratio)))
