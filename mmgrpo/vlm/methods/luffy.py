r"""LUFFY (Yan et al. 2025, "Learning to Reason under Off-Policy Guidance", arXiv 2504.14945): off-policy expert
traces mixed into the group, trained with policy shaping (``methods.luffy``).

Each group gets its sample's ground-truth completion as one more member (the expert trace: the answer written as the
prompt asks, as TempSamp-R1 injects it; the policy samples G-1). The group advantages are computed over the mixed
group (on-policy and expert rewards together, the default group statistics). The on-policy rows keep the clipped
surrogate; an expert token :math:`t` with current probability :math:`p_t = \pi_\theta(o_t \mid \cdot)` contributes

.. math::
    \ell_t = -A \, f(p_t), \qquad f(p) = \frac{p}{p + \gamma}

(the importance ratio with the unknown expert policy taken as 1, regularised by the shaping :math:`f`, no clipping),
whose gradient :math:`-A\,\frac{\gamma}{(p+\gamma)^2}\, p\,\nabla \log p` weights low-probability expert tokens up
compared with plain :math:`-A\,p\,\nabla\log p`. Every token (on-policy and expert) enters one aggregation
(``algo.agg`` over the step's counts); the KL term (``algo.kl_coef``) applies to every row. ``gamma`` = 0.1 (the
paper's value).
"""
from __future__ import annotations

from functools import partial

import torch

from mmgrpo.vlm.methods.base import LossInputs, PolicyLoss, VLMMethod, grpo_loss
from mmgrpo.vlm.methods.tempsamp_r1 import with_ground_truth

__all__ = ["policy_shaping", "luffy_loss", "LUFFY"]


def policy_shaping(p: torch.Tensor, gamma: float) -> torch.Tensor:
    """:math:`f(p) = p / (p + \\gamma)`."""
    return p / (p + gamma)


def luffy_loss(li: LossInputs, gamma: float = 0.1):
    """The policy loss of the module docstring: :func:`grpo_loss` on the on-policy rows, :math:`-A f(p_t)` on the
    expert rows (``li.offpolicy``), aggregated together."""
    from mmgrpo.core.losses import aggregate_loss, masked_kl, masked_mean

    out = grpo_loss(li)
    if li.offpolicy is None or not bool(li.offpolicy.any()):
        return out
    a = li.algo
    maskb = li.mask.bool()
    off = li.offpolicy.bool()[:, None] & maskb
    p = li.logp.exp()
    shaped = -li.advantages.to(p.dtype)[:, None] * policy_shaping(p, gamma)
    if a.kl_coef != 0.0:
        shaped = shaped + a.kl_coef * masked_kl(li.logp, li.ref_logp, maskb, a.kl_estimator)
    per_token = torch.where(off, shaped, out.per_token_loss)
    per_token = torch.where(maskb, per_token, torch.zeros_like(per_token))
    t = li.totals
    out.loss = aggregate_loss(per_token, maskb, a.agg, li.max_len, t.get("tokens"), t.get("sequences"))
    out.per_token_loss = per_token
    with torch.no_grad():
        out.metrics["luffy/expert_prob"] = masked_mean(p.detach(), off).item()
    return out


class LUFFY(VLMMethod):
    name = "luffy"
    needs_whole_groups = True
    injected_per_group = 1  # the policy samples G-1 members; the G-th is the expert trace

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.luffy
        if not o.enabled:
            return
        if o.gamma <= 0:
            raise ValueError(f"methods.luffy.gamma must be > 0, got {o.gamma}")
        if cfg.rollout.group_size < 3:
            raise ValueError("methods.luffy needs rollout.group_size >= 3 (G-1 on-policy + 1 expert trace)")
        if cfg.methods.tempsamp_r1.enabled or cfg.methods.chord.enabled:
            raise ValueError("methods.luffy injects the ground truth itself: disable methods.tempsamp_r1 / "
                             "methods.chord")

    def after_rollout(self, rows: list[dict]) -> list[dict]:
        return with_ground_truth(self.run, rows)

    def loss(self) -> PolicyLoss:
        return PolicyLoss(fn=partial(luffy_loss, gamma=self.cfg.methods.luffy.gamma))
