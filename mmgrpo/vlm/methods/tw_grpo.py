"""TW-GRPO: token weights from the intra-group divergence of the old policy's per-position distributions.

``methods.tw_grpo.enabled``: the precompute forward returns logits (or the chunked head's inputs,
``mmgrpo.vlm.models.chunked``) and :func:`tw_token_weights` turns each group's into (N, T) weights in [1, alpha]
that multiply the per-token loss (``rb.token_weights``). Needs old log-probs even with one iteration.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from mmgrpo.vlm.methods.base import VLMMethod
from mmgrpo.vlm.models.chunked import HeadInputs, chunk_logits, head_dtype, suppress_index

__all__ = ["TWGRPO", "tw_token_weights", "chunked_tw_token_weights", "tw_token_weights_from"]


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


@torch.no_grad()
def chunked_tw_token_weights(hidden: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor, group_ids,
                             alpha: float = 1.7, clamp: float = 11.0, bias: torch.Tensor | None = None,
                             temperature: float = 1.0, suppress_token_ids: Sequence[int] | None = None,
                             chunk_size: int = 1024, compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """:func:`tw_token_weights` from hidden states, one chunk of positions per group at a time.

    hidden (N, T, H), mask (N, T), group_ids (N,).  The divergence at position t needs the G distributions of a
    group at t together, so a chunk is G rows x ``chunk_size // G`` positions (at least one position).  Same
    formula and float64 arithmetic as ``tw_token_weights``; its support V' (columns finite somewhere) is the
    vocabulary minus ``suppress_token_ids`` here (the only columns that are -inf).  Returns (N, T) float32.
    """
    if hidden.dim() != 3 or hidden.shape[:2] != mask.shape:
        raise ValueError(f"hidden must be (N, T, H) matching mask {tuple(mask.shape)}, got {tuple(hidden.shape)}")
    cdt = compute_dtype or head_dtype(hidden, weight)
    w = weight.to(cdt)
    b = None if bias is None else bias.to(cdt)
    sup = suppress_index(suppress_token_ids, hidden.device)
    keep = torch.ones(weight.shape[0], dtype=torch.bool, device=hidden.device)
    if sup is not None:
        keep[sup] = False
    n_keep = int(keep.sum())
    log_uniform = -math.log(n_keep)
    gid = torch.as_tensor(group_ids, device=hidden.device)
    maskb = mask.to(hidden.device).bool()
    out = torch.ones(mask.shape, dtype=torch.float32, device=hidden.device)
    for g in torch.unique(gid).tolist():
        rows = (gid == g).nonzero().flatten()
        mg_all = maskb[rows]
        Tg = int(mg_all.sum(1).max().item()) if mg_all.any() else 0
        if Tg == 0:
            continue
        step = max(1, int(chunk_size) // len(rows))
        d = torch.empty(Tg, dtype=torch.float64, device=hidden.device)
        for t0 in range(0, Tg, step):
            t1 = min(Tg, t0 + step)
            h = hidden[rows, t0:t1].to(cdt)  # (G, c, H)
            x = chunk_logits(h.reshape(-1, h.shape[-1]), w, b, temperature, sup)
            lp = torch.log_softmax(x, -1)[:, keep].double().view(len(rows), t1 - t0, n_keep)
            del x
            mg = mg_all[:, t0:t1].unsqueeze(-1)
            lp = torch.where(mg, lp, lp.new_full((), log_uniform))  # past a sequence's end: uniform
            lp = torch.nan_to_num(lp, neginf=-1e4)
            delta = (lp.mean(0, keepdim=True) - lp).clamp(-clamp, clamp)
            d[t0:t1] = (torch.exp(delta) - delta - 1.0).sum(-1).mean(0)
            del lp, delta
        lo, hi = d.min(), d.max()
        norm = (d - lo) / (hi - lo) if hi > lo else torch.zeros_like(d)
        out[rows, :Tg] = (1.0 + (alpha - 1.0) * norm).float().unsqueeze(0).expand(len(rows), -1)
    return out


def tw_token_weights_from(logits_or_head, mask, group_ids, alpha: float = 1.7, clamp: float = 11.0) -> Tensor:
    """TW-GRPO weights from either full (temperature-scaled, suppressed) logits or a
    :class:`~mmgrpo.vlm.models.chunked.HeadInputs` (then chunked: one block of positions per group at a time)."""
    if isinstance(logits_or_head, HeadInputs):
        h = logits_or_head
        return chunked_tw_token_weights(h.hidden.detach(), h.weight.detach(), mask, group_ids, alpha, clamp,
                                        None if h.bias is None else h.bias.detach(), h.temperature,
                                        h.suppress_token_ids, h.chunk_size, h.dtype)
    return tw_token_weights(torch.log_softmax(logits_or_head.float(), -1), mask, group_ids, alpha, clamp)


class TWGRPO(VLMMethod):
    name = "tw_grpo"
    needs_whole_groups = True
    needs_old_logp = True
    needs_logits = True

    def on_logits(self, rb, idx, logits, lp):
        if rb.token_weights is None:  # the first micro-batch of the step: every weight starts at 1
            rb.token_weights = torch.ones(rb.completion_ids.shape)
        T, c = lp.shape[1], self.cfg.methods.tw_grpo
        wt = tw_token_weights_from(logits, rb.completion_mask[idx, :T].to(lp.device), rb.group_ids[idx].to(lp.device),
                                   c.alpha, c.clamp)
        rb.token_weights[idx, :T] = wt.cpu()

    def end_of_step(self, rb, m):
        if rb.token_weights is not None and rb.n:  # (x IS weights with vLLM)
            tw = rb.token_weights[rb.completion_mask.bool()]
            m["twgrpo/weight_mean"], m["twgrpo/weight_max"] = float(tw.mean()), float(tw.max())
