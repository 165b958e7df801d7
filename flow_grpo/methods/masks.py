"""``optim.drop_zero_adv``: which (sample, step) pairs of a rollout are trained, given its advantages."""
from __future__ import annotations

import torch

from .base import FlowMethod


def drop_zero_adv(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Leave out trajectories whose advantage is 0 at every step (nothing to learn)."""
    return mask & (adv != 0).any(1, keepdim=True)


class DropZeroAdv(FlowMethod):
    name = "drop_zero_adv"
    drops_zero_advantages = True

    def on_advantages(self, traj):
        traj.train_mask = drop_zero_adv(traj.advantages, traj.train_mask)
        return traj
