r"""GRPO-λ ("Stable Reinforcement Learning for Efficient Reasoning", arXiv 2505.18086): ``methods.grpo_lambda``.

A length penalty on every group makes the policy cut its reasoning before it can solve the task (accuracy collapses
early in training). GRPO-λ switches the penalty per group on the group's **correctness ratio** :math:`c_g` (share of
its completions that are correct): a group the policy already solves well gets the length-penalised reward, a group
it mostly fails keeps the plain reward, so efficiency is only asked for where it does not cost accuracy.

* selected groups: :math:`c_g \ge` ``ratio_threshold``, or (``top_fraction`` λ > 0) the round(λ·#groups) groups of
  the step with the highest :math:`c_g` (ties: lower group id first);
* their penalty: the Kimi k1.5 length reward within the group (:func:`mmgrpo.vlm.methods.kimi_length.length_penalty`:
  +0.5 for the shortest correct answer down to -0.5 for the longest, a wrong answer never above 0), times ``coef``,
  added to the total; other groups: 0.

Choices: the penalty form (Kimi's, which the team's notes name for this family) and the default threshold 0.5 are
this module's; correctness is the accuracy reward (``reward.accuracy_key``) at least ``threshold``; injected
ground-truth rows and invalid rows take no part. Metrics: share of penalised groups, mean length of correct and of
wrong completions.
"""
from __future__ import annotations

import torch
from torch import Tensor

from mmgrpo.vlm.methods.base import VLMMethod
from mmgrpo.vlm.methods.kimi_length import length_penalty

__all__ = ["GRPOLambda", "correctness_ratios", "select_groups", "grpo_lambda_penalty"]


def correctness_ratios(correct: Tensor, group_ids: Tensor, rows: Tensor) -> dict[int, float]:
    """Group id -> share of its participating rows that are correct."""
    out = {}
    for g in torch.unique(group_ids[rows]).tolist():
        m = (group_ids == g) & rows
        out[int(g)] = float(correct[m].float().mean())
    return out


def select_groups(ratios: dict[int, float], ratio_threshold: float = 0.5, top_fraction: float = 0.0) -> set[int]:
    """The groups that get the length penalty (module docstring)."""
    if top_fraction > 0:
        k = int(round(top_fraction * len(ratios)))
        order = sorted(ratios, key=lambda g: (-ratios[g], g))
        return set(order[:k])
    return {g for g, c in ratios.items() if c >= ratio_threshold}


def grpo_lambda_penalty(lengths: Tensor, correct: Tensor, group_ids: Tensor, rows: Tensor | None = None,
                        ratio_threshold: float = 0.5, top_fraction: float = 0.0) -> tuple[Tensor, set[int]]:
    """(N,) float32 penalty (Kimi's within the selected groups, 0 elsewhere) and the selected group ids."""
    ok = torch.as_tensor(correct, dtype=torch.bool)
    gids = torch.as_tensor(group_ids)
    part = torch.ones_like(ok) if rows is None else torch.as_tensor(rows, dtype=torch.bool)
    chosen = select_groups(correctness_ratios(ok, gids, part), ratio_threshold, top_fraction)
    sel = part & torch.isin(gids, torch.tensor(sorted(chosen), dtype=gids.dtype))
    return length_penalty(lengths, ok, gids, sel), chosen


class GRPOLambda(VLMMethod):
    """Adds ``rewards["length_lambda"]`` times ``coef`` to ``total`` in the selected groups."""

    name = "grpo_lambda"
    needs_whole_groups = True

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.grpo_lambda
        if o.enabled and not (0.0 <= o.ratio_threshold <= 1.0 and 0.0 <= o.top_fraction <= 1.0):
            raise ValueError("methods.grpo_lambda.ratio_threshold and top_fraction must be in [0, 1], got "
                             f"{o.ratio_threshold} / {o.top_fraction}")

    def on_rewards(self, rb) -> None:
        o = self.cfg.methods.grpo_lambda
        acc = self.run.accuracy(rb.texts, rb.samples, rb.rewards)
        correct = torch.nan_to_num(acc, nan=0.0) >= o.threshold
        rows = ~rb.is_offpolicy & (rb.valid if rb.valid is not None else True)
        lengths = rb.completion_mask.bool().sum(1)
        pen, chosen = grpo_lambda_penalty(lengths, correct, rb.group_ids, rows, o.ratio_threshold, o.top_fraction)
        rb.rewards["length_lambda"] = pen
        rb.rewards["total"] = rb.rewards["total"] + o.coef * pen.to(rb.rewards["total"].dtype)
        n_groups = len(torch.unique(rb.group_ids[rows])) if rows.any() else 0
        L = lengths.float()
        self._m = {"grpo_lambda/penalised_groups": len(chosen) / max(n_groups, 1),
                   "grpo_lambda/length_correct": float(L[rows & correct].mean()) if (rows & correct).any() else 0.0,
                   "grpo_lambda/length_wrong": float(L[rows & ~correct].mean()) if (rows & ~correct).any() else 0.0}

    def end_of_step(self, rb, metrics: dict) -> None:
        metrics.update(getattr(self, "_m", {}))
