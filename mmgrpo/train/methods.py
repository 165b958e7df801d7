"""Pure functions for method-specific terms of the VLM trainer (T-GRPO bonus, TW-GRPO token weights).

Shapes: N rows (completions); group_ids (N,) int64; T completion positions; V vocabulary.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["temporal_bonus", "tw_token_weights"]


def temporal_bonus(acc: Tensor, group_ids: Tensor, acc_shuffled: Tensor, shuffled_group_ids: Tensor,
                   alpha: float = 0.3, mu: float = 1.0, min_accuracy: float = 0.1) -> tuple[Tensor, Tensor]:
    r"""T-GRPO (Video-R1) temporal bonus, computed PER GROUP (not over the device batch, Video-R1 #96).

    For group g with ordered accuracies :math:`a_i` and shuffled-frame accuracies :math:`\tilde a_j`:
    :math:`p_g = \text{mean}_i a_i`, :math:`\tilde p_g = \text{mean}_j \tilde a_j`. If :math:`p_g \ge \mu\,\tilde p_g`
    every ordered row with :math:`a_i > \text{min\_accuracy}` gets :math:`+\alpha`. Groups without shuffled rows
    (image prompts) get no bonus.

    Returns (bonus (N,) float32, granted (G_groups,) bool per unique group id in ascending order).
    """
    acc = torch.as_tensor(acc, dtype=torch.float64)
    gid = torch.as_tensor(group_ids)
    acc_s = torch.as_tensor(acc_shuffled, dtype=torch.float64)
    gid_s = torch.as_tensor(shuffled_group_ids)
    if acc.shape != gid.shape or acc_s.shape != gid_s.shape:
        raise ValueError("accuracies and group ids must have matching (N,) / (M,) shapes")
    uniq = torch.unique(gid)
    bonus = torch.zeros_like(acc)
    granted = torch.zeros(uniq.numel(), dtype=torch.bool)
    for k, g in enumerate(uniq.tolist()):
        ms = gid_s == g
        if not ms.any():
            continue
        m = gid == g
        p, p_s = acc[m].mean(), acc_s[ms].mean()
        if p >= mu * p_s:
            granted[k] = True
            bonus[m] = torch.where(acc[m] > min_accuracy, torch.full_like(acc[m], alpha), torch.zeros_like(acc[m]))
    return bonus.float(), granted


def tw_token_weights(logprobs: Tensor, mask: Tensor, group_ids: Tensor, alpha: float = 1.7,
                     clamp: float = 11.0) -> Tensor:
    r"""TW-GRPO token weights from the intra-group divergence of the per-position distributions.

    logprobs: (N, T, V) full-vocabulary log-distributions of each completion's positions (columns that are
    -inf for every row, e.g. suppressed vision tokens, are dropped; V' = remaining columns); mask (N, T).
    Past a sequence's end its distribution is uniform, :math:`\log(1/V')`. Per group and position t:

    .. math::
        m_{t,v} = \frac1{G}\sum_i \log p_{i,t,v},\quad \delta_{i,t,v} = \text{clamp}(m_{t,v}-\log p_{i,t,v}, \pm c)

        d_t = \frac1{G}\sum_i \sum_v \big(e^{\delta_{i,t,v}} - \delta_{i,t,v} - 1\big),\qquad
        w_t = 1 + (\alpha-1)\,\frac{d_t-\min_t d}{\max_t d-\min_t d}

    with min/max over the positions t < (longest completion of the group); w = 1 where max = min and past that
    length. Returns (N, T) float32 weights (every row of a group shares w_t). Memory: one group's G×T×V at a time.
    """
    if logprobs.dim() != 3 or logprobs.shape[:2] != mask.shape:
        raise ValueError(f"logprobs must be (N, T, V) matching mask {tuple(mask.shape)}, got {tuple(logprobs.shape)}")
    lp_all = logprobs.detach()
    keep = torch.isfinite(lp_all).reshape(-1, lp_all.shape[-1]).any(0)
    gid = torch.as_tensor(group_ids, device=lp_all.device)
    maskb = mask.bool()
    out = torch.ones(mask.shape, dtype=torch.float32, device=lp_all.device)
    for g in torch.unique(gid).tolist():
        rows = (gid == g).nonzero().flatten()
        lp = lp_all[rows][..., keep].double()  # (G, T, V')
        mg = maskb[rows]
        Tg = int(mg.sum(1).max().item()) if mg.any() else 0
        if Tg == 0:
            continue
        lp, mg = lp[:, :Tg], mg[:, :Tg]
        uniform = torch.full_like(lp, -math.log(lp.shape[-1]))
        lp = torch.where(mg.unsqueeze(-1), lp, uniform)
        lp = torch.nan_to_num(lp, neginf=-1e4)  # a token with prob 0 inside the support: finite, clamped below
        m = lp.mean(0, keepdim=True)
        delta = (m - lp).clamp(-clamp, clamp)
        d = (torch.exp(delta) - delta - 1.0).sum(-1).mean(0)  # (Tg,)
        lo, hi = d.min(), d.max()
        norm = (d - lo) / (hi - lo) if hi > lo else torch.zeros_like(d)
        w = (1.0 + (alpha - 1.0) * norm).float()
        out[rows, :Tg] = w.unsqueeze(0).expand(len(rows), -1)
    return out
