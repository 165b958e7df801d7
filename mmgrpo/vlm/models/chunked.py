"""Token log-probs and entropy without materialising full-vocabulary logits.

The LM head turns final hidden states (N, T, H) into logits (N, T, V); at Qwen's vocabulary (V = 151,936) the fp32
logits of 8 completions x 512 tokens are 2.5 GB, and softmax / backward keep several tensors of that size.  Here the
head is applied to ``chunk_size`` token rows at a time:

* forward: per chunk, logits -> (temperature, suppressed ids) -> log-prob of the target and optionally entropy;
  only (rows,) results are kept;
* backward (``_ChunkedLogProbs``, a custom autograd Function): per chunk, the logits are recomputed and the
  gradient w.r.t. them formed analytically (d logp_y / dx = onehot_y - p;  d H / dx = -p (log p + H)), then
  pushed into the hidden states and accumulated into the head's weight/bias gradient.  So neither pass holds
  more than one chunk of logits (plus the weight gradient, which the full computation needs too).

Numerics match ``rollout.token_logprobs_from_logits`` on the full logits: the same fp32 operations per row, the
logits rounded to the matmul's dtype first exactly as the model's ``lm_head`` would (under autocast: the autocast
dtype; matmuls accumulate in fp32 in either case).  Rows whose mask is 0 are skipped (their log-prob is 0 either
way), which also saves their compute.

Models: ``capture_head_inputs`` reads the hidden states the model's own output head receives (a forward pre-hook
on ``get_output_embeddings()`` that also hands the head an empty slice, so no logits are computed).  It needs a
plain ``nn.Linear`` head with a plain weight; ``chunkable_head`` returns None otherwise (a peft-wrapped head,
FSDP's sharded DTensor weight), and callers then use the full logits.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F


# ----------------------------------------------------------------------------------------------------- kernel
def head_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """dtype the model's lm_head matmul would run in: the autocast dtype if autocast is on, else the inputs'."""
    dev = hidden.device.type
    if dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return torch.promote_types(hidden.dtype, weight.dtype)


def chunk_logits(h, weight, bias, temperature: float, suppress) -> torch.Tensor:
    """(c, V) fp32 temperature-scaled logits with suppressed ids at -inf (as ``token_logprobs_from_logits``)."""
    with torch.autocast(h.device.type, enabled=False):
        x = F.linear(h, weight, bias).float()
    if temperature != 1.0:
        x.div_(temperature)  # in place: x is this call's own matmul output
    if suppress is not None:
        x.index_fill_(-1, suppress, float("-inf"))
    return x


class _ChunkedLogProbs(torch.autograd.Function):
    """(M, H) hidden rows -> (M,) log p(target) and (M,) entropy, one chunk of logits at a time."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, ids, temperature, suppress, chunk, want_entropy):
        M = hidden.shape[0]
        lp = hidden.new_empty(M, dtype=torch.float32)
        ent = hidden.new_zeros(M, dtype=torch.float32)
        for s in range(0, M, chunk):
            x = chunk_logits(hidden[s:s + chunk], weight, bias, temperature, suppress)
            lse = torch.logsumexp(x, -1)
            lp[s:s + chunk] = x.gather(-1, ids[s:s + chunk, None]).squeeze(-1) - lse
            if want_entropy:
                x -= lse[:, None]  # in place: log p
                p = torch.exp(x)
                ent[s:s + chunk] = -torch.special.xlogy(p, p).sum(-1)  # -sum p log p, 0 log 0 = 0
                del p
            del x
        ctx.save_for_backward(hidden, weight, bias, ids)
        ctx.cfg = (temperature, suppress, chunk)
        ctx.set_materialize_grads(False)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        hidden, weight, bias, ids = ctx.saved_tensors
        temperature, suppress, chunk = ctx.cfg
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if g_lp is None and g_ent is None:
            return (None,) * 8
        M = hidden.shape[0]
        d_h = torch.empty_like(hidden) if need_h else None
        d_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        d_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if (need_b and bias is not None) else None
        rows = torch.arange(min(chunk, M), device=hidden.device)
        for s in range(0, M, chunk):
            h = hidden[s:s + chunk]
            c = h.shape[0]
            # in place on one (c, V) buffer where possible: x -> log p -> p -> gradient w.r.t. x
            g = chunk_logits(h, weight, bias, temperature, suppress)
            g -= torch.logsumexp(g, -1, keepdim=True)  # log p
            ent_term = None
            if g_ent is not None:  # d H / dx_v = -p_v (log p_v + H), 0 where p_v = 0
                p = torch.exp(g)
                H = -torch.special.xlogy(p, p).sum(-1, keepdim=True)
                ent_term = g.add(H).mul_(p).nan_to_num_(nan=0.0, neginf=0.0)  # -inf * 0 at suppressed ids
                ent_term.mul_(-g_ent[s:s + c].float()[:, None])
                del p
            g.exp_()  # p
            if g_lp is not None:  # d logp_y / dx_v = [v == y] - p_v
                gl = g_lp[s:s + c].float()
                g.mul_(-gl[:, None])
                g[rows[:c], ids[s:s + c]] += gl
            else:
                g.zero_()
            if ent_term is not None:
                g += ent_term
                del ent_term
            if suppress is not None:  # the full path overwrites those logits: no gradient reaches them
                g.index_fill_(-1, suppress, 0.0)
            if temperature != 1.0:
                g /= temperature
            g = g.to(weight.dtype)
            if need_h:
                d_h[s:s + c] = g @ weight
            if need_w:
                if g.dtype == torch.float32:
                    d_w.addmm_(g.t(), h)
                else:
                    d_w += (g.t() @ h).float()
            if d_b is not None:
                d_b += g.float().sum(0)
            del g
        return (d_h, None if d_w is None else d_w.to(weight.dtype), None if d_b is None else d_b.to(bias.dtype),
                None, None, None, None, None)


