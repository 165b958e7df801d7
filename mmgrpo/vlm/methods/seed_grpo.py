r"""SEED-GRPO (Chen et al. 2025, arXiv 2505.12346): semantic entropy of a group's answers scales its update size.

For a prompt q with G sampled completions, the answers are clustered by meaning into :math:`C_1..C_K` and

.. math::
    SE(q) = -\sum_k p(C_k\mid q)\log p(C_k\mid q),\qquad
    \hat A_i = A_i\cdot f\!\left(\alpha\,\frac{SE(q)}{SE_{max}}\right),\qquad SE_{max} = \log G

so confident prompts (one cluster, SE = 0) keep the plain GRPO advantage and uncertain prompts (many clusters)
get a smaller step. :math:`SE_{max} = \log G` is the entropy of G answers that all differ.

Choices the paper leaves open (no released code), and what this module does:

* **Clustering** ("meaning"): exact match of a canonical answer (MCQ: the letter set; numbers: the value) with
  :func:`cluster_exact`; for grounding, spans / boxes whose IoU with a cluster's *first* member is at least
  ``threshold`` (greedy in sampling order, as the semantic-entropy clustering of Kuhn et al. compares with one
  representative per cluster) with :func:`cluster_by_overlap`. Unparseable answers (None / NaN) all share one
  "no answer" cluster by default (``unparsed="shared"``): early in training most answers are malformed, and
  treating each as its own meaning would shrink exactly the updates that teach the format; ``"own"`` makes each
  a singleton instead.
* **p(C_k)**: ``estimator="count"`` (default) is the discrete estimate :math:`n_k/G` (Farquhar et al. 2024);
  ``estimator="prob"`` uses the policy's sequence probabilities renormalised over the sampled set,
  :math:`p(C_k)=\sum_{i\in C_k}\pi(o_i)/\sum_j\pi(o_j)` (the paper's :math:`\sum_{o_i\in C_k}\pi_{old}(o_i\mid q)`;
  raw sequence probabilities of long answers underflow, hence the renormalisation, done with logsumexp), with
  optional length-normalised log-probs. Both give :math:`SE=\log G` when all G answers differ and equal mass.
  The paper also writes the Monte-Carlo form :math:`-\frac1K\sum_k\log p(C_k)`; ``estimator="mc"`` is that form
  with the renormalised probabilities.
* **f**: ``linear`` :math:`1-x`, ``exp`` :math:`e^{-x}`, ``focal`` :math:`(1-x)^\gamma`; x is clamped to [0, 1]
  for linear/focal so a weight is never negative. Default linear with ``alpha=0.5`` (an all-different group keeps
  half its signal; the paper sweeps alpha, our default is a choice, not a reproduction).

Shapes: N rows; ``group_ids`` (N,) int; returns float tensors. Pure functions, no model code.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Hashable, Literal, Sequence

import torch
from torch import Tensor

__all__ = ["cluster_exact", "cluster_by_overlap", "cluster_texts", "span_iou", "box_iou", "semantic_entropy",
           "seed_weights", "seed_advantages"]

Estimator = Literal["count", "prob", "mc"]
Modulation = Literal["linear", "exp", "focal"]


def _gids(group_ids, n: int) -> Tensor:
    g = torch.as_tensor(group_ids)
    if g.shape != (n,) or g.dtype.is_floating_point or g.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer (N,)=({n},) tensor, got {tuple(g.shape)} {g.dtype}")
    return g


def _is_missing(a: Any) -> bool:
    if a is None:
        return True
    if isinstance(a, float) and math.isnan(a):
        return True
    if isinstance(a, Tensor) and a.is_floating_point() and bool(torch.isnan(a).any()):
        return True
    if isinstance(a, (tuple, list)) and any(isinstance(x, float) and math.isnan(x) for x in a):
        return True
    return False


def _assign(answers: Sequence[Any], group_ids, same: Callable[[Any, Any], bool],
            unparsed: Literal["shared", "own"]) -> Tensor:
    """Cluster ids (N,) int64, unique over the whole batch (so clusters never span groups)."""
    n = len(answers)
    gid = _gids(group_ids, n)
    if unparsed not in ("shared", "own"):
        raise ValueError(f"unparsed must be 'shared' or 'own', got {unparsed!r}")
    out = torch.empty(n, dtype=torch.long)
    nxt = 0
    for g in torch.unique(gid).tolist():
        reps: list[tuple[Any, int]] = []  # (representative answer, cluster id): the cluster's first member
        missing_id = None
        for i in (gid == g).nonzero().flatten().tolist():
            a = answers[i]
            if _is_missing(a):
                if unparsed == "shared":
                    if missing_id is None:
                        missing_id, nxt = nxt, nxt + 1
                    out[i] = missing_id
                else:
                    out[i], nxt = nxt, nxt + 1
                continue
            for rep, cid in reps:
                if same(rep, a):
                    out[i] = cid
                    break
            else:
                reps.append((a, nxt))
                out[i], nxt = nxt, nxt + 1
    return out


def cluster_exact(answers: Sequence[Hashable | None], group_ids, unparsed: Literal["shared", "own"] = "shared"
                  ) -> Tensor:
    """Cluster ids by equality of canonical answers (MCQ letters as a frozenset or sorted string, numbers, ...).

    None / NaN = unparseable (see ``unparsed`` in the module docstring). Returns (N,) int64 cluster ids."""
    return _assign(answers, group_ids, lambda a, b: a == b, unparsed)


def span_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Continuous temporal IoU of two (start, end) spans (reversed spans are sorted; zero union -> 1 if equal)."""
    s1, e1 = sorted((float(a[0]), float(a[1])))
    s2, e2 = sorted((float(b[0]), float(b[1])))
    inter = max(0.0, min(e1, e2) - max(s1, s2))
    union = max(e1, e2) - min(s1, s2)
    if union <= 0:
        return 1.0 if (s1, e1) == (s2, e2) else 0.0
    return inter / union


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Continuous IoU of two (x1, y1, x2, y2) boxes (zero union -> 1 if equal)."""
    ax1, ax2 = sorted((float(a[0]), float(a[2])))
    ay1, ay2 = sorted((float(a[1]), float(a[3])))
    bx1, bx2 = sorted((float(b[0]), float(b[2])))
    by1, by2 = sorted((float(b[1]), float(b[3])))
    iw = max(0.0, min(ax2, bx2) - max(ax1, bx1))
    ih = max(0.0, min(ay2, by2) - max(ay1, by1))
    inter = iw * ih
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    if union <= 0:
        return 1.0 if (ax1, ay1, ax2, ay2) == (bx1, by1, bx2, by2) else 0.0
    return inter / union


def cluster_by_overlap(answers: Sequence[Sequence[float] | None], group_ids, threshold: float = 0.5,
                       iou: Callable[[Any, Any], float] | None = None,
                       unparsed: Literal["shared", "own"] = "shared") -> Tensor:
    """Cluster grounding answers: a span (2 numbers) or box (4 numbers) joins the first cluster whose first member
    it overlaps with IoU >= ``threshold``, else opens a new cluster (greedy, in row order). ``iou`` defaults to
    :func:`span_iou` for 2-vectors and :func:`box_iou` for 4-vectors. Returns (N,) int64 cluster ids."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")

    def same(a, b):
        f = iou
        if f is None:
            if len(a) == 2 and len(b) == 2:
                f = span_iou
            elif len(a) == 4 and len(b) == 4:
                f = box_iou
            else:
                raise ValueError(f"answers must be spans (2 numbers) or boxes (4 numbers), got {a!r} and {b!r}")
        return f(a, b) >= threshold

    return _assign(list(answers), group_ids, same, unparsed)


