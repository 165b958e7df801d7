"""TW-GRPO: token weights from the intra-group divergence of the old policy's per-position distributions.

``twgrpo.enabled``: the precompute forward returns logits (or the chunked head's inputs,
``mmgrpo.vlm.models.chunked``) and :func:`tw_token_weights` turns each group's into (N, T) weights in [1, alpha]
that multiply the per-token loss (``rb.token_weights``). Needs old log-probs even with one iteration.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from mmgrpo.vlm.methods.base import VLMMethod

__all__ = ["TWGRPO", "tw_token_weights"]


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


class TWGRPO(VLMMethod):
    name = "tw_grpo"
    needs_whole_groups = True
    needs_old_logp = True
    needs_logits = True

    def before_precompute(self, rb):
        rb.token_weights = torch.ones(rb.completion_ids.shape)

    def on_logits(self, rb, idx, logits, lp):
        from mmgrpo.vlm.models.chunked import tw_token_weights_from

        T, c = lp.shape[1], self.cfg.twgrpo
        wt = tw_token_weights_from(logits, rb.completion_mask[idx, :T].to(lp.device), rb.group_ids[idx].to(lp.device),
                                   c.alpha, c.clamp)
        rb.token_weights[idx, :T] = wt.cpu()

    def metrics(self, rb, m):
        if rb.token_weights is not None and rb.n:  # (x IS weights with vLLM)
            tw = rb.token_weights[rb.completion_mask.bool()]
            m["twgrpo/weight_mean"], m["twgrpo/weight_max"] = float(tw.mean()), float(tw.max())