def suppress_index(suppress_token_ids, device):
    if not suppress_token_ids:
        return None
    return torch.as_tensor(sorted(set(int(i) for i in suppress_token_ids)), dtype=torch.long, device=device)


def chunked_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor,
                           bias: torch.Tensor | None = None, temperature: float = 1.0,
                           suppress_token_ids: Sequence[int] | None = None, chunk_size: int = 1024,
                           mask: torch.Tensor | None = None, return_entropy: bool = False):
    """Per-token ``log softmax(hidden @ weight.T + bias) / temperature)[ids]`` computed ``chunk_size`` rows at a time.

    hidden (..., H) (the hidden states that predict ``ids``), weight (V, H), bias (V,) or None, ids (...) int.
    ``mask`` (...) optional: rows where it is 0 are not computed and get 0 (as ``lp * mask`` on the full result).
    Returns logp (...) float32 and, with ``return_entropy``, the entropy (...) float32 of the same distribution.
    Gradients (w.r.t. hidden, weight, bias; through logp and entropy) equal the full computation's; at most one
    (chunk_size, V) block of logits exists at any time, in the forward and in the backward.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if hidden.shape[:-1] != ids.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be ids {tuple(ids.shape)} + (H,)")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight {tuple(weight.shape)} must be (V, {hidden.shape[-1]})")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    cdt = head_dtype(hidden, weight)
    shape = ids.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    y = ids.reshape(-1).to(device=h.device, dtype=torch.long)
    sel = None
    if mask is not None:
        if mask.shape != shape:
            raise ValueError(f"mask {tuple(mask.shape)} must match ids {tuple(shape)}")
        sel = mask.reshape(-1).to(h.device).bool()
        h, y = h[sel], y[sel]
    w = weight.to(cdt)
    b = None if bias is None else bias.to(cdt)
    lp, ent = _ChunkedLogProbs.apply(h.to(cdt), w, b, y, float(temperature),
                                     suppress_index(suppress_token_ids, h.device), int(chunk_size),
                                     bool(return_entropy))
    if sel is not None:  # scatter the computed rows back (masked rows: 0, no gradient)
        lp = torch.zeros(sel.shape, dtype=lp.dtype, device=lp.device).masked_scatter(sel, lp)
        ent = torch.zeros(sel.shape, dtype=ent.dtype, device=ent.device).masked_scatter(sel, ent)
    lp, ent = lp.view(shape), ent.view(shape)
    return (lp, ent) if return_entropy else lp


# ----------------------------------------------------------------------------------------------------- models
@dataclass
class HeadInputs:
    """What the output head would turn into logits, kept instead of the logits.

    hidden (N, T, H): the final hidden states predicting completion tokens 0..T-1; weight/bias: the head's;
    temperature / suppress_token_ids: the sampling distribution; dtype: the head's matmul dtype at capture time
    (the autocast dtype if autocast was on).  Returned by ``compute_token_logprobs(..., return_logits=True,
    chunk_size>0)`` in place of the (N, T, V) logits.
    """

    hidden: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    temperature: float
    suppress_token_ids: tuple
    chunk_size: int
    dtype: torch.dtype

    def token_logprobs(self, ids, mask=None, return_entropy=False):
        with torch.autocast(self.hidden.device.type, enabled=False):  # dtype already fixed at capture
            return chunked_token_logprobs(self.hidden.to(self.dtype), self.weight.to(self.dtype), ids,
                                          None if self.bias is None else self.bias.to(self.dtype),
                                          self.temperature, self.suppress_token_ids, self.chunk_size, mask,
                                          return_entropy)

    @torch.no_grad()
    def token_entropy(self, mask=None) -> torch.Tensor:
        """(N, T) float32 entropy of each position's sampling distribution, chunked (no gradient); 0 where
        ``mask`` is 0 (those rows are not computed)."""
        ids = torch.zeros(self.hidden.shape[:-1], dtype=torch.long, device=self.hidden.device)
        return self.token_logprobs(ids, mask, return_entropy=True)[1]



@torch.no_grad()
def token_entropy_from(logits_or_head, mask=None, chunk_size: int = 1024) -> torch.Tensor:
    """Per-token entropy (N, T) float32 of the sampling distribution, no gradient, 0 where ``mask`` is 0.

    From a ``HeadInputs`` (chunked: one (chunk_size, V) block of logits at a time) or from full (N, T, V)
    temperature-scaled, suppressed logits (as ``compute_token_logprobs(return_logits=True)`` returns them), which
    are read ``chunk_size`` positions at a time so no second full-vocabulary tensor is made."""
    if isinstance(logits_or_head, HeadInputs):
        return logits_or_head.token_entropy(mask)
    logits = logits_or_head
    if logits.dim() != 3:
        raise ValueError(f"logits must be (N, T, V), got {tuple(logits.shape)}")
    N, T, V = logits.shape
    flat = logits.reshape(N * T, V)
    out = torch.zeros(N * T, dtype=torch.float32, device=logits.device)
    sel = torch.ones(N * T, dtype=torch.bool, device=logits.device) if mask is None else \
        mask.reshape(-1).to(logits.device).bool()
    rows = sel.nonzero().flatten()
    for s in range(0, rows.numel(), max(1, int(chunk_size))):
        r = rows[s:s + chunk_size]
        x = flat[r].float()
        x = x - torch.logsumexp(x, -1, keepdim=True)
        p = torch.exp(x)
        out[r] = -torch.special.xlogy(p, p).sum(-1)
    return out.view(N, T)


def _unwrap(model):
    m = getattr(model, "module", model)  # DDP / accelerate
    if hasattr(m, "get_base_model"):  # peft
        m = m.get_base_model()
    return m


def chunkable_head(model):
    """The model's output head if chunking applies to it (a plain ``nn.Linear`` with a plain weight), else None."""
    try:
        head = _unwrap(model).get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if type(head) is not torch.nn.Linear or type(head.weight) not in (torch.Tensor, torch.nn.Parameter):
        return None  # peft-wrapped head, FSDP-sharded (DTensor) weight, ...: use the full logits
    return head