CLUSTER_TASKS = ("tvg", "mcq", "gqa", "rec", "numeric")


def cluster_texts(texts: Sequence[str], task: str, group_ids, threshold: float = 0.5,
                  unparsed: Literal["shared", "own"] = "shared", num_decimals: int = 6) -> Tensor:
    """Cluster completions by the meaning of their answer, per task, with the project's parsers
    (:mod:`mmgrpo.vlm.rewards.parsing`): tvg -> the span (overlap >= ``threshold``); mcq / gqa -> the option letter
    set (gqa: its evidence span is not part of the meaning here); rec -> the box (overlap); numeric -> the value
    rounded to ``num_decimals``. A text whose answer does not parse is "no answer" (see ``unparsed``)."""
    from mmgrpo.vlm.rewards import parsing as P

    if task == "tvg":
        spans = [(lambda p: (p.value.start, p.value.end) if p.ok else None)(P.parse_span(t)) for t in texts]
        return cluster_by_overlap(spans, group_ids, threshold, span_iou, unparsed)
    if task == "rec":
        boxes = [(lambda p: tuple(p.value) if p.ok else None)(P.parse_box(t)) for t in texts]
        return cluster_by_overlap(boxes, group_ids, threshold, box_iou, unparsed)
    if task in ("mcq", "gqa"):
        return cluster_exact([(lambda p: frozenset(p.value) if p.ok else None)(P.parse_choice(t)) for t in texts],
                             group_ids, unparsed)
    if task == "numeric":
        return cluster_exact([(lambda p: round(p.value, num_decimals) if p.ok else None)(P.parse_number(t))
                              for t in texts], group_ids, unparsed)
    raise ValueError(f"seed_grpo: no answer clustering for task {task!r} (tvg | mcq | gqa | rec | numeric)")


