"""Groups across processes, shared by both trainers.

* :func:`distributed_group_advantages`: :func:`mmgrpo.core.group_advantages` of groups whose samples sit on several
  processes (each process holds a slice of the batch; Flow-GRPO's ``DistributedKRepeatSampler`` splits groups on
  purpose): gathered, computed, and each process keeps its rows, so the result equals the single-process one bit
  for bit;
* :func:`valid_member_counts`: how many valid members each group kept after rewards were dropped. A group with fewer
  than 2 valid members has no baseline (its advantage is 0): the VLM trainer counts those as ``degenerate_groups``;
  the flow trainer splits them into ``groups_empty`` (0) and ``groups_singleton`` (1);
* :func:`no_reward_signal`: whether a step / epoch has any reward signal at all (some non-zero advantage on some
  process), and if not the reward statistics its message names; both recipes then skip or take the step by the same
  rules (a zero gradient is a skipped step unless a KL or a method's own loss term remains).

Every process calls :func:`distributed_group_advantages` collectively; without a process group it is the plain
computation.
"""
from __future__ import annotations

import torch
from torch import Tensor

from mmgrpo.core.advantages import AdvantageOutput, group_advantages
from mmgrpo.engine.dist import all_reduce, gather_groups

__all__ = ["distributed_group_advantages", "valid_member_counts", "no_reward_signal"]


def distributed_group_advantages(
    rewards: Tensor, group_ids: Tensor, valid: Tensor | None = None, **adv_kwargs
) -> AdvantageOutput:
    """:func:`group_advantages` over the samples of all processes; returns this process's rows.

    ``group_ids`` must be global (the same id on every process for the same group). ``zero_std_fraction`` and
    ``num_groups`` describe the whole gathered batch.
    """
    r = torch.as_tensor(rewards)
    g = torch.as_tensor(group_ids, device=r.device)
    v = torch.ones(r.shape[0], dtype=torch.bool, device=r.device) if valid is None else torch.as_tensor(
        valid, dtype=torch.bool, device=r.device)
    (r_all, g_all, v_all), sl = gather_groups([r, g, v])
    full = group_advantages(r_all, g_all, valid=v_all, **adv_kwargs)
    return AdvantageOutput(
        advantages=full.advantages[sl],
        zero_std_mask=full.zero_std_mask[sl],
        zero_std_fraction=full.zero_std_fraction,
        group_mean=full.group_mean[sl],
        group_std=full.group_std[sl],
        num_groups=full.num_groups,
    )



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


def no_reward_signal(advantages: Tensor | None, rewards: Tensor | None,
                     device=None) -> tuple[int, float, float] | None:
    """Collective. ``None`` if some advantage of some process is non-zero (the step has a reward signal); else
    ``(n, mean, std)`` of the rewards over every process (every advantage is 0: each group's rewards are equal).
    Pass the valid rows only (``advantages``: any shape; ``rewards``: one value per row; ``None``: no rows here)."""
    nonzero = all_reduce([float((advantages != 0).sum()) if advantages is not None else 0.0], "sum", device)[0]
    if nonzero > 0:
        return None
    r = rewards.double() if rewards is not None else torch.zeros(0, dtype=torch.float64)
    n, s1, s2 = all_reduce([float(r.numel()), float(r.sum()), float((r * r).sum())], "sum", device)
    mean = s1 / max(n, 1.0)
    return int(n), mean, max(s2 / max(n, 1.0) - mean * mean, 0.0) ** 0.5
