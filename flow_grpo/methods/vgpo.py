r"""VGPO (Value-Anchored Group Policy Optimization; Shao et al., arXiv 2512.12387): value-anchored per-step credit.

**No public code exists** (the paper's project page promises it; github.com/wzb-bupt/VGPO is an unrelated VLM method
with the same acronym), and the paper's equations were not available to us: only its abstract and secondary
summaries. What the paper states, and this module implements: (i) the sparse terminal reward is turned into dense
per-step value estimates, the expected cumulative reward at each generation stage, and each step is credited from
them (*temporal* anchoring); (ii) the group normalisation is enhanced by absolute values, so the signal does not vanish
when the rewards in a group become identical ("adaptive dual advantage", *group* anchoring). Every concrete form
below is therefore **our choice**, listed with its switch:

1. *Values* :math:`V_{i,0..n}` of trajectory i (input, shape (N, n+1)): :math:`V_k` is the reward of the outcome
   reached from the latent after the k-th trained (SDE) step, :math:`V_0` from the latent before the first one. The
   sampler obtains them by ODE-completing from those latents with the trajectory's own :math:`x_T` and prefix, the
   same sequence :math:`R_0..R_n` as TP-GRPO's ``credit="tp_grpo"`` (a cheaper one-step
   :math:`\hat x_0=x_k-\sigma_k v` decode is another possible value source). The last value is **anchored to the
   actual terminal reward**, :math:`V_n=R`, so the credit of the whole trajectory sums to the real outcome.
2. *Instant rewards* :math:`r_k=V_k-V_{k-1}` (k = 1..n): the change of value caused by step k.
3. *Temporal cumulative reward* :math:`G_k=\sum_{j=k}^{n}\gamma^{j-k}r_j` (:func:`temporal_credit`). With the
   default γ = 1 this telescopes to :math:`G_k=R-V_{k-1}`: the outcome measured against the value of the state the
   step started from (a state-value baseline: unbiased, and it removes what earlier steps did). γ = 0 credits a step
   only with its own instant reward; values in between discount later steps.
4. *Dual advantage* per step column k, within each group g (:func:`dual_advantages`):

   .. math::
       A_{i,k}=(1-w_{g,k})\,\frac{G_{i,k}-\mu_{g,k}}{\sigma_{g,k}+\epsilon}+w_{g,k}\,\frac{G_{i,k}-b_k}{\tau},\qquad
       w_{g,k}=\exp(-\sigma_{g,k}/\tau)

   with :math:`\mu,\sigma` the group mean and **population** std (Flow-GRPO's tracker), ε = 1e-4, clamp ±5. The
   weight is adaptive: a group with a wide spread (σ ≫ τ) is normalised relatively as in GRPO; as its spread
   collapses (σ → 0, e.g. every image correct) the absolute term takes over, so the group keeps a signal (where
   GRPO gives exactly 0). τ (``tau``, default 0.1, in reward units) is both the spread at which the two terms weigh
   1-1/e : 1/e and the scale of the absolute term. The absolute anchor :math:`b_k` (``anchor``) is 0 by default:
   :math:`G` is already measured against a value, so 0 means "no better than expected"; ``"batch"`` uses the batch
   mean of column k, a float a fixed reference.

Sanity limit: with n = 1 and :math:`V_0` the same for the whole group, :math:`G=R-V_0` and, for a group with any
spread, τ → 0 gives back GRPO's group z-score of R.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor

from mmgrpo.core.advantages import group_advantages

from .tp_grpo import TPGRPO

__all__ = ["VGPOAdvantages", "instant_rewards", "temporal_credit", "dual_advantages", "vgpo_advantages"]


def _check_values(V: Tensor) -> Tensor:
    V = torch.as_tensor(V)
    if V.dim() != 2 or V.shape[1] < 2:
        raise ValueError(f"values must be (N, n+1) with n >= 1, got {tuple(V.shape)}")
    if not torch.isfinite(V).all():
        raise ValueError("non-finite values in the value sequence")
    return V.to(torch.float64)


def instant_rewards(V: Tensor) -> Tensor:
    """:math:`r_k=V_k-V_{k-1}`, (N, n+1) -> (N, n)."""
    V = _check_values(V)
    return V[:, 1:] - V[:, :-1]


def temporal_credit(V: Tensor, gamma: float = 1.0) -> Tensor:
    r""":math:`G_k=\sum_{j\ge k}\gamma^{j-k}(V_j-V_{j-1})`, (N, n+1) -> (N, n) float64 (backward recursion
    :math:`G_n=r_n`, :math:`G_k=r_k+\gamma G_{k+1}`)."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"vgpo gamma must be in [0, 1], got {gamma}")
    r = instant_rewards(V)
    G = torch.empty_like(r)
    acc = torch.zeros_like(r[:, 0])
    for k in range(r.shape[1] - 1, -1, -1):
        acc = r[:, k] + gamma * acc
        G[:, k] = acc
    return G


