r"""Policy-loss variants beside PPO's clipped surrogate: per-token losses, an aggregation and a KL schedule.

Every surrogate here takes the (N, T) log-ratio :math:`\log\rho = \log\pi_\theta - \log\pi_{old}` (with gradient,
0 outside the mask: :func:`mmgrpo.core.losses.log_ratio`), the advantages (N,) or (N, T) and the mask, and returns
the (N, T) per-token loss (not masked) and float metrics, as :func:`mmgrpo.core.losses.clipped_surrogate` does; a
recipe aggregates it like any other per-token loss. With one update per rollout (:math:`\pi_{old}=\pi_\theta`,
:math:`\rho\equiv1`) CISPO, SAPO, DCPO's clip and DHPO all have GRPO's gradient :math:`-A\nabla\log\pi`; they differ
only once :math:`\rho\neq1` (``algo.num_iterations`` > 1, or an off-policy rollout engine).

* :func:`cispo_surrogate` - CISPO (MiniMax-M1, arXiv 2506.13585): REINFORCE weighted by the clipped, detached ratio;
* :func:`sapo_surrogate` - SAPO (Qwen, arXiv 2511.20347): a sigmoid gate instead of the hard clip;
* :func:`dcpo_bounds`, :func:`dcpo_surrogate` - DCPO's per-token dynamic clip bounds (arXiv 2509.02333);
* :func:`dhpo_surrogate` - DHPO's hybrid of token and sequence ratios, each clipped in its own region;
* :func:`balanced_aggregate` - Balanced Aggregation: token means over positive and negative responses apart, mixed
  with sequence-count weights;
* :func:`kl_schedule` - a scheduled KL weight (GRPO-D, OThink-MR1).
"""
from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from .losses import _per_token, masked_mean

__all__ = ["cispo_surrogate", "sapo_surrogate", "dcpo_bounds", "dcpo_surrogate", "dhpo_surrogate",
           "balanced_aggregate", "balanced_counts", "kl_schedule"]


def _check(log_ratio: Tensor, mask: Tensor) -> torch.Tensor:
    if log_ratio.shape != mask.shape:
        raise ValueError(f"log_ratio {tuple(log_ratio.shape)} and mask {tuple(mask.shape)} must have one (N, T) shape")
    return mask.bool()


def cispo_surrogate(log_ratio: Tensor, advantages: Tensor, mask: Tensor, max_ratio: float = 5.0,
                    min_ratio: float | None = None) -> tuple[Tensor, dict]:
    r"""CISPO per-token loss :math:`\ell = -\,\mathrm{sg}\big(\mathrm{clip}(\rho, r_{min}, r_{max})\big)\,A\,\log\rho`.

    The paper writes :math:`-\mathrm{sg}(\hat\rho)\,A\,\log\pi_\theta`; :math:`\log\rho` differs from
    :math:`\log\pi_\theta` by :math:`\log\pi_{old}`, a constant, so the gradient
    :math:`-\hat\rho A\nabla\log\pi_\theta` is the paper's (every token keeps a gradient, clipped or not: the clip
    only bounds its weight), and the loss value is 0 at :math:`\rho=1` instead of :math:`-A\log\pi`.
    ``max_ratio``: the cap :math:`r_{max}` (TRL passes ``epsilon_high`` as this cap; 5.0 here); ``min_ratio``: the
    lower bound (None = none, MiniMax-M1's "large" :math:`\epsilon_{low}`). Metric ``cispo_capped_frac``: share of
    mask tokens whose weight was capped."""
    maskb = _check(log_ratio, mask)
    if not max_ratio > 0 or (min_ratio is not None and not 0 <= min_ratio < max_ratio):
        raise ValueError(f"CISPO needs 0 <= min_ratio < max_ratio, got {min_ratio} / {max_ratio}")
    adv = _per_token(advantages, log_ratio)
    ratio = torch.exp(log_ratio.detach())
    w = ratio.clamp(max=max_ratio) if min_ratio is None else ratio.clamp(min_ratio, max_ratio)
    pg = -w * adv * log_ratio
    capped = ((ratio > max_ratio) | ((ratio < min_ratio) if min_ratio is not None else torch.zeros_like(maskb))) & maskb
    return pg, {"cispo_capped_frac": masked_mean(capped.to(log_ratio.dtype), maskb).item()}