def semantic_entropy(cluster_ids, group_ids, seq_logp: Tensor | None = None, estimator: Estimator = "count",
                     lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
    r"""Per-group semantic entropy (natural log).

    Args:
        cluster_ids: (N,) int cluster of each row (ids may be shared only within a group).
        group_ids: (N,) int group of each row.
        seq_logp: (N,) sequence log-probs :math:`\log\pi(o_i\mid q)` (``estimator="prob"|"mc"``).
        estimator: "count" :math:`p_k=n_k/G`; "prob" :math:`-\sum_k p_k\log p_k` with
            :math:`p_k=\sum_{i\in C_k}e^{\ell_i}/\sum_j e^{\ell_j}`; "mc" :math:`-\frac1K\sum_k\log p_k` (same p).
        lengths: (N,) token counts; with "prob"/"mc", :math:`\ell_i` = seq_logp / length (length-normalised).

    Returns:
        (se_per_row (N,) float64, group_size_per_row (N,) float64): each row gets its group's SE and G.
    """
    cid = torch.as_tensor(cluster_ids).long()
    n = cid.shape[0]
    gid = _gids(group_ids, n)
    if estimator not in ("count", "prob", "mc"):
        raise ValueError(f"estimator must be count | prob | mc, got {estimator!r}")
    ell = None
    if estimator != "count":
        if seq_logp is None:
            raise ValueError(f"estimator={estimator!r} needs seq_logp")
        ell = torch.as_tensor(seq_logp, dtype=torch.float64)
        if lengths is not None:
            ell = ell / torch.as_tensor(lengths, dtype=torch.float64).clamp_min(1)
    se = torch.zeros(n, dtype=torch.float64)
    size = torch.zeros(n, dtype=torch.float64)
    for g in torch.unique(gid).tolist():
        rows = (gid == g).nonzero().flatten()
        c = cid[rows]
        size[rows] = float(len(rows))
        uniq, inv = torch.unique(c, return_inverse=True)
        if estimator == "count":
            ones = torch.ones(len(rows), dtype=torch.float64)
            p = torch.zeros(len(uniq), dtype=torch.float64).scatter_add_(0, inv, ones) / len(rows)
            logp = torch.log(p)
        else:
            lg = ell[rows]
            tot = torch.logsumexp(lg, 0)
            logp = torch.stack([torch.logsumexp(lg[inv == k], 0) for k in range(len(uniq))]) - tot
            p = torch.exp(logp)
        if estimator == "mc":
            se[rows] = float(-logp.mean())
        else:
            se[rows] = float(-(p * logp).sum())
    return se, size


def seed_weights(se: Tensor, group_size: Tensor, alpha: float = 0.5, fn: Modulation = "linear",
                 gamma: float = 2.0) -> Tensor:
    r"""Advantage multipliers :math:`f(\alpha\,SE/\log G)` (N,) float64; groups of size 1 get 1 (no entropy)."""
    se = torch.as_tensor(se, dtype=torch.float64)
    G = torch.as_tensor(group_size, dtype=torch.float64)
    se_max = torch.log(G.clamp_min(2.0))
    x = alpha * se / se_max
    if fn == "linear":
        w = 1.0 - x.clamp(0.0, 1.0)
    elif fn == "exp":
        w = torch.exp(-x)
    elif fn == "focal":
        w = (1.0 - x.clamp(0.0, 1.0)) ** gamma
    else:
        raise ValueError(f"fn must be linear | exp | focal, got {fn!r}")
    return torch.where(G > 1, w, torch.ones_like(w))


def seed_advantages(advantages: Tensor, cluster_ids, group_ids, alpha: float = 0.5, fn: Modulation = "linear",
                    gamma: float = 2.0, estimator: Estimator = "count", seq_logp: Tensor | None = None,
                    lengths: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    r"""SEED-GRPO advantages :math:`\hat A_i = A_i\, f(\alpha\, SE(q)/\log G)` and diagnostics.

    advantages: (N,) or (N, T) (scaled per row). Group size G counts the rows given (pass the rows that took part
    in the group statistics). Returns (advantages in the input dtype, metrics ``seed/entropy_mean``,
    ``seed/weight_mean``, ``seed/clusters_mean``)."""
    adv = torch.as_tensor(advantages)
    se, G = semantic_entropy(cluster_ids, group_ids, seq_logp, estimator, lengths)
    w = seed_weights(se, G, alpha, fn, gamma)
    wb = w.to(adv.dtype) if adv.dim() == 1 else w.to(adv.dtype).unsqueeze(1)
    gid = torch.as_tensor(group_ids)
    first = torch.ones_like(gid, dtype=torch.bool)
    if gid.numel():
        _, inv = torch.unique(gid, return_inverse=True)
        first = torch.zeros_like(first)
        seen: set[int] = set()
        for i, k in enumerate(inv.tolist()):
            if k not in seen:
                seen.add(k)
                first[i] = True
    cid = torch.as_tensor(cluster_ids)
    n_groups = int(first.sum())
    metrics = {"seed/entropy_mean": float(se[first].mean()) if n_groups else 0.0,
               "seed/weight_mean": float(w[first].mean()) if n_groups else 1.0,
               "seed/clusters_mean": (len(torch.unique(cid)) / n_groups) if n_groups else 0.0}
    return adv * wb, metrics


# ----------------------------------------------------------------------------------------------- trainer hook
from mmgrpo.vlm.methods.base import VLMMethod  # noqa: E402  (the pure functions above need no trainer)


class SeedGRPO(VLMMethod):
    """``methods.seed_grpo.enabled``: after the group advantages exist, every row's advantage is multiplied by its
    group's :func:`seed_weights`. The clustering reads the valid on-policy rows' answers (``data.task`` decides
    how: :func:`cluster_texts`); an injected ground truth is not the policy's answer, so it does not enter the
    entropy, but its advantage is scaled with its group's."""

    name = "seed_grpo"
    needs_whole_groups = True  # the entropy of a group needs all its answers

    @classmethod
    def check(cls, cfg):
        if not cfg.methods.seed_grpo.enabled:  # called for every registered method
            return
        if cfg.data.task not in CLUSTER_TASKS:
            raise ValueError(f"methods.seed_grpo clusters answers of the tasks {CLUSTER_TASKS}; data.task="
                             f"{cfg.data.task!r} has no answer clustering")
        o = cfg.methods.seed_grpo
        seed_weights(torch.zeros(1), torch.full((1,), 2.0), o.alpha, o.fn, o.gamma)  # validates fn
        if not 0.0 < o.threshold <= 1.0:
            raise ValueError(f"methods.seed_grpo.threshold must be in (0, 1], got {o.threshold}")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.o = cfg.methods.seed_grpo
        self._m: dict[str, float] = {}

    def on_advantages(self, rb):
        o = self.o
        use = rb.valid & ~rb.is_offpolicy
        if not bool(use.any()):
            return rb
        rows = use.nonzero().flatten()
        gid = rb.group_ids[rows]
        cid = cluster_texts([rb.texts[i] for i in rows.tolist()], self.cfg.data.task, gid, o.threshold, o.unparsed)
        seq_lp = (rb.rollout_logp[rows] * rb.completion_mask[rows]).sum(1) if o.estimator != "count" else None
        lens = rb.completion_mask[rows].sum(1) if o.length_normalize else None
        se, G = semantic_entropy(cid, gid, seq_lp, o.estimator, lens)
        w = seed_weights(se, G, o.alpha, o.fn, o.gamma)
        per_group = dict(zip(gid.tolist(), w.tolist()))
        scale = torch.tensor([per_group.get(g, 1.0) for g in rb.group_ids.tolist()], dtype=torch.float64)
        rb.advantages = (rb.advantages.double() * scale).to(rb.advantages.dtype)
        firsts = {g: k for k, g in reversed(list(enumerate(gid.tolist())))}
        idx = torch.tensor(sorted(firsts.values()))
        self._m = {"seed/entropy_mean": float(se[idx].mean()), "seed/weight_mean": float(w[idx].mean()),
                   "seed/clusters_mean": len(torch.unique(cid)) / len(idx)}
        return rb

    def end_of_step(self, rb, m):
        m.update(self._m)
