r"""DHPO (Dynamic Hybrid Policy Optimization, "Orchestrating Tokens and Sequences"): ``methods.dhpo.enabled=true``.

One clipped surrogate on the mix :math:`w\rho_t + (1-w)s` of the token ratio and GSPO's sequence ratio, each
clipped in its own trust region before mixing (:func:`mmgrpo.core.loss_variants.dhpo_surrogate`): token bounds
``algo.clip_low`` / ``clip_high``, sequence bounds ``seq_clip_low`` / ``seq_clip_high`` (GSPO's 3e-4 / 4e-4).

Deviation: the paper's averaging variant only (``token_weight`` w = 0.5); its entropy-guided per-token weights are
not implemented (they need the policy's entropy in the loss). With ``algo.num_iterations=1`` both ratios are 1 and
the update is GRPO's; the recipe ``configs/compare/vlm/dhpo.yaml`` takes two updates per rollout.
"""
from __future__ import annotations

import functools

from mmgrpo.vlm.methods.base import PolicyLoss, VLMMethod, grpo_loss

__all__ = ["DHPO"]


def _surrogate(lr, li, token_weight: float, seq_clip_low: float, seq_clip_high: float):
    from mmgrpo.core.loss_variants import dhpo_surrogate

    a = li.algo
    return dhpo_surrogate(lr, li.advantages, li.mask, token_weight, a.clip_low, a.clip_high, seq_clip_low,
                          seq_clip_high)


class DHPO(VLMMethod):
    name = "dhpo"

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.dhpo
        if not o.enabled:
            return
        if cfg.algo.loss_type != "clip" or cfg.algo.ratio_level != "token":
            raise ValueError("methods.dhpo mixes the token and sequence ratios itself: it needs algo.loss_type=clip "
                             "and algo.ratio_level=token")
        if not 0.0 <= o.token_weight <= 1.0:
            raise ValueError(f"methods.dhpo.token_weight must be in [0, 1], got {o.token_weight}")

    def loss(self) -> PolicyLoss:
        o = self.cfg.methods.dhpo
        return PolicyLoss(functools.partial(grpo_loss, surrogate=functools.partial(
            _surrogate, token_weight=o.token_weight, seq_clip_low=o.seq_clip_low, seq_clip_high=o.seq_clip_high)))