@contextlib.contextmanager
def capture_head_inputs(model):
    """Within the block, every forward of ``model`` appends the hidden states its output head receives (after
    ``logits_to_keep`` slicing) to the yielded list and hands the head an empty slice: no logits are computed,
    ``out.logits`` has 0 positions."""
    head = chunkable_head(model)
    if head is None:
        raise TypeError(f"{type(_unwrap(model)).__name__}: output head is not a plain nn.Linear; use full logits")
    store: list[torch.Tensor] = []

    def pre_hook(module, args):
        store.append(args[0])
        return (args[0].narrow(-2, 0, 0),) + tuple(args[1:])

    handle = head.register_forward_pre_hook(pre_hook)
    try:
        yield store
    finally:
        handle.remove()


def head_inputs(model, hidden, temperature, suppress_token_ids, chunk_size) -> HeadInputs:
    head = chunkable_head(model)
    return HeadInputs(hidden, head.weight, head.bias, float(temperature), tuple(suppress_token_ids or ()),
                      int(chunk_size), head_dtype(hidden, head.weight))


__all__ = ["chunked_token_logprobs", "HeadInputs", "chunk_logits", "head_dtype", "suppress_index",
           "token_entropy_from", "token_entropy_with_grad",
           "chunkable_head", "capture_head_inputs", "head_inputs"]