def sapo_surrogate(log_ratio: Tensor, advantages: Tensor, mask: Tensor, tau_pos: float = 1.0,
                   tau_neg: float = 1.05) -> tuple[Tensor, dict]:
    r"""SAPO per-token loss :math:`\ell = -f_\tau(\rho)\,A` with the soft gate
    :math:`f_\tau(\rho) = \tfrac4\tau\,\sigma(\tau(\rho-1))`, :math:`\tau=\tau_{pos}` where :math:`A>0`, else
    :math:`\tau_{neg}` (the paper's 1.0 / 1.05). :math:`f'_\tau(1) = 1`: at :math:`\rho=1` the gradient is GRPO's;
    away from 1 it decays smoothly instead of being cut. The log-ratio is clamped to ±20 before the exponential
    (no overflow). Metric ``sapo_gate_mean``: mean gate derivative :math:`4\sigma(1-\sigma)\rho` over the mask (1 on
    policy)."""
    maskb = _check(log_ratio, mask)
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"SAPO temperatures must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    adv = _per_token(advantages, log_ratio)
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
    tau = torch.where(adv > 0, torch.full_like(adv, float(tau_pos)), torch.full_like(adv, float(tau_neg)))
    s = torch.sigmoid(tau * (ratio - 1.0))
    pg = -(4.0 / tau) * s * adv
    with torch.no_grad():
        slope = 4.0 * s * (1.0 - s) * ratio
    return pg, {"sapo_gate_mean": masked_mean(slope, maskb).item()}


def dcpo_bounds(old_logp: Tensor, eps_low: float = 0.16, eps_high: float = 0.2,
                max_ratio: float = 10.0) -> tuple[Tensor, Tensor]:
    r"""DCPO's per-token ratio bounds from the old token probability :math:`q = e^{\log\pi_{old}}`:

    .. math::
        \tfrac12 + \tfrac12\sqrt{\max(1 - 4\epsilon_{low}/q,\ 0)} \;\le\; \rho \;\le\;
        \min\big(\tfrac12 + \tfrac12\sqrt{1 + 4\epsilon_{high}/q},\ r_{max}\big)

    i.e. the roots of :math:`(\rho-1)\,\rho\,q = \pm\epsilon`: the change of probability :math:`(\rho-1)q` weighted by
    the new probability :math:`\rho q` stays within :math:`\epsilon`. A likely token (q near 1) gets about PPO's
    :math:`[1-\epsilon, 1+\epsilon]`; a rare one a wide region (the upper bound capped at ``max_ratio``, the paper's
    10). Returns (low, high), each like ``old_logp``, detached."""
    if not (eps_low > 0 and eps_high > 0 and max_ratio > 1):
        raise ValueError(f"DCPO needs eps_low, eps_high > 0 and max_ratio > 1, got {eps_low}, {eps_high}, {max_ratio}")
    q = torch.exp(old_logp.detach().double()).clamp_min(1e-12)
    low = 0.5 + 0.5 * torch.sqrt((1.0 - 4.0 * eps_low / q).clamp_min(0.0))
    high = (0.5 + 0.5 * torch.sqrt(1.0 + 4.0 * eps_high / q)).clamp(max=max_ratio)
    return low.to(old_logp.dtype), high.to(old_logp.dtype)


