"""DAPO's data-side tricks (clip-higher is ``algo.clip_high``, a loss argument, not a method).

* :class:`DynamicSampling` (``algo.filter_zero_std``): groups whose on-policy rewards are all equal carry no
  gradient; they are dropped (counted in ``data/filtered_groups``) and up to ``algo.filter_max_rounds`` extra
  sampling rounds refill the step, which keeps its first ``want`` groups (a fixed batch size);
* :class:`OverlongMask` (``rollout.mask_truncated_completions``): completions cut at ``max_new_tokens`` leave
  the loss and its token / sequence counts.
"""
from __future__ import annotations

import torch

from mmgrpo.vlm.methods.base import VLMMethod

__all__ = ["DynamicSampling", "OverlongMask", "drop_zero_std_groups", "keep_first_groups"]


def drop_zero_std_groups(group_ids: torch.Tensor, zero_std: torch.Tensor,
                         is_offpolicy: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(rows to keep (K,) int64, number of dropped groups): groups with a zero-std on-policy row are dropped."""
    dead = torch.unique(group_ids[zero_std & ~is_offpolicy])
    return (~torch.isin(group_ids, dead)).nonzero().flatten(), int(dead.numel())


def keep_first_groups(group_ids: torch.Tensor, want: int) -> torch.Tensor:
    """Rows of the first ``want`` groups (in row order; a group's rows are contiguous)."""
    first = torch.unique_consecutive(group_ids)[:want]
    return torch.isin(group_ids, first).nonzero().flatten()


class DynamicSampling(VLMMethod):
    name = "dapo_dynamic_sampling"
    needs_whole_groups = True

    def extra_rounds(self) -> int:
        return self.cfg.algo.filter_max_rounds

    def filter_batch(self, rb):
        keep, n_dead = drop_zero_std_groups(rb.group_ids, rb.zero_std, rb.is_offpolicy)
        self.trainer.counters["filtered_groups"] += n_dead
        return rb.select(keep)

    def finish_batch(self, rb, n_groups, want):
        if n_groups <= want:
            return rb, n_groups
        return rb.select(keep_first_groups(rb.group_ids, want)), want


class OverlongMask(VLMMethod):
    name = "overlong_mask"

    def loss_mask(self, rb, mask):
        mask = mask.clone()
        mask[rb.truncated] = 0
        return mask