def _rows_entropy(x: torch.Tensor) -> torch.Tensor:
    """(c, V) logits -> (c,) fp32 entropy; ids at -inf (suppressed) contribute 0 with a finite gradient."""
    lp = torch.log_softmax(x.float(), -1)
    p = lp.exp()
    return -(p * torch.where(p > 0, lp, torch.zeros_like(lp))).sum(-1)


def token_entropy_with_grad(logits_or_head, mask: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Per-token entropy (N, T) float32 of the sampling distribution WITH gradient (an entropy bonus in the loss),
    0 where ``mask`` is 0.

    From a ``HeadInputs``: the chunked autograd Function (``_ChunkedLogProbs``, analytic dH/dx = -p (log p + H)),
    one (chunk_size, V) block of logits in the forward and in the backward.  From full (N, T, V) logits (a model
    whose head is not a plain ``nn.Linear``): ``chunk_size`` rows at a time under activation checkpointing, so
    the fp32 softmax of only one chunk exists at a time (the gradient w.r.t. the logits is full-size, as the
    log-prob path's is)."""
    if isinstance(logits_or_head, HeadInputs):
        ids = torch.zeros(logits_or_head.hidden.shape[:-1], dtype=torch.long, device=logits_or_head.hidden.device)
        return logits_or_head.token_logprobs(ids, mask.to(ids.device), return_entropy=True)[1]
    from torch.utils.checkpoint import checkpoint

    logits = logits_or_head
    if logits.dim() != 3 or logits.shape[:2] != mask.shape:
        raise ValueError(f"logits must be (N, T, V) matching mask {tuple(mask.shape)}, got {tuple(logits.shape)}")
    N, T, V = logits.shape
    flat = logits.reshape(N * T, V)
    c = max(1, int(chunk_size))
    # contiguous row slices are views: checkpoint keeps no copy of them (an index_select would)
    ent = torch.cat([checkpoint(_rows_entropy, flat[s:s + c], use_reentrant=False) for s in range(0, N * T, c)])
    return torch.where(mask.to(logits.device).bool(), ent.view(N, T), torch.zeros((), device=logits.device))
