r"""SAPO (Soft Adaptive Policy Optimization, Qwen, arXiv 2511.20347): ``methods.sapo.enabled=true``.

The policy loss per token is :math:`-\tfrac4\tau\sigma(\tau(\rho-1))\,A` with :math:`\tau = \tau_{pos}` (1.0) where
A > 0 and :math:`\tau_{neg}` (1.05) where A < 0 (:func:`mmgrpo.core.loss_variants.sapo_surrogate`), times the token
weights, plus the KL term, aggregated as ``algo.agg`` (TRL / EasyR1 also offer SAPO with their own aggregation).
The gate's slope is 1 at :math:`\rho = 1`, so with ``algo.num_iterations=1`` the update is GRPO's; the recipe
``configs/compare/vlm/sapo.yaml`` takes two updates per rollout.
"""
from __future__ import annotations

import functools

from mmgrpo.vlm.methods.base import PolicyLoss, VLMMethod, grpo_loss

__all__ = ["SAPO"]


def _surrogate(lr, li, tau_pos: float, tau_neg: float):
    from mmgrpo.core.loss_variants import sapo_surrogate

    return sapo_surrogate(lr, li.advantages, li.mask, tau_pos, tau_neg)


class SAPO(VLMMethod):
    name = "sapo"

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.sapo
        if not o.enabled:
            return
        if cfg.algo.loss_type != "clip":
            raise ValueError("methods.sapo replaces the clipped surrogate: it needs algo.loss_type=clip")
        if not (o.tau_pos > 0 and o.tau_neg > 0):
            raise ValueError(f"methods.sapo.tau_pos / tau_neg must be > 0, got {o.tau_pos} / {o.tau_neg}")

    def loss(self) -> PolicyLoss:
        o = self.cfg.methods.sapo
        return PolicyLoss(functools.partial(grpo_loss, surrogate=functools.partial(
            _surrogate, tau_pos=o.tau_pos, tau_neg=o.tau_neg)))
