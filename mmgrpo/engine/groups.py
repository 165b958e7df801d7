"""Degenerate-group counting shared by both trainers: how many valid members each group kept after rewards were
dropped.  A group with fewer than 2 valid members has no baseline (its advantage is 0): the VLM trainer counts
those as ``degenerate_groups``; the flow trainer splits them into ``groups_empty`` (0) and ``groups_singleton``
(1) (``flow_grpo.methods.base.group_stats``, which can use :func:`valid_member_counts` once the methods package is
open for edits again)."""
from __future__ import annotations

import torch

__all__ = ["valid_member_counts"]


def valid_member_counts(group_ids: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(counts, inverse)``: ``counts[j]`` (int64) = valid members of the j-th distinct group id (sorted),
    ``inverse[i]`` = index j of sample i's group (so ``counts[inverse]`` is per sample)."""
    g = torch.as_tensor(group_ids)
    v = torch.as_tensor(valid, dtype=torch.bool, device=g.device).reshape(-1)
    if v.shape[0] != g.reshape(-1).shape[0]:
        raise ValueError(f"{v.shape[0]} validity flags for {g.reshape(-1).shape[0]} group ids")
    gids, inv = torch.unique(g.reshape(-1), return_inverse=True)
    counts = torch.zeros(len(gids), dtype=torch.long, device=g.device).scatter_add_(0, inv, v.long())
    return counts, inv

