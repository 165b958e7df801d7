r"""DRPO (Decoupled Reward Policy Optimization, "Efficient Reasoning via Decoupled Reward PO"): ``methods.drpo``.

A length penalty folded into the reward before GRPO's normalisation can give a correct but long answer a negative
advantage (it scores below the group mean once the wrong answers are in the mean): the policy is then pushed away
from right answers. DRPO decouples the two: the length signal of correct completions is normalised **only within
the group's correct subset**, and it re-weights their (positive) learning signal instead of competing with the
wrong ones. DRPO derives the weights from the KL-regularised target over the positives,
:math:`\pi^*(o) \propto \pi_{old}(o)\,e^{r_{len}(o)/\tau}`, estimated on the sampled positives by self-normalised
importance weights. Here, for the positive subset P of a group (correct and :math:`A_i > 0`) with lengths
:math:`L_i`:

.. math::
    z_i = \frac{L_i - \bar L_P}{\sigma_P},\qquad w_i = |P|\,\frac{e^{-z_i/\tau}}{\sum_{j\in P} e^{-z_j/\tau}},
    \qquad A_i \leftarrow w_i A_i

so the weights average 1 over P (the positives' total signal is GRPO's), shorter correct answers get more of it,
and every correct answer keeps a positive advantage. Rows outside P are unchanged; |P| < 2 or equal lengths: w = 1.

Choices (the notes give the principle, not the paper's full estimator): the length reward is the within-subset
z-score (population std), ``temperature`` τ = 1; correctness is the accuracy reward at least ``threshold``; applied
in ``on_advantages`` (after the group advantages, before DAPO's filter by registry order).
"""
from __future__ import annotations

import torch
from torch import Tensor

from mmgrpo.vlm.methods.base import VLMMethod

__all__ = ["DRPO", "drpo_weights"]


def drpo_weights(lengths: Tensor, correct: Tensor, advantages: Tensor, group_ids: Tensor, rows: Tensor | None = None,
                 temperature: float = 1.0) -> Tensor:
    """(N,) float32 weights of the module docstring (1 outside each group's positive subset)."""
    if not temperature > 0:
        raise ValueError(f"DRPO temperature must be > 0, got {temperature}")
    L = torch.as_tensor(lengths, dtype=torch.float64)
    ok = torch.as_tensor(correct, dtype=torch.bool)
    adv = torch.as_tensor(advantages, dtype=torch.float64)
    gids = torch.as_tensor(group_ids)
    part = torch.ones_like(ok) if rows is None else torch.as_tensor(rows, dtype=torch.bool)
    w = torch.ones_like(L)
    pos = ok & (adv > 0) & part
    for g in torch.unique(gids[pos]).tolist():
        idx = torch.nonzero((gids == g) & pos).flatten()
        x = L[idx]
        sd = x.std(unbiased=False)
        if idx.numel() < 2 or float(sd) == 0.0:
            continue
        z = (x - x.mean()) / sd
        w[idx] = idx.numel() * torch.softmax(-z / temperature, dim=0)
    return w.to(torch.float32)


class DRPO(VLMMethod):
    name = "drpo"
    needs_whole_groups = True

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.drpo
        if o.enabled and not o.temperature > 0:
            raise ValueError(f"methods.drpo.temperature must be > 0, got {o.temperature}")

    def on_advantages(self, rb):
        if rb.n == 0 or rb.advantages is None:
            return rb
        o = self.cfg.methods.drpo
        acc = self.run.accuracy(rb.texts, rb.samples, rb.rewards)
        correct = torch.nan_to_num(acc, nan=0.0) >= o.threshold
        rows = ~rb.is_offpolicy & (rb.valid if rb.valid is not None else True)
        lengths = rb.completion_mask.bool().sum(1)
        w = drpo_weights(lengths, correct, rb.advantages, rb.group_ids, rows, o.temperature)
        rb.advantages = rb.advantages * w.to(rb.advantages.dtype)
        L = lengths.float()
        self._m = {"drpo/weight_max": float(w.max()),
                   "drpo/length_correct": float(L[rows & correct].mean()) if (rows & correct).any() else 0.0,
                   "drpo/length_wrong": float(L[rows & ~correct].mean()) if (rows & ~correct).any() else 0.0}
        return rb

    def end_of_step(self, rb, metrics: dict) -> None:
        metrics.update(getattr(self, "_m", {}))
