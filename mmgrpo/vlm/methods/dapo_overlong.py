r"""DAPO overlong reward shaping (Yu et al. 2025, arXiv 2503.14476, "soft overlong punishment").

A length-aware penalty added to the reward (not only masking truncated completions out of the loss, which is
``rollout.mask_truncated_completions``). With :math:`L_{max}` the maximum completion length and :math:`L_{cache}`
the punishment interval:

.. math::
    R_{length}(y) = \begin{cases} 0 & |y| \le L_{max}-L_{cache} \\
    \dfrac{(L_{max}-L_{cache}) - |y|}{L_{cache}} & L_{max}-L_{cache} < |y| \le L_{max} \\
    -1 & L_{max} < |y| \end{cases}

scaled by ``factor`` (verl's ``overlong_buffer.penalty_factor``, 1.0 in DAPO). DAPO's recipe: L_max = 20480,
L_cache = 4096 (so the soft zone starts at 16384). A completion cut at ``max_new_tokens`` has |y| = L_max and
gets exactly ``-factor`` (the same value as the third case: the sampler never returns more tokens).

Choices: |y| counts the completion's tokens **including** the EOS token (the completion mask), as verl's
``response_length``; ``L_max`` defaults to the rollout's ``max_new_tokens`` (the engine's cap, as in DAPO where
L_max is the max response length). The penalty enters the reward before group normalisation (DAPO adds it to the
accuracy score), so it only moves a row relative to its group.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["overlong_penalty", "completion_lengths"]


def completion_lengths(mask: Tensor) -> Tensor:
    """(N, T) completion mask -> (N,) int64 token counts (EOS included when the mask includes it)."""
    m = torch.as_tensor(mask)
    if m.dim() != 2:
        raise ValueError(f"mask must be (N, T), got {tuple(m.shape)}")
    return m.bool().sum(1)


def overlong_penalty(lengths: Tensor, max_len: int, cache_len: int, factor: float = 1.0) -> Tensor:
    r"""DAPO soft overlong penalty per completion, (N,) float32, in [-factor, 0]. See the module docstring.

    lengths: (N,) completion token counts; max_len: :math:`L_{max}`; cache_len: :math:`L_{cache}`, in
    (0, max_len]; factor: scale of the penalty (>= 0)."""
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if not 0 < cache_len <= max_len:
        raise ValueError(f"cache_len must be in (0, max_len={max_len}], got {cache_len}")
    if factor < 0:
        raise ValueError(f"factor must be >= 0, got {factor}")
    L = torch.as_tensor(lengths, dtype=torch.float64)
    expected = float(max_len - cache_len)
    soft = (expected - L) / float(cache_len)
    pen = torch.where(L <= expected, torch.zeros_like(L), soft)
    pen = torch.where(L > max_len, torch.full_like(L, -1.0), pen)
    return (pen * factor).to(torch.float32)


# ----------------------------------------------------------------------------------------------- trainer hook
from mmgrpo.vlm.methods.base import VLMMethod  # noqa: E402  (the pure functions above need no trainer)


class DAPOOverlong(VLMMethod):
    """``methods.dapo_overlong.enabled``: adds ``rewards["overlong"]`` = the soft penalty to ``total`` (on-policy
    rows; an injected ground truth is not a sample of the policy and gets 0)."""

    name = "dapo_overlong"

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        o = cfg.methods.dapo_overlong
        self.max_len = o.max_len or cfg.rollout.max_new_tokens
        self.cache_len = o.cache_len or max(1, self.max_len // 5)
        self.factor = o.factor
        overlong_penalty(torch.zeros(1), self.max_len, self.cache_len, self.factor)  # validates the options
        self._m: dict[str, float] = {}

    def on_rewards(self, rb):
        pen = overlong_penalty(completion_lengths(rb.completion_mask), self.max_len, self.cache_len, self.factor)
        pen = torch.where(rb.is_offpolicy, torch.zeros_like(pen), pen)
        rb.rewards["overlong"] = pen
        rb.rewards["total"] = rb.rewards["total"] + pen.to(rb.rewards["total"].dtype)
        onp = ~rb.is_offpolicy
        if onp.any():
            self._m = {"overlong/penalized_frac": float((pen[onp] < 0).float().mean()),
                       "overlong/penalty_mean": float(pen[onp].mean())}

    def end_of_step(self, rb, m):
        m.update(self._m)