@dataclass
class VGPOAdvantages:
    """(N, n) tensors: the clamped ``advantages`` and their parts (``relative``, ``absolute``, ``weight`` w)."""

    advantages: Tensor
    relative: Tensor
    absolute: Tensor
    weight: Tensor

    def stats(self) -> dict[str, float]:
        return {"vgpo/abs_weight": float(self.weight.mean()), "vgpo/adv_abs_mean": float(self.advantages.abs().mean())}


def dual_advantages(
    G: Tensor, group_ids: Tensor, tau: float = 0.1, anchor: Union[str, float] = 0.0, eps: float = 1e-4,
    clamp: Optional[float] = 5.0, valid: Optional[Tensor] = None,
) -> VGPOAdvantages:
    """Adaptive mix of the group z-score and the absolute term (module docstring, item 4). G (N, n)."""
    if tau <= 0:
        raise ValueError(f"vgpo tau must be > 0, got {tau}")
    G = torch.as_tensor(G, dtype=torch.float64)
    if G.dim() != 2:
        raise ValueError(f"G must be (N, n), got {tuple(G.shape)}")
    out = group_advantages(G, group_ids, scale="group", eps=eps, unbiased=False, valid=valid)
    rel = out.advantages.to(torch.float64)
    sigma = out.group_std.to(torch.float64)
    if isinstance(anchor, str):
        if anchor != "batch":
            raise ValueError(f"vgpo anchor must be a number or 'batch', got {anchor!r}")
        vmask = torch.ones(G.shape[0], dtype=torch.bool) if valid is None else torch.as_tensor(valid, dtype=torch.bool)
        b = G[vmask].mean(0, keepdim=True)
    else:
        b = torch.full((1, G.shape[1]), float(anchor), dtype=torch.float64)
    absolute = (G - b) / tau
    w = torch.exp(-sigma / tau)
    adv = (1 - w) * rel + w * absolute
    if valid is not None:
        adv = torch.where(torch.as_tensor(valid, dtype=torch.bool).unsqueeze(1), adv, torch.zeros_like(adv))
    if clamp is not None:
        adv = adv.clamp(-clamp, clamp)
    return VGPOAdvantages(advantages=adv, relative=rel, absolute=absolute, weight=w)


def vgpo_advantages(
    V: Tensor, group_ids: Tensor, gamma: float = 1.0, tau: float = 0.1, anchor: Union[str, float] = 0.0,
    eps: float = 1e-4, clamp: Optional[float] = 5.0, valid: Optional[Tensor] = None,
) -> VGPOAdvantages:
    """Per-step VGPO advantages (N, n) from the value sequence V (N, n+1): :func:`temporal_credit` then
    :func:`dual_advantages`; column k-1 is trained step k."""
    return dual_advantages(temporal_credit(V, gamma), group_ids, tau=tau, anchor=anchor, eps=eps, clamp=clamp,
                           valid=valid)


# ------------------------------------------------------------------------------------------- the method
def _anchor(value: str) -> Union[str, float]:
    if str(value).strip() == "batch":
        return "batch"
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"methods.vgpo.anchor must be a number or 'batch', got {value!r}") from None


def vgpo_credit(inp, gamma: float = 1.0, tau: float = 0.1, anchor: str = "0"):
    """The credit: the values are TP-GRPO's R_0..R_n (ODE completions before every SDE step of the window, R_n the
    final reward); invalid samples leave every statistic; column j of sample i's window gets A[i, j]. The group
    statistics use ``optim.adv_eps`` and ``optim.adv_clip_max``; the std is always the population one
    (``optim.adv_std_ddof`` / ``adv_scale`` do not apply)."""
    from .base import CreditOutput
    from .tp_grpo import window_layout

    N, T = inp.train_mask.shape
    (V_all, g_all, v_all), sl = inp.gather([inp.step_rewards, inp.group_ids, inp.valid])
    n = V_all.shape[1] - 1
    A_all = torch.zeros(V_all.shape[0], n)
    stats: dict = {}
    if bool(v_all.any()):
        out = vgpo_advantages(V_all[v_all], g_all[v_all], gamma=gamma, tau=tau, anchor=_anchor(anchor),
                              eps=inp.opts.eps, clamp=inp.opts.clamp)
        A_all[v_all] = out.advantages.float()
        stats.update(out.stats())
    _, pos = window_layout(inp.train_mask)
    adv = torch.zeros(N, T)
    adv.scatter_(1, pos, A_all[sl])
    return CreditOutput(adv, stats)


class VGPO(TPGRPO):
    """TP-GRPO's rollout (ODE completions before every SDE step of a window; its sampling check and step rewards,
    inherited) with the VGPO credit."""

    name = "vgpo"

    def advantage_estimator(self):
        o = self.cfg.methods.vgpo
        return functools.partial(vgpo_credit, gamma=o.gamma, tau=o.tau, anchor=o.anchor)
