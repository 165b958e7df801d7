r"""Per-token entropy: logging and high-entropy-token masking ("Beyond the 80/20 Rule", Wang et al. 2025,
arXiv 2506.01939; TRL ``top_entropy_quantile``).

Entropy of position t of completion i under the sampling distribution (temperature-scaled, suppressed ids
excluded): :math:`H_{i,t} = -\sum_v p_v\log p_v`. It is computed chunked
(:func:`mmgrpo.vlm.models.chunked.token_entropy_from`: at most one (chunk, V) block of logits at a time, never a
full-vocabulary copy) and detached: the entropy only selects tokens, it is not optimised.

**Masking** keeps the policy-gradient term of the top-ρ fraction of completion tokens by entropy ("forking
tokens"); the paper's best setting is ρ = 0.2:

.. math::
    \tau = \text{quantile}_{1-\rho}\{H_{i,t} : m_{i,t}=1\},\qquad k_{i,t} = m_{i,t}\,[H_{i,t}\ge\tau]

with ``torch.quantile``'s linear interpolation, as TRL. Tokens tied at τ are all kept, so slightly more than ρ
can survive; ρ = 1 keeps every token. As in TRL the mask multiplies only the policy term (the KL term, if any,
still covers every token) and the loss normaliser still counts every completion token: a masked token
contributes exactly zero loss and zero gradient, it does not re-weight the others.

Choices: the quantile is taken over the tokens the caller passes: the trainer passes one forward's rows
(a micro-batch, as TRL does per micro-batch; TRL also gathers across processes, which a caller can do by
concatenating before calling). Rows that are masked out entirely (injected ground truths, truncated completions
under ``mask_truncated_completions``) do not enter the quantile when the caller zeroes them in ``mask``.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["entropy_threshold", "high_entropy_mask", "entropy_metrics"]


def entropy_threshold(entropy: Tensor, mask: Tensor, rho: float) -> Tensor:
    """The (1 - rho) quantile of the entropies where ``mask`` is set (scalar float32; +inf if no token)."""
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho (top_entropy_quantile) must be in (0, 1], got {rho}")
    if entropy.shape != mask.shape:
        raise ValueError(f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} must match")
    vals = entropy.detach()[mask.bool()].float()
    if vals.numel() == 0:
        return torch.tensor(float("inf"))
    return torch.quantile(vals, 1.0 - rho)


def high_entropy_mask(entropy: Tensor, mask: Tensor, rho: float) -> Tensor:
    """(N, T) bool: completion tokens whose entropy is >= the (1 - rho) quantile of ``entropy[mask]``."""
    tau = entropy_threshold(entropy, mask, rho)
    return (entropy.detach().float() >= tau.to(entropy.device)) & mask.bool()


def entropy_metrics(entropy: Tensor, mask: Tensor, kept: Tensor | None = None) -> dict[str, float]:
    """Logging: ``entropy/mean``, ``entropy/min``, ``entropy/max``, ``entropy/p80`` over completion tokens; with
    ``kept`` (a :func:`high_entropy_mask`) also ``entropy/kept_frac`` and ``entropy/kept_mean``."""
    m = mask.bool()
    vals = entropy.detach()[m].float()
    if vals.numel() == 0:
        return {}
    out = {"entropy/mean": float(vals.mean()), "entropy/min": float(vals.min()), "entropy/max": float(vals.max()),
           "entropy/p80": float(torch.quantile(vals, 0.8))}
    if kept is not None:
        k = kept.bool() & m
        out["entropy/kept_frac"] = float(k.sum()) / float(m.sum())
        out["entropy/kept_mean"] = float(entropy.detach()[k].float().mean()) if k.any() else 0.0
    return out


# ----------------------------------------------------------------------------------------------- trainer hook
from mmgrpo.vlm.methods.base import VLMMethod  # noqa: E402  (the pure functions above need no trainer)


class TokenEntropy(VLMMethod):
    """``methods.entropy.enabled``: per-token entropy of the old policy (= the policy at the step's first update)
    from the precompute forward, chunked, logged as ``entropy/*``; with ``methods.entropy.top_quantile`` < 1 only
    the top-ρ tokens by entropy keep their policy-gradient term (``rb.token_weights`` multiplied by the 0/1 mask;
    the KL term and the loss normaliser are unchanged). The quantile runs over this process's loss tokens of
    the step (TRL: per micro-batch, gathered over processes)."""

    name = "entropy"
    needs_old_logp = True
    needs_logits = True

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.rho = cfg.methods.entropy.top_quantile
        if not 0.0 < self.rho <= 1.0:
            raise ValueError(f"methods.entropy.top_quantile must be in (0, 1], got {self.rho}")
        self._m: dict[str, float] = {}

    def on_logits(self, rb, idx, logits, lp):
        from mmgrpo.vlm.models.chunked import token_entropy_from

        if getattr(rb, "entropy", None) is None:  # the first micro-batch of the step
            rb.entropy = torch.zeros(rb.completion_ids.shape)
        T = lp.shape[1]
        ent = token_entropy_from(logits, rb.completion_mask[idx, :T].to(lp.device),
                                 max(1, self.cfg.algo.logprob_chunk_size or 1024))
        rb.entropy[idx, :T] = ent.float().cpu()

    def on_logprobs(self, rb):
        if getattr(rb, "entropy", None) is None:  # no row this step: nothing was forwarded
            rb.entropy = torch.zeros(rb.completion_ids.shape)
        mask = rb.completion_mask.bool().clone()
        if self.cfg.rollout.mask_truncated_completions:
            mask[rb.truncated] = False
        keep = None
        if self.rho < 1.0:
            keep = high_entropy_mask(rb.entropy, mask, self.rho)
            w = keep.float()
            rb.token_weights = w if rb.token_weights is None else rb.token_weights * w
        self._m = entropy_metrics(rb.entropy, mask, keep)

    def end_of_step(self, rb, m):
        m.update(self._m)
