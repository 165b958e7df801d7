"""Policy losses, loss aggregation and KL estimators.

The same functions serve both front-ends: for a VLM the second axis is the completion token t; for a
flow-matching generator it is the denoising step k (one Gaussian action per step). Shapes:

* ``logp``, ``old_logp``, ``ref_logp``, ``mask``, ``token_weights``: (N, T)
* ``advantages``: (N,) (broadcast over T) or (N, T) (per-step advantages, e.g. TP-GRPO)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "bnpo"]
KLEstimator = Literal["k1", "k2", "k3"]

__all__ = ["PolicyLossOutput", "aggregate_loss", "kl_penalty", "policy_loss", "masked_mean"]


@dataclass
class PolicyLossOutput:
    """``loss``: scalar to backward. ``metrics``: floats for logging. ``per_token_loss``: (N, T), masked."""

    loss: Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    per_token_loss: Tensor | None = None


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over entries where ``mask`` is true (0 if there are none)."""
    m = mask.to(x.dtype)
    if dim is None:
        return (x * m).sum() / m.sum().clamp_min(1)
    return (x * m).sum(dim) / m.sum(dim).clamp_min(1)


def aggregate_loss(
    per_token_loss: Tensor,
    mask: Tensor,
    mode: Aggregation = "token_mean",
    max_len: int | None = None,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
) -> Tensor:
    r"""Reduce an (N, T) per-token loss to a scalar. This choice sets the length bias of GRPO.

    With :math:`m_{i,t}` the mask and :math:`|o_i| = \sum_t m_{i,t}`:

    * ``"token_mean"`` (DAPO; TRL ``dapo``): :math:`\sum_{i,t} m\ell / M` where M is ``num_tokens`` if given (the
      token count of the *global accumulated* batch, so that the sum of the per-micro-batch/per-process losses
      equals the loss of the whole batch) and the local token count otherwise. Every token weighs 1/M.
    * ``"bnpo"``: the same over the local batch only (M = local token count, ``num_tokens`` ignored).
    * ``"seq_mean_token_mean"`` (original GRPO; verl ``seq-mean-token-mean``):
      :math:`\frac1{N'}\sum_i \frac1{|o_i|}\sum_t m\ell` with N' = ``num_sequences`` or the number of local
      sequences with at least one token. Token weight 1/(N'|o_i|): short sequences weigh more per token.
    * ``"seq_mean_token_sum_norm"`` (Dr.GRPO; verl ``seq-mean-token-sum-norm``):
      :math:`\sum_{i,t} m\ell / (N' L)` with L = ``max_len`` (default T). Every token weighs 1/(N'L).
    """
    m = mask.to(per_token_loss.dtype)
    masked = per_token_loss * m
    if mode == "token_mean":
        denom = m.sum() if num_tokens is None else torch.as_tensor(float(num_tokens), dtype=m.dtype)
        return masked.sum() / denom.clamp_min(1)
    if mode == "bnpo":
        return masked.sum() / m.sum().clamp_min(1)
    lens = m.sum(dim=1)
    n_seq = (lens > 0).sum().to(m.dtype) if num_sequences is None else torch.as_tensor(
        float(num_sequences), dtype=m.dtype)
    if mode == "seq_mean_token_mean":
        per_seq = masked.sum(dim=1) / lens.clamp_min(1)
        return per_seq.sum() / n_seq.clamp_min(1)
    if mode == "seq_mean_token_sum_norm":
        L = float(max_len) if max_len is not None else float(per_token_loss.shape[1])
        return masked.sum() / (n_seq.clamp_min(1) * L)
    raise ValueError(f"unknown aggregation mode {mode!r}")


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: KLEstimator = "k3", clamp: float | None = 10.0) -> Tensor:
    r"""Per-token estimators of KL(π_θ ‖ π_ref) from samples of π_θ (Schulman's k1/k2/k3).

    With :math:`\log r = \log\pi_{ref}-\log\pi_\theta`:

    * k1 = :math:`-\log r` (unbiased, high variance, can be negative);
    * k2 = :math:`\tfrac12(\log r)^2`;
    * k3 = :math:`e^{\log r}-\log r-1 \ge 0` (unbiased, low variance; verl/EasyR1 ``low_var_kl``).

    For k3, ``log r`` is clamped to ±20 before the exponential and the result to ``[0, clamp]`` (verl clamps
    to ±10) so one degenerate token cannot produce inf. ``clamp=None`` disables the output clamp.
    """
    log_r = ref_logp - logp
    if estimator == "k1":
        kl = -log_r
    elif estimator == "k2":
        kl = 0.5 * log_r.pow(2)
    elif estimator == "k3":
        lr = log_r.clamp(-20.0, 20.0)
        kl = torch.exp(lr) - lr - 1.0
        if clamp is not None:
            kl = kl.clamp(0.0, clamp)
        return kl
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}")
    if clamp is not None:
        kl = kl.clamp(-clamp, clamp)
    return kl


