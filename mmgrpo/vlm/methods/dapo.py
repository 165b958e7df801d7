"""DAPO's data-side tricks (clip-higher is ``algo.clip_high``, a loss argument, not a method).

* :class:`DynamicSampling` (``algo.filter_zero_std``): groups whose on-policy rewards are all equal carry no
  gradient; they are dropped (counted in ``data/filtered_groups``) and up to ``algo.filter_max_rounds`` extra
  sampling rounds refill the step, which keeps its first groups (a fixed batch size: the recipe trims refills);
* :class:`OverlongMask` (``rollout.mask_truncated_completions``): completions cut at ``max_new_tokens`` leave
  the loss and its token / sequence counts.
"""
from __future__ import annotations

import torch

from mmgrpo.vlm.methods.base import VLMMethod

__all__ = ["DynamicSampling", "OverlongMask", "drop_zero_std_groups", "overlong_filtered"]


def drop_zero_std_groups(group_ids: torch.Tensor, zero_std: torch.Tensor,
                         is_offpolicy: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(rows to keep (K,) int64, number of dropped groups): groups with a zero-std on-policy row are dropped."""
    dead = torch.unique(group_ids[zero_std & ~is_offpolicy])
    return (~torch.isin(group_ids, dead)).nonzero().flatten(), int(dead.numel())


class DynamicSampling(VLMMethod):
    name = "dapo_dynamic_sampling"
    needs_whole_groups = True

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.extra_rounds = cfg.algo.filter_max_rounds

    def on_advantages(self, rb):
        keep, n_dead = drop_zero_std_groups(rb.group_ids, rb.zero_std, rb.is_offpolicy)
        self.run.state.counters["filtered_groups"] += n_dead
        return rb.select(keep)


class OverlongMask(VLMMethod):
    name = "overlong_mask"

    def on_advantages(self, rb):
        rb.loss_mask = overlong_filtered(rb.loss_mask, rb.truncated)
        return rb


def overlong_filtered(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """(N, T) loss mask without the rows of completions cut at ``max_new_tokens`` (``truncated`` (N,) bool)."""
    mask = mask.clone()
    mask[truncated] = 0
    return mask
