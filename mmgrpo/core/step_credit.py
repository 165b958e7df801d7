r"""Step-level credit assignment on per-trajectory reward sequences (TP-GRPO and the trivial outcome case).

A trajectory i of n trained steps carries rewards :math:`R_0, R_1, \dots, R_n` (shape (N, n+1)), where
:math:`R_k` scores the outcome reached from the state after step k (for diffusion: the image obtained by
ODE-completing from :math:`x^{(k)}`; :math:`R_0` is the pure-ODE outcome from the *same* initial noise and
:math:`R_n` the actual final outcome). Generic: nothing here knows about images or models.

TP-GRPO (arXiv 2602.06422) as configured by its launch scripts (η = 1):

* incremental rewards :math:`d_k = R_k - R_{k-1}`, global trend :math:`\Delta = R_n - R_0 = \sum_k d_k`,
  :math:`s_k = \mathrm{sgn}(d_k)\,\mathrm{sgn}(\Delta)`;
* turning points: :math:`I_1 = [\mathrm{sgn}(d_1)\,\mathrm{sgn}(R_n-R_1) > 0]` (the first step agrees with the
  rest of the trajectory) and for :math:`k\ge2`
  :math:`I_k = [s_{k-1}<0]\,[s_k>0]\,[\mathrm{sgn}(d_k)\,\mathrm{sgn}(R_n-R_k)>0]` (the previous step went against
  the trend, this one flips back, and everything after keeps its direction). The last step is never a turning
  point because :math:`R_n-R_n=0`;
* balancing: flagged (i, k) are split by the sign of :math:`\Delta_i` (equal to the sign of their aggregated
  reward); if both signs occur, only :math:`\min(n_+, n_-)` of each sign are kept, those with the largest
  :math:`|\Delta_i|` (ties: lower sample index, then lower step). The scope is **per group** by default, so the
  result does not depend on how samples are laid out over devices (the released code balances per device batch);
  ``"batch"`` balances over everything passed in;
* per-step rewards :math:`r_k = R_n - R_{k-1}` (the aggregated long-term reward) at turning points, else
  :math:`d_k`;
* per-step advantages: a group z-score of :math:`r_{\cdot,k}` for each step k separately, with the population std
  plus 1e-4 (the release keeps one ``PerPromptStatTracker`` per step, ``np.std`` + 1e-4), clamped to ±5.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .advantages import group_advantages

__all__ = [
    "StepCredit",
    "incremental_rewards",
    "turning_points",
    "balance_turning_points",
    "turning_point_rewards",
    "step_advantages",
]


def _check_R(R: Tensor) -> Tensor:
    R = torch.as_tensor(R)
    if R.dim() != 2 or R.shape[1] < 2:
        raise ValueError(f"reward sequence must be (N, n+1) with n >= 1, got {tuple(R.shape)}")
    if not torch.isfinite(R).all():
        raise ValueError("non-finite values in the reward sequence")
    return R.to(torch.float64)


def incremental_rewards(R: Tensor) -> Tensor:
    """:math:`d_k = R_k - R_{k-1}` for k = 1..n. (N, n+1) -> (N, n)."""
    R = _check_R(R)
    return R[:, 1:] - R[:, :-1]


def turning_points(R: Tensor) -> Tensor:
    """Turning-point indicators :math:`I_k` (before balancing), bool (N, n); column k-1 is step k."""
    R = _check_R(R)
    d = R[:, 1:] - R[:, :-1]
    n = d.shape[1]
    delta = R[:, -1:] - R[:, :1]
    s = torch.sign(d) * torch.sign(delta)
    remaining = R[:, -1:] - R[:, 1:]  # R_n - R_k for k = 1..n
    consistent = torch.sign(d) * torch.sign(remaining) > 0
    flags = torch.zeros_like(d, dtype=torch.bool)
    flags[:, 0] = consistent[:, 0]
    if n >= 2:
        flags[:, 1:] = (s[:, :-1] < 0) & (s[:, 1:] > 0) & consistent[:, 1:]
    return flags


def balance_turning_points(
    flags: Tensor, delta: Tensor, group_ids: Tensor | None = None,
    scope: Literal["group", "batch"] = "group",
) -> Tensor:
    """Balance positive and negative turning points (see module docstring). Returns new bool flags (N, n)."""
    flags = torch.as_tensor(flags, dtype=torch.bool)
    delta = torch.as_tensor(delta, dtype=torch.float64).flatten()
    n_samples = flags.shape[0]
    if scope == "group":
        if group_ids is None:
            raise ValueError("scope='group' needs group_ids")
        gids = torch.as_tensor(group_ids)
    elif scope == "batch":
        gids = torch.zeros(n_samples, dtype=torch.long)
    else:
        raise ValueError(f"unknown balancing scope {scope!r}")
    out = flags.clone()
    for g in torch.unique(gids).tolist():
        idx = torch.nonzero((gids == g).unsqueeze(1) & flags)  # rows: (sample, step), sorted by sample then step
        if idx.numel() == 0:
            continue
        signs = torch.sign(delta[idx[:, 0]])
        pos, neg = idx[signs > 0], idx[signs < 0]
        if len(pos) == 0 or len(neg) == 0:
            continue
        keep = min(len(pos), len(neg))
        for cand in (pos, neg):
            if len(cand) == keep:
                continue
            mag = delta[cand[:, 0]].abs()
            # stable sort by descending |delta|; ties keep the (sample, step) order of `nonzero`
            order = torch.sort(-mag, stable=True).indices
            drop = cand[order[keep:]]
            out[drop[:, 0], drop[:, 1]] = False
    return out


@dataclass
class StepCredit:
    """Output of :func:`turning_point_rewards`. All (N, n) except ``delta`` (N,)."""

    step_rewards: Tensor
    turning: Tensor
    turning_raw: Tensor
    increments: Tensor
    delta: Tensor

    def stats(self) -> dict[str, float]:
        n = max(self.turning.numel(), 1)
        return {
            "tp/frac_raw": self.turning_raw.sum().item() / n,
            "tp/frac_kept": self.turning.sum().item() / n,
            "tp/num_pos": float((self.turning & (self.delta.unsqueeze(1) > 0)).sum().item()),
            "tp/num_neg": float((self.turning & (self.delta.unsqueeze(1) < 0)).sum().item()),
        }


def turning_point_rewards(
    R: Tensor,
    group_ids: Tensor | None = None,
    balance: bool = True,
    balance_scope: Literal["group", "batch"] = "group",
) -> StepCredit:
    """TP-GRPO per-step rewards from the reward sequence R (N, n+1). See the module docstring."""
    Rd = _check_R(R)
    d = Rd[:, 1:] - Rd[:, :-1]
    delta = Rd[:, -1] - Rd[:, 0]
    raw = turning_points(Rd)
    flags = balance_turning_points(raw, delta, group_ids, balance_scope) if balance else raw
    aggregated = Rd[:, -1:] - Rd[:, :-1]  # R_n - R_{k-1}, k = 1..n
    r = torch.where(flags, aggregated, d)
    dt = torch.as_tensor(R).dtype if torch.as_tensor(R).dtype.is_floating_point else torch.float32
    return StepCredit(step_rewards=r.to(dt), turning=flags, turning_raw=raw, increments=d.to(dt),
                      delta=delta.to(dt))


def step_advantages(
    step_rewards: Tensor, group_ids: Tensor, scale: Literal["group", "batch", "none"] = "group",
    eps: float = 1e-4, clamp: float | None = 5.0, unbiased: bool = False, valid: Tensor | None = None,
) -> Tensor:
    r"""Per-step group advantages (N, K): column k is z-scored within each group independently,
    :math:`A_{i,k} = (r_{i,k}-\mu_{g,k})/(\sigma_{g,k}+\epsilon)`.

    The defaults are TP-GRPO's release: :math:`\sigma` is the *population* std (divides by G, ``np.std`` in its
    per-step ``PerPromptStatTracker``), :math:`\epsilon = 10^{-4}` outside the square root, clamp ±5. Example: one
    group with step rewards [[0], [1]] gives ±0.5/(0.5+1e-4) = ±0.9998 (``unbiased=True``, dividing by G-1 as
    ``torch.std``, would give ±0.7070)."""
    r = torch.as_tensor(step_rewards)
    if r.dim() != 2:
        raise ValueError(f"step_rewards must be (N, K), got {tuple(r.shape)}")
    return group_advantages(r, group_ids, scale=scale, eps=eps, unbiased=unbiased, clamp=clamp,
                            valid=valid).advantages