def dcpo_surrogate(log_ratio: Tensor, advantages: Tensor, mask: Tensor, old_logp: Tensor, eps_low: float = 0.16,
                   eps_high: float = 0.2, max_ratio: float = 10.0) -> tuple[Tensor, dict]:
    r"""PPO's clipped surrogate :math:`\max(-A\rho,\ -A\,\mathrm{clip}(\rho, lo_t, hi_t))` with DCPO's per-token
    bounds (:func:`dcpo_bounds` of the old log-probs). Metrics: ``clip_frac_low`` / ``clip_frac_high`` /
    ``clip_frac`` as :func:`~mmgrpo.core.losses.clipped_surrogate`, and ``dcpo_high_mean`` (mean upper bound)."""
    maskb = _check(log_ratio, mask)
    adv = _per_token(advantages, log_ratio)
    lo, hi = dcpo_bounds(old_logp, eps_low, eps_high, max_ratio)
    ratio = torch.exp(log_ratio)
    pg = torch.maximum(-adv * ratio, -adv * torch.minimum(torch.maximum(ratio, lo), hi))
    with torch.no_grad():
        low = ((ratio < lo) & (adv < 0) & maskb).to(log_ratio.dtype)
        high = ((ratio > hi) & (adv > 0) & maskb).to(log_ratio.dtype)
        m = {"clip_frac_low": masked_mean(low, maskb).item(), "clip_frac_high": masked_mean(high, maskb).item(),
             "dcpo_high_mean": masked_mean(hi, maskb).item()}
    m["clip_frac"] = m["clip_frac_low"] + m["clip_frac_high"]
    return pg, m


def dhpo_surrogate(log_ratio: Tensor, advantages: Tensor, mask: Tensor, token_weight: float = 0.5,
                   clip_low: float = 0.2, clip_high: float | None = None, seq_clip_low: float = 3e-4,
                   seq_clip_high: float = 4e-4) -> tuple[Tensor, dict]:
    r"""DHPO's hybrid ratio in one clipped surrogate. With the token ratio :math:`\rho_t` and GSPO's sequence ratio
    :math:`s = \exp(\frac1{|o|}\sum_t\log\rho_t)`, each clipped in its own trust region, and the mixing weight w:

    .. math::
        h = w\rho_t + (1-w)s,\quad \hat h = w\,\mathrm{clip}(\rho_t, 1-\epsilon_l, 1+\epsilon_h)
        + (1-w)\,\mathrm{clip}(s, 1-\delta_l, 1+\delta_h),\quad \ell = \max(-Ah,\ -A\hat h)

    ``token_weight`` w (0.5: the paper's averaging variant; its entropy-guided per-token weights are not
    implemented); token bounds ``clip_low``/``clip_high`` (PPO's), sequence bounds ``seq_clip_*`` (GSPO's 3e-4 /
    4e-4). w = 1 is GRPO's surrogate, w = 0 GSPO's."""
    maskb = _check(log_ratio, mask)
    if not 0.0 <= token_weight <= 1.0:
        raise ValueError(f"DHPO token_weight must be in [0, 1], got {token_weight}")
    eh = clip_low if clip_high is None else clip_high
    adv = _per_token(advantages, log_ratio)
    mf = maskb.to(log_ratio.dtype)
    seq_lr = (log_ratio * mf).sum(1, keepdim=True) / mf.sum(1, keepdim=True).clamp_min(1)
    rt, rs = torch.exp(log_ratio), torch.exp(seq_lr).expand_as(log_ratio)
    h = token_weight * rt + (1 - token_weight) * rs
    hc = (token_weight * rt.clamp(1 - clip_low, 1 + eh)
          + (1 - token_weight) * rs.clamp(1 - seq_clip_low, 1 + seq_clip_high))
    pg = torch.maximum(-adv * h, -adv * hc)
    with torch.no_grad():
        clipped = ((-adv * hc > -adv * h) & maskb).to(log_ratio.dtype)
    return pg, {"clip_frac": masked_mean(clipped, maskb).item()}


