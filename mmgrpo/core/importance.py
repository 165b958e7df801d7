"""Truncated importance sampling between a rollout engine and the trainer (TRL's vLLM correction).

An engine such as vLLM samples with its own kernels (and bf16 / fp8 weights), so its sampling distribution
:math:`\\pi_{engine}` differs slightly from the trainer's :math:`\\pi_{old}` that the PPO ratio is taken against.
TRL corrects this per token with

.. math:: w_t = \\min\\big(\\exp(\\log\\pi_{old}(o_t) - \\log\\pi_{engine}(o_t)),\\; C\\big)

and multiplies the per-token policy loss by :math:`w_t` (before the KL term is added), ``C`` being
``vllm_importance_sampling_cap``.  The weight is a constant (no gradient).  Here ``w`` is handed to
the policy loss (:func:`mmgrpo.vlm.methods.base.grpo_loss`) through ``token_weights``, which multiplies exactly that
per-token policy term.
"""
from __future__ import annotations

import torch
from torch import Tensor


def truncated_is_weights(trainer_logp: Tensor, engine_logp: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Per-token ``min(exp(trainer_logp - engine_logp), cap)``; 1 where ``mask`` is 0.

    trainer_logp, engine_logp, mask: (N, T).  ``cap`` > 0.  Returns float32 (N, T), detached.
    Positions outside the mask (padding, rows without engine log-probs such as injected off-policy rows) get
    weight 1 so multiplying them in changes nothing.
    """
    if trainer_logp.shape != engine_logp.shape or trainer_logp.shape != mask.shape:
        raise ValueError(f"trainer_logp {tuple(trainer_logp.shape)}, engine_logp {tuple(engine_logp.shape)} and "
                         f"mask {tuple(mask.shape)} must have the same (N, T) shape")
    if not cap > 0:
        raise ValueError(f"importance-sampling cap must be > 0, got {cap}")
    m = mask.bool()
    d = (trainer_logp.detach().float() - engine_logp.detach().float()).masked_fill(~m, 0.0)
    return torch.exp(d).clamp(max=float(cap)).masked_fill(~m, 1.0)


def is_weight_metrics(weights: Tensor, mask: Tensor, cap: float) -> dict[str, float]:
    """Diagnostics over masked tokens: mean / min / max weight and the fraction truncated at ``cap``."""
    w = weights[mask.bool()]
    if not w.numel():
        return {}
    return {"rollout/is_weight_mean": float(w.mean()), "rollout/is_weight_min": float(w.min()),
            "rollout/is_weight_max": float(w.max()),
            "rollout/is_truncated_frac": float((w >= float(cap)).float().mean())}


__all__ = ["truncated_is_weights", "is_weight_metrics"]
