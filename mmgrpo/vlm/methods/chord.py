r"""CHORD (Zhang et al. 2025, "On-Policy RL Meets Off-Policy Experts: Harmonizing Supervised Fine-Tuning and
Reinforcement Learning via Dynamic Weighting", arXiv 2508.11408): SFT on expert traces as an annealed auxiliary loss
of the on-policy RL loss, with token weights (``methods.chord``).

Each group gets its sample's ground-truth completion as one more row (the expert trace; the policy samples G-1). The
expert rows take no part in the group advantages (their advantage is 0, the group statistics are the on-policy
rows'). The step's loss is

.. math::
    \mathcal L = (1-\mu_t)\,\mathcal L_{RL} + \mu_t\,\mathcal L_{SFT}, \qquad
    \mathcal L_{SFT} = -\frac{1}{|E|}\sum_{t \in E} \phi(p_t)\,\log p_t, \qquad \phi(p) = p\,(1-p)

with :math:`\mathcal L_{RL}` the default policy loss on the on-policy rows alone (``algo.agg`` over their counts), E
the step's expert tokens, :math:`p_t` the current probability of expert token t and :math:`\phi` held constant in the
gradient (CHORD-:math:`\phi`: tokens the policy already predicts, p near 1, and tokens far from it, p near 0, weigh
little; ``token_weight=none`` gives plain SFT, CHORD-:math:`\mu`). The global coefficient anneals from imitation to
exploration:

.. math::
    \mu_t = \mu_{peak}\,\frac{t}{W} \ (t < W), \qquad
    \mu_t = \mu_{valley} + (\mu_{peak} - \mu_{valley})\,\tfrac12\big(1 + \cos(\pi\,\tfrac{t - W}{D})\big)
    \ (W \le t < W + D), \qquad \mu_t = \mu_{valley} \ (t \ge W + D)

(t: the optimizer step, W = ``warmup_steps``, D = ``decay_steps``). Metrics: ``chord/mu``, ``chord/sft_loss``,
``chord/phi_mean``.
"""
from __future__ import annotations

import dataclasses
import math
from functools import partial

import torch

from mmgrpo.vlm.methods.base import Estimator, LossInputs, PolicyLoss, VLMMethod, grpo_loss
from mmgrpo.vlm.methods.tempsamp_r1 import with_ground_truth

__all__ = ["chord_mu", "chord_phi", "chord_loss", "CHORD"]


def chord_mu(step: int, peak: float, valley: float, warmup: int, decay: int) -> float:
    """:math:`\\mu_t` of the module docstring."""
    if step < warmup:
        return peak * step / warmup
    t = step - warmup
    if decay <= 0 or t >= decay:
        return valley
    return valley + (peak - valley) * 0.5 * (1.0 + math.cos(math.pi * t / decay))


def chord_phi(p: torch.Tensor) -> torch.Tensor:
    """:math:`\\phi(p) = p(1-p)`."""
    return p * (1.0 - p)


def chord_loss(li: LossInputs, mu: float, token_weight: str = "phi"):
    """:math:`(1-\\mu)\\mathcal L_{RL}` (on-policy rows, their own counts) :math:`+ \\mu \\mathcal L_{SFT}` (expert
    rows, ``li.offpolicy``, mean over the step's expert tokens ``totals["offpolicy_tokens"]``)."""
    maskb = li.mask.bool()
    off_rows = li.offpolicy.bool() if li.offpolicy is not None else torch.zeros(maskb.shape[0], dtype=torch.bool,
                                                                                 device=maskb.device)
    on_mask = maskb & ~off_rows[:, None]
    off_mask = maskb & off_rows[:, None]
    t = dict(li.totals)
    n_off = t.get("offpolicy_tokens", float(off_mask.sum()))
    if "tokens" in t:
        t["tokens"] = t["tokens"] - n_off
    if "sequences" in t:
        t["sequences"] = t["sequences"] - t.get("offpolicy_sequences", float((off_mask.sum(1) > 0).sum()))
    rl = grpo_loss(dataclasses.replace(li, mask=on_mask.to(li.mask.dtype), totals=t))
    p = li.logp.exp().detach()
    w = chord_phi(p) if token_weight == "phi" else torch.ones_like(p)
    sft_tok = torch.where(off_mask, -w * li.logp, torch.zeros_like(li.logp))
    sft = sft_tok.sum() / max(float(n_off), 1.0)
    rl.loss = (1.0 - mu) * rl.loss + mu * sft
    with torch.no_grad():
        rl.metrics["chord/sft_loss"] = float(sft)
        rl.metrics["chord/phi_mean"] = float(w[off_mask].mean()) if bool(off_mask.any()) else 0.0
    return rl


class CHORD(VLMMethod):
    name = "chord"
    needs_whole_groups = True
    injected_per_group = 1
    trains_without_advantages = True  # the SFT term

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.chord
        if not o.enabled:
            return
        if not (0.0 <= o.mu_valley <= 1.0 and 0.0 <= o.mu_peak <= 1.0) or o.warmup_steps < 0 or o.decay_steps < 0:
            raise ValueError("methods.chord: need 0 <= mu_valley, mu_peak <= 1 and warmup_steps, decay_steps >= 0")
        if cfg.rollout.group_size < 3:
            raise ValueError("methods.chord needs rollout.group_size >= 3 (G-1 on-policy + 1 expert trace)")
        if cfg.methods.tempsamp_r1.enabled:
            raise ValueError("methods.chord injects the ground truth itself: disable methods.tempsamp_r1")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.o = cfg.methods.chord

    @property
    def mu(self) -> float:
        o = self.o
        return chord_mu(self.run.state.step, o.mu_peak, o.mu_valley, o.warmup_steps, o.decay_steps)

    def after_rollout(self, rows: list[dict]) -> list[dict]:
        return with_ground_truth(self.run, rows)

    def advantage_estimator(self) -> Estimator:
        return Estimator(local=self._on_policy_advantages)

    @staticmethod
    def _on_policy_advantages(rb, rewards, kw):
        """Group advantages of the on-policy rows only (the expert rows: not valid here, advantage 0)."""
        from mmgrpo.core import group_advantages

        return group_advantages(rewards, rb.group_ids, scale=kw["scale"], eps=kw["eps"],
                                valid=kw["valid"] & ~rb.is_offpolicy)

    def loss(self) -> PolicyLoss:
        return PolicyLoss(fn=self._loss)

    def _loss(self, li: LossInputs):
        self._used = self.mu  # state.step = the optimizer steps taken before this one
        return chord_loss(li, self._used, self.o.token_weight)

    def end_of_step(self, rb, metrics: dict) -> None:
        metrics["chord/mu"] = getattr(self, "_used", self.mu)  # the mu this step trained with