def balanced_counts(advantages: Tensor, mask: Tensor) -> dict[str, float]:
    """Counts :func:`balanced_aggregate` normalises by, over the rows given (sum them over micro-batches and
    processes for a step): ``pos_tokens`` / ``neg_tokens`` (loss tokens of rows with A > 0 / A < 0),
    ``pos_seqs`` / ``neg_seqs`` (those rows with >= 1 loss token) and ``seqs`` (every row with a loss token)."""
    adv = advantages if advantages.dim() == 1 else advantages.sum(1)  # a row's sign (per-token A: its sum's)
    lens = mask.bool().sum(1)
    has = lens > 0
    pos, neg = (adv > 0) & has, (adv < 0) & has
    return {"pos_tokens": float(lens[pos].sum()), "neg_tokens": float(lens[neg].sum()),
            "pos_seqs": float(pos.sum()), "neg_seqs": float(neg.sum()), "seqs": float(has.sum())}


def balanced_aggregate(per_token_loss: Tensor, mask: Tensor, advantages: Tensor,
                       counts: dict[str, float] | None = None) -> Tensor:
    r"""Balanced Aggregation: token means over the positive-advantage and negative-advantage responses apart,
    mixed with the shares of sequences of each sign:

    .. math::
        L = \frac{N^+}{N}\cdot\frac{\sum_{i\in +}\sum_t m\ell}{T^+} + \frac{N^-}{N}\cdot\frac{\sum_{i\in -}\sum_t
        m\ell}{T^-}

    (:math:`T^\pm` loss tokens, :math:`N^\pm` sequences of each sign, N all sequences with a loss token: rows with
    A = 0 carry no policy gradient and only dilute both halves, as in a sequence mean). Inside a sign every token
    weighs the same (no down-weighting of long responses); between signs the weights follow sequence counts, so the
    long wrong answers cannot outweigh the short right ones by their token count (token mean's sign-length coupling).
    ``counts``: the step's :func:`balanced_counts` summed over every micro-batch and process (a micro-batch's value
    is then its exact share of the step's loss); None = this batch's own."""
    c = balanced_counts(advantages, mask) if counts is None else counts
    adv = advantages if advantages.dim() == 1 else advantages.sum(1)
    m = mask.to(per_token_loss.dtype)
    row = (per_token_loss * m).sum(1)
    n = max(c["seqs"], 1.0)
    out = per_token_loss.sum() * 0.0
    if c["pos_tokens"] > 0:
        out = out + (c["pos_seqs"] / n) * row[adv > 0].sum() / c["pos_tokens"]
    if c["neg_tokens"] > 0:
        out = out + (c["neg_seqs"] / n) * row[adv < 0].sum() / c["neg_tokens"]
    return out


def kl_schedule(step: int, start: float, end: float, steps: int,
                shape: Literal["linear", "cosine", "constant"] = "linear", warmup: int = 0) -> float:
    r"""The KL weight :math:`\beta(s)` at step s (from 0): ``start`` for the first ``warmup`` steps, then from
    ``start`` to ``end`` over ``steps`` steps, ``end`` after.

    * linear: :math:`\beta = b_0 + (b_1-b_0)\,u`, :math:`u = \min(1, (s-w)/S)`;
    * cosine: :math:`\beta = b_1 + (b_0-b_1)\,\tfrac12(1+\cos\pi u)`;
    * constant: :math:`\beta = b_1` from the end of the warm-up."""
    if steps < 1 or warmup < 0 or start < 0 or end < 0:
        raise ValueError(f"kl_schedule needs steps >= 1, warmup >= 0 and weights >= 0, got steps={steps}, "
                         f"warmup={warmup}, start={start}, end={end}")
    if step < warmup:
        return float(start)
    u = min(1.0, (step - warmup) / steps)
    if shape == "linear":
        return float(start + (end - start) * u)
    if shape == "cosine":
        return float(end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * u)))
    if shape == "constant":
        return float(end)
    raise ValueError(f"unknown KL schedule shape {shape!r}")
