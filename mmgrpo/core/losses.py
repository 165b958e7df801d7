"""Policy-loss pieces, loss aggregation and KL estimators: small functions that a recipe or a method composes.

The same pieces serve both front-ends: for a VLM the second axis is the completion token t; for a flow-matching
generator it is the denoising step k (one Gaussian action per step). Shapes:

* ``logp``, ``old_logp``, ``ref_logp``, ``mask``, ``token_weights``, log-ratios: (N, T)
* ``advantages``: (N,) (broadcast over T) or (N, T) (per-step advantages, e.g. TP-GRPO)

A GRPO loss is ``aggregate_loss(clipped_surrogate(log_ratio(...), A, ...) [* token weights] [+ beta * masked_kl],
mask, agg)``; GSPO replaces the token log-ratio by :func:`sequence_log_ratio`; Reg-GRPO is :func:`reg_grpo_loss`.
The compositions live with their users: the VLM default loss in :mod:`mmgrpo.vlm.methods.base`, the flow column
loss in :mod:`flow_grpo.train.trainer`, Reg-GRPO in :mod:`mmgrpo.vlm.methods.reg_grpo`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "local_token_mean"]
KLEstimator = Literal["k1", "k2", "k3"]

#: the pointer given for the old aggregation name ``bnpo`` (TRL's name for a local-batch token mean; BNPO the paper
#: is a Beta normalisation of the advantages, ``methods.bnpo``)
RENAMED_BNPO = ("the loss aggregation 'bnpo' is now 'local_token_mean' (TRL's loss_type='bnpo': a token mean over the "
                "local batch); BNPO the paper (Beta-normalised advantages) is methods.bnpo.enabled=true")

__all__ = ["PolicyLossOutput", "aggregate_loss", "kl_penalty", "masked_mean", "log_ratio", "sequence_log_ratio",
           "clipped_surrogate", "masked_kl", "reg_grpo_loss", "ratio_metrics"]


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
    * ``"local_token_mean"`` (TRL ``loss_type="bnpo"``, which is not BNPO the paper): the same over the local batch
      only (M = local token count, ``num_tokens`` ignored). Its old name here, ``bnpo``, is an error naming this one;
      BNPO's Beta-normalised advantages are :func:`mmgrpo.core.advantage_variants.bnpo_advantages`.
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
    if mode == "local_token_mean":
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
    if mode == "bnpo":
        raise ValueError(RENAMED_BNPO)
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


def _per_token(advantages: Tensor, like: Tensor) -> Tensor:
    adv = advantages.to(like.dtype)
    if adv.dim() == 1:
        return adv.unsqueeze(1).expand_as(like)
    if adv.shape == like.shape:
        return adv
    raise ValueError(f"advantages must be (N,) or {tuple(like.shape)}, got {tuple(adv.shape)}")


def log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    r"""(N, T) :math:`\log\pi_\theta-\log\pi_{old}` where ``mask`` is set, 0 elsewhere (padding may hold garbage:
    zeroed so ``exp`` cannot overflow into NaN gradients). ``old_logp`` is detached."""
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask "
                         f"{tuple(mask.shape)} must have the same (N, T) shape")
    maskb = mask.bool()
    return torch.where(maskb, logp - old_logp.detach(), torch.zeros_like(logp))


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    r"""GSPO: every token of sequence i takes the sequence's mean log-ratio
    :math:`\frac1{|o_i|}\sum_t m\,(\log\pi_\theta-\log\pi_{old})` (N, T)."""
    mf = mask.bool().to(log_ratio.dtype)
    seq = (log_ratio * mf).sum(dim=1) / mf.sum(dim=1).clamp_min(1)
    return seq.unsqueeze(1).expand_as(log_ratio)


def clipped_surrogate(log_ratio: Tensor, advantages: Tensor, mask: Tensor, clip_low: float = 0.2,
                      clip_high: float | None = None, dual_clip: float | None = None) -> tuple[Tensor, dict]:
    r"""PPO's clipped surrogate per token, :math:`\ell = \max\big(-A\rho,\; -A\,\text{clip}(\rho, 1-\epsilon_{low},
    1+\epsilon_{high})\big)` with :math:`\rho=e^{\text{log\_ratio}}` (N, T), not masked.

    ``clip_high`` defaults to ``clip_low`` (symmetric); a larger value is DAPO's clip-higher. ``dual_clip=c`` (c > 1)
    additionally caps the loss of negative-advantage tokens at :math:`-cA` (dual-clip PPO / EasyR1). Metrics:
    ``clip_frac_low`` (A<0 tokens below 1-eps_low), ``clip_frac_high`` (A>0 tokens above 1+eps_high), ``clip_frac``,
    ``dual_clip_frac``."""
    maskb = mask.bool()
    adv_t = _per_token(advantages, log_ratio)
    eps_lo = clip_low
    eps_hi = clip_low if clip_high is None else clip_high
    ratio = torch.exp(log_ratio)
    pg1 = -adv_t * ratio
    pg2 = -adv_t * torch.clamp(ratio, 1.0 - eps_lo, 1.0 + eps_hi)
    pg = torch.maximum(pg1, pg2)
    metrics: dict[str, float] = {}
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError("dual_clip must be > 1")
        capped = torch.minimum(pg, -adv_t * dual_clip)
        dual_active = (adv_t < 0) & (pg > -adv_t * dual_clip) & maskb
        pg = torch.where(adv_t < 0, capped, pg)
        metrics["dual_clip_frac"] = masked_mean(dual_active.to(log_ratio.dtype), maskb).item()
    with torch.no_grad():
        low = ((ratio < 1.0 - eps_lo) & (adv_t < 0) & maskb).to(log_ratio.dtype)
        high = ((ratio > 1.0 + eps_hi) & (adv_t > 0) & maskb).to(log_ratio.dtype)
        metrics["clip_frac_low"] = masked_mean(low, maskb).item()
        metrics["clip_frac_high"] = masked_mean(high, maskb).item()
        metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
    return pg, metrics


def masked_kl(logp: Tensor, ref_logp: Tensor, mask: Tensor, estimator: KLEstimator = "k3") -> Tensor:
    """(N, T) :func:`kl_penalty` to the (detached) reference where ``mask`` is set, 0 elsewhere."""
    maskb = mask.bool()
    return torch.where(maskb, kl_penalty(logp, ref_logp.detach(), estimator), torch.zeros_like(logp))


def reg_grpo_loss(log_ratio: Tensor, advantages: Tensor, mask: Tensor, group_ids: Tensor,
                  eps: float = 1e-4) -> Tensor:
    r"""Reg-GRPO (DeepVideo-R1): with the sequence log-ratio :math:`\rho_i=\sum_t m(\log\pi_\theta-\log\pi_{old})`
    normalised within its group, :math:`\hat A_i = (\rho_i-\bar\rho_g)/(\text{std}_g\rho+\epsilon)`, the loss is
    :math:`\frac1{N'}\sum_i (A_i-\hat A_i)^2` over the N' rows with a loss token (no clip, no min; advantages must be
    (N,)). At :math:`\pi_\theta=\pi_{old}` all :math:`\rho_i` are 0, :math:`\hat A=0`, and the normalisation makes the
    gradient scale as 1/eps: use gradient clipping."""
    if advantages.dim() != 1:
        raise ValueError("Reg-GRPO needs one advantage per sequence (N,)")
    if group_ids is None:
        raise ValueError("Reg-GRPO needs the group_ids of the rows")
    mf = mask.bool().to(log_ratio.dtype)
    seq_lr = (log_ratio * mf).sum(dim=1)
    a_hat = _group_normalise(seq_lr, torch.as_tensor(group_ids, device=log_ratio.device), eps)
    has_tok = mf.sum(dim=1) > 0
    reg = ((advantages.to(log_ratio.dtype) - a_hat) ** 2)[has_tok]
    return reg.mean() if reg.numel() else log_ratio.sum() * 0.0


def ratio_metrics(log_ratio: Tensor, mask: Tensor, logits: Tensor | None = None) -> dict[str, float]:
    """``num_tokens``, ``approx_kl`` (1/2 mean (log rho)^2, as Flow-GRPO logs it), ``ratio_mean/min/max`` of the
    token ratios, and ``entropy`` when the (N, T, V) ``logits`` are given."""
    maskb = mask.bool()
    metrics: dict[str, float] = {}
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
    return metrics
