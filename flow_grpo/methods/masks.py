"""Train-mask functions: which (sample, step) pairs of a rollout are trained, given its advantages."""
from __future__ import annotations

import torch

from .base import CreditInputs, TrainMask, register_train_mask


def drop_zero_adv(cfg, adv: torch.Tensor, mask: torch.Tensor, inp: CreditInputs) -> torch.Tensor:
    """``optim.drop_zero_adv``: leave out trajectories whose advantage is 0 at every step (nothing to learn)."""
    return mask & (adv != 0).any(1, keepdim=True)


DROP_ZERO_ADV = register_train_mask(TrainMask("drop_zero_adv", lambda cfg: bool(cfg.optim.drop_zero_adv),
                                              drop_zero_adv))
