"""DanceGRPO's best-of-n (``--bestofn`` of its HunyuanVideo script): of each group, train only the ``n/2``
samples with the highest and the ``n/2`` with the lowest advantage (8 of 24 there); the others keep their
rollout but get no gradient. ``optim.best_of_n=n`` (even, >= 2; 0 = off).

A sample's advantage is the mean over its trained steps (the outcome credits give every step the same value);
samples without a trained step (invalid reward, or dropped by ``optim.drop_zero_adv``, which runs first) are not
candidates. A group with at most n candidates keeps them all. Ties are broken by position in the gathered batch
(stable sort: the earlier sample counts as lower). Groups split across processes are ranked on the gathered batch.
"""
from __future__ import annotations

import torch

from .base import CreditInputs, FlowMethod


def best_of_n_count(cfg) -> int:
    n = int(cfg.optim.best_of_n)
    if n < 0 or n % 2:
        raise ValueError(f"optim.best_of_n must be 0 (off) or an even number >= 2, got {n}")
    return n


def best_of_n_mask(cfg, adv: torch.Tensor, mask: torch.Tensor, inp: CreditInputs) -> torch.Tensor:
    """(N, T) mask narrowed to the top and bottom n/2 candidates of each group."""
    half = best_of_n_count(cfg) // 2
    has = mask.any(1)
    key = (adv * mask).sum(1) / mask.sum(1).clamp_min(1)
    (key_all, has_all, g_all), sl = inp.gather([key.double(), has, inp.group_ids])
    keep = torch.zeros_like(has_all)
    for g in torch.unique(g_all).tolist():
        idx = torch.nonzero((g_all == g) & has_all).flatten()
        if len(idx) <= 2 * half:
            keep[idx] = True
            continue
        order = idx[torch.argsort(key_all[idx], stable=True)]
        keep[order[:half]] = True
        keep[order[-half:]] = True
    return mask & keep[sl].unsqueeze(1)


class BestOfN(FlowMethod):
    name = "best_of_n"

    @classmethod
    def check(cls, cfg) -> None:
        best_of_n_count(cfg)

    def on_advantages(self, traj):
        traj.train_mask = best_of_n_mask(self.cfg, traj.advantages, traj.train_mask, self.run.credit_inputs(traj))
        return traj
