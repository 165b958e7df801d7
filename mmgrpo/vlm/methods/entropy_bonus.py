r"""Entropy bonus in the policy loss (verl / EasyR1 ``entropy_coeff``; Temporal-R1's recipe: 1e-3).

.. math:: \mathcal L = \mathcal L_{policy} - c\,\bar H,\qquad
          H_{i,t} = -\sum_v \pi_\theta(v\mid o_{i,<t})\log\pi_\theta(v\mid o_{i,<t})

:math:`H_{i,t}` is the entropy of the *current* policy's sampling distribution (temperature-scaled, suppressed
ids excluded) at completion token t, computed in the training forward WITH gradient and chunked
(:func:`mmgrpo.vlm.models.chunked.token_entropy_with_grad`: at most one (chunk, V) block of logits at a time).
:math:`\bar H` aggregates it over the policy loss's tokens (the loss mask after the methods' ``on_advantages``)
with the policy loss's own aggregation (``algo.agg`` and the step's global token / sequence counts,
:func:`mmgrpo.core.losses.aggregate_loss`), and the micro-batch's share is taken like the policy loss's. With
``algo.agg=token_mean`` this is verl's ``agg_loss(entropy, response_mask, "token-mean")``. Token weights
(TW-GRPO, high-entropy masking) multiply only the policy term, not the bonus (verl has none of them).
"""
from __future__ import annotations

import torch

from mmgrpo.vlm.methods.base import VLMMethod

__all__ = ["EntropyBonus", "entropy_bonus_term"]


def entropy_bonus_term(entropy: torch.Tensor, mask: torch.Tensor, coef: float, kw: dict) -> torch.Tensor:
    """``-coef * aggregate_loss(entropy, mask, ...)`` with the policy loss's aggregation settings ``kw`` (``agg``,
    ``max_len``, ``num_tokens``, ``num_sequences``)."""
    from mmgrpo.core.losses import aggregate_loss

    hbar = aggregate_loss(entropy, mask, kw.get("agg", "token_mean"), kw.get("max_len"), kw.get("num_tokens"),
                          kw.get("num_sequences"))
    return -coef * hbar


class EntropyBonus(VLMMethod):
    """``methods.entropy_bonus.coef`` > 0: subtract ``coef`` x the aggregated current-policy entropy from every
    micro-batch's loss (``on_loss`` hook); logs ``entropy_bonus/entropy`` (token mean of the entropy over
    the loss tokens of the step's updates)."""

    name = "entropy_bonus"
    needs_train_logits = True

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.coef = float(cfg.methods.entropy_bonus.coef)
        self.chunk = max(1, cfg.algo.logprob_chunk_size or 1024)
        self._sum = self._n = 0.0

    def on_loss(self, li, loss):
        from mmgrpo.vlm.models.chunked import token_entropy_with_grad

        ent = token_entropy_with_grad(li.logits, li.mask, self.chunk)
        mf = li.mask.to(ent.dtype)
        self._sum += float((ent.detach() * mf).sum())
        self._n += float(mf.sum())
        kw = dict(agg=li.algo.agg, max_len=li.max_len, num_tokens=li.totals["tokens"],
                  num_sequences=li.totals["sequences"])
        return loss + entropy_bonus_term(ent, li.mask, self.coef, kw)

    def end_of_step(self, rb, m):
        if self._n:
            m["entropy_bonus/entropy"] = self._sum / self._n
        self._sum = self._n = 0.0
