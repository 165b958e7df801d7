"""Positive-only training: of each rollout, only the samples with a positive advantage get a gradient.

The filter of reward-ranked fine-tuning (RAFT, Dong et al. 2023, arXiv 2304.06767: learn from the better samples
only) and of DiffusionNFT's ``adv_mode=positive_only``, applied to GRPO's clipped policy loss: a sample whose
advantage is <= 0 at every trained step keeps its rollout (it still counts for its group's statistics, which are
computed before) but leaves the loss. ``methods.positive_only.enabled=true``. A small worked example of a
train-mask method (CONTRIBUTING.md, "Add a method").
"""
from __future__ import annotations

import torch

from .base import FlowMethod

__all__ = ["positive_mask", "PositiveOnly"]


def positive_mask(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, T) train mask narrowed to the samples with a positive advantage at one of their trained steps at least."""
    return mask & ((adv > 0) & mask).any(1, keepdim=True)


class PositiveOnly(FlowMethod):
    name = "positive_only"

    def on_advantages(self, traj):
        kept = positive_mask(traj.advantages, traj.train_mask)
        self._frac = float(kept.any(1).float().mean()) if len(kept) else 0.0
        traj.train_mask = kept
        return traj

    def end_of_step(self, traj, metrics: dict) -> None:
        metrics["positive_only/kept_frac"] = getattr(self, "_frac", 0.0)
