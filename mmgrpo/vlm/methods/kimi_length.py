r"""Kimi k1.5 length penalty (Kimi Team 2025, arXiv 2501.12599, section 2.3.3 "Length Penalty").

Within each group of completions of one prompt, with :math:`l_i` the length of completion :math:`i` and
:math:`l_{min}`, :math:`l_{max}` the shortest and longest of the group:

.. math::
    \lambda_i = 0.5 - \frac{l_i - l_{min}}{l_{max} - l_{min}}, \qquad
    r_{len}(i) = \begin{cases} \lambda_i & \text{the answer is correct} \\
                               \min(0, \lambda_i) & \text{otherwise} \end{cases}

and :math:`r_{len} = 0` for the whole group when every completion has the same length. Short correct answers gain up
to +0.5, long ones lose up to 0.5; a wrong answer is never rewarded for being short. ``coef`` times the penalty is
added to the reward before the group advantages (the paper adds it to the reward with a weight).

Choices: "correct" is the task's accuracy reward (``reward.accuracy_key``) at least ``threshold`` (1.0: exactly
right, the paper's binary correctness; a temporal-grounding run may set e.g. 0.5 on its IoU); lengths count the
completion's tokens including EOS (the completion mask); rows whose reward failed (``valid`` False) and an injected
ground truth (TempSamp-R1) take no part in their group's min / max and get 0.
"""
from __future__ import annotations

import torch
from torch import Tensor

from mmgrpo.vlm.methods.base import VLMMethod

__all__ = ["length_penalty", "KimiLength"]


def length_penalty(lengths: Tensor, correct: Tensor, group_ids: Tensor, rows: Tensor | None = None) -> Tensor:
    """(N,) float32 Kimi k1.5 length reward of each row (see the module docstring).

    lengths: (N,) token counts; correct: (N,) bool; group_ids: (N,) int64; rows: (N,) bool, the rows that take part
    (default all); the others get 0 and do not count for their group's min / max."""
    L = torch.as_tensor(lengths, dtype=torch.float64)
    ok = torch.as_tensor(correct, dtype=torch.bool)
    gids = torch.as_tensor(group_ids)
    part = torch.ones_like(ok) if rows is None else torch.as_tensor(rows, dtype=torch.bool)
    out = torch.zeros_like(L)
    for g in torch.unique(gids[part]).tolist():
        idx = torch.nonzero((gids == g) & part).flatten()
        lo, hi = L[idx].min(), L[idx].max()
        if hi == lo:
            continue
        lam = 0.5 - (L[idx] - lo) / (hi - lo)
        out[idx] = torch.where(ok[idx], lam, lam.clamp(max=0.0))
    return out.to(torch.float32)


class KimiLength(VLMMethod):
    """``methods.kimi_length.enabled``: adds ``rewards["length_kimi"]`` (the penalty) times ``coef`` to ``total``."""

    name = "kimi_length"
    needs_whole_groups = True  # a group's min / max length

    def on_rewards(self, rb) -> None:
        o = self.cfg.methods.kimi_length
        acc = self.run.accuracy(rb.texts, rb.samples, rb.rewards)
        correct = torch.nan_to_num(acc, nan=0.0) >= o.threshold
        rows = ~rb.is_offpolicy & (rb.valid if rb.valid is not None else True)
        lengths = rb.completion_mask.bool().sum(1)
        pen = length_penalty(lengths, correct, rb.group_ids, rows)
        rb.rewards["length_kimi"] = pen
        rb.rewards["total"] = rb.rewards["total"] + o.coef * pen.to(rb.rewards["total"].dtype)
        self._mean = float(pen[rows].mean()) if rows.any() else 0.0

    def end_of_step(self, rb, metrics: dict) -> None:
        metrics["kimi_length/penalty_mean"] = getattr(self, "_mean", 0.0)