def _entropy_from_logits(logits: Tensor) -> Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _group_normalise(x: Tensor, group_ids: Tensor, eps: float) -> Tensor:
    """(x - mean_g) / (std_g + eps) with a sqrt that stays differentiable at zero variance."""
    uniq, inv = torch.unique(group_ids, return_inverse=True)
    g = uniq.numel()
    cnt = torch.zeros(g, dtype=x.dtype, device=x.device).scatter_add(0, inv, torch.ones_like(x))
    mean = torch.zeros(g, dtype=x.dtype, device=x.device).scatter_add(0, inv, x) / cnt
    dev = x - mean[inv]
    var = torch.zeros(g, dtype=x.dtype, device=x.device).scatter_add(0, inv, dev * dev) / (cnt - 1).clamp_min(1)
    std = torch.sqrt(var + 1e-20)  # +1e-20: d sqrt/d var finite at var=0 (all ratios 1 on the first step)
    return dev / (std[inv] + eps)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    ratio_level: Literal["token", "sequence"] = "token",
    loss_type: Literal["clip", "reg"] = "clip",
    agg: Aggregation = "token_mean",
    token_weights: Tensor | None = None,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    group_ids: Tensor | None = None,
    logits: Tensor | None = None,
    max_len: int | None = None,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
    reg_eps: float = 1e-4,
) -> PolicyLossOutput:
    r"""GRPO policy loss on per-token (or per-denoising-step) log-probs.

    **PPO clip** (``loss_type="clip"``), ratio :math:`\rho = \exp(\log\pi_\theta-\log\pi_{old})`:

    .. math:: \ell = \max\big(-A\rho,\; -A\,\text{clip}(\rho, 1-\epsilon_{low}, 1+\epsilon_{high})\big)

    ``clip_high`` defaults to ``clip_low`` (symmetric); a larger value is DAPO's clip-higher. ``dual_clip=c``
    (c > 1) additionally caps the loss of negative-advantage tokens at :math:`-cA` (dual-clip PPO / EasyR1).
    ``ratio_level="sequence"`` is GSPO: every token of sequence i uses
    :math:`\rho_i=\exp\big(\frac1{|o_i|}\sum_t m(\log\pi_\theta-\log\pi_{old})\big)`.
    ``token_weights`` (TW-GRPO) multiply the per-token policy term before aggregation.

    **Reg-GRPO** (``loss_type="reg"``, DeepVideo-R1): with the sequence log-ratio
    :math:`\rho_i=\sum_t m(\log\pi_\theta-\log\pi_{old})` normalised within its group,
    :math:`\hat A_i = (\rho_i-\bar\rho_g)/(\text{std}_g\rho+\epsilon)`, the loss is
    :math:`\frac1N\sum_i (A_i-\hat A_i)^2` (no clip, no min; needs ``group_ids``; advantages must be (N,)).
    At :math:`\pi_\theta=\pi_{old}` all :math:`\rho_i` are 0, :math:`\hat A=0`, and the normalisation makes the
    gradient scale as 1/ε: use gradient clipping.

    **KL** (``kl_coef > 0``, needs ``ref_logp``): :math:`\beta\cdot` :func:`kl_penalty` is added per token
    before aggregation (for Reg-GRPO it is aggregated separately and added).

    Aggregation: see :func:`aggregate_loss`.

    Returns:
        :class:`PolicyLossOutput` with ``metrics``: ``clip_frac_low`` (A<0 tokens below 1−ε_low),
        ``clip_frac_high`` (A>0 tokens above 1+ε_high), ``clip_frac``, ``dual_clip_frac``, ``approx_kl``
        (½·mean (log ρ)², as Flow-GRPO logs it), ``ratio_mean/min/max``, ``kl`` (if a reference is given),
        ``entropy`` (if ``logits`` (N, T, V) are given), ``num_tokens``.
    """
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask "
                         f"{tuple(mask.shape)} must have the same (N, T) shape")
    maskb = mask.bool()
    mf = maskb.to(logp.dtype)
    old_logp = old_logp.detach()
    adv = advantages.to(logp.dtype)
    if adv.dim() == 1:
        adv_t = adv.unsqueeze(1).expand_as(logp)
    elif adv.shape == logp.shape:
        adv_t = adv
    else:
        raise ValueError(f"advantages must be (N,) or {tuple(logp.shape)}, got {tuple(adv.shape)}")
    # Masked-out positions may hold garbage (padding); zero them so exp() can't overflow into NaN gradients.
    log_ratio = torch.where(maskb, logp - old_logp, torch.zeros_like(logp))

    metrics: dict[str, float] = {}
    kl_t = None
    if kl_coef != 0.0:
        if ref_logp is None:
            raise ValueError("kl_coef != 0 needs ref_logp")
        kl_t = torch.where(maskb, kl_penalty(logp, ref_logp.detach(), kl_estimator), torch.zeros_like(logp))
        metrics["kl"] = masked_mean(kl_t, maskb).item()
    elif ref_logp is not None:
        with torch.no_grad():
            metrics["kl"] = masked_mean(kl_penalty(logp, ref_logp, kl_estimator), maskb).item()

    if loss_type == "reg":
        if group_ids is None:
            raise ValueError("loss_type='reg' (Reg-GRPO) needs group_ids")
        if adv.dim() != 1:
            raise ValueError("Reg-GRPO needs one advantage per sequence (N,)")
        seq_lr = (log_ratio * mf).sum(dim=1)
        a_hat = _group_normalise(seq_lr, torch.as_tensor(group_ids, device=logp.device), reg_eps)
        has_tok = mf.sum(dim=1) > 0
        reg = ((adv - a_hat) ** 2)[has_tok]
        loss = reg.mean() if reg.numel() else logp.sum() * 0.0
        if kl_t is not None:
            loss = loss + kl_coef * aggregate_loss(kl_t, maskb, agg, max_len, num_tokens, num_sequences)
        per_token = None
    elif loss_type == "clip":
        eps_lo = clip_low
        eps_hi = clip_low if clip_high is None else clip_high
        if ratio_level == "sequence":
            seq_lr = (log_ratio * mf).sum(dim=1) / mf.sum(dim=1).clamp_min(1)
            log_ratio_used = seq_lr.unsqueeze(1).expand_as(logp)
        elif ratio_level == "token":
            log_ratio_used = log_ratio
        else:
            raise ValueError(f"unknown ratio_level {ratio_level!r}")
        ratio = torch.exp(log_ratio_used)
        pg1 = -adv_t * ratio
        pg2 = -adv_t * torch.clamp(ratio, 1.0 - eps_lo, 1.0 + eps_hi)
        pg = torch.maximum(pg1, pg2)
        if dual_clip is not None:
            if dual_clip <= 1.0:
                raise ValueError("dual_clip must be > 1")
            capped = torch.minimum(pg, -adv_t * dual_clip)
            dual_active = (adv_t < 0) & (pg > -adv_t * dual_clip) & maskb
            pg = torch.where(adv_t < 0, capped, pg)
            metrics["dual_clip_frac"] = masked_mean(dual_active.to(logp.dtype), maskb).item()
        if token_weights is not None:
            pg = pg * token_weights.to(pg.dtype).detach()
        per_token = pg if kl_t is None else pg + kl_coef * kl_t
        per_token = torch.where(maskb, per_token, torch.zeros_like(per_token))
        loss = aggregate_loss(per_token, maskb, agg, max_len, num_tokens, num_sequences)
        with torch.no_grad():
            low = ((ratio < 1.0 - eps_lo) & (adv_t < 0) & maskb).to(logp.dtype)
            high = ((ratio > 1.0 + eps_hi) & (adv_t > 0) & maskb).to(logp.dtype)
            metrics["clip_frac_low"] = masked_mean(low, maskb).item()
            metrics["clip_frac_high"] = masked_mean(high, maskb).item()
            metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}")

    with torch.no_grad():
        n_tok = int(maskb.sum().item())
        metrics["num_tokens"] = float(n_tok)
        metrics["approx_kl"] = (0.5 * masked_mean(log_ratio.pow(2), maskb)).item()
        if n_tok:
            r = torch.exp(log_ratio[maskb])
            metrics["ratio_mean"] = r.mean().item()
            metrics["ratio_min"] = r.min().item()
            metrics["ratio_max"] = r.max().item()
        if logits is not None:
            metrics["entropy"] = masked_mean(_entropy_from_logits(logits), maskb).item()
    return PolicyLossOutput(loss=loss, metrics=metrics, per_token_loss=per_token)
