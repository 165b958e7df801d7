"""Reward-side guardrails against reward hacking: pure functions of reward tensors, front-end independent.

* :func:`worst_case` / :func:`uncertainty_weighted`: reward-model ensembles (Coste et al., "Reward Model Ensembles
  Help Mitigate Overoptimization", ICLR 2024): WCO ``r = min_k r_k``; UWO ``r = mean_k r_k - lam * var_k r_k``
  (the variance over the K members, population form: ``(1/K) sum_k (r_k - mean)^2``).
* :func:`par_sigmoid`: PAR, "Preference As Reward" (Fu et al., "Reward Shaping to Mitigate Reward Hacking in RLHF",
  2025): a bounded reward centred on the reference policy's, ``r' = (1/M) sum_m sigmoid((r - r_ref_m) / tau)``
  (tau = 1 in the paper; tau rescales a reward whose range is far from O(1)).
* :func:`log_tamed`: PaCo-GRPO's log-tamed multi-reward aggregation (Ping et al., "PaCo-RL", arXiv 2512.04784,
  eq. 3-4): per component the coefficient of variation over the batch ``h_k = std(R_k) / mean(R_k)``; a component
  with ``h_k > delta`` becomes ``log(1 + R_k)``; the total is ``sum_k w_k R_k``. ``delta`` is a number (the paper's
  example 0.2) or the mean of the ``h_k`` (its adaptive choice). The std is the population std (the paper does not
  say; its release aggregates with numpy, whose default it is).

Shapes: a component is an (N,) tensor; ensembles take a (K, N) stack and return (N,).
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import torch

__all__ = ["worst_case", "uncertainty_weighted", "par_sigmoid", "coefficient_of_variation", "log_tamed"]


def _stack(members: Union[torch.Tensor, Sequence[torch.Tensor]]) -> torch.Tensor:
    r = members if isinstance(members, torch.Tensor) else torch.stack([torch.as_tensor(m) for m in members])
    if r.ndim != 2 or r.shape[0] < 1:
        raise ValueError(f"an ensemble is a (K, N) stack of K >= 1 member rewards, got shape {tuple(r.shape)}")
    return r.double()


def worst_case(members: Union[torch.Tensor, Sequence[torch.Tensor]]) -> torch.Tensor:
    """(N,) ``min_k r_k`` of a (K, N) ensemble (WCO)."""
    return _stack(members).min(0).values


def uncertainty_weighted(members: Union[torch.Tensor, Sequence[torch.Tensor]], lam: float) -> torch.Tensor:
    """(N,) ``mean_k r_k - lam * var_k r_k`` of a (K, N) ensemble (UWO; population variance over members)."""
    if not lam >= 0:
        raise ValueError(f"uncertainty_weighted: lam must be >= 0, got {lam}")
    r = _stack(members)
    return r.mean(0) - lam * r.var(0, unbiased=False)


def par_sigmoid(r: torch.Tensor, r_ref: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """PAR: ``mean_m sigmoid((r - r_ref_m) / tau)``. ``r`` (N,); ``r_ref`` (N,) (one reference reward per sample)
    or (N, M) (M references). Bounded in (0, 1), 1/2 at the reference, steepest there."""
    if not tau > 0:
        raise ValueError(f"par_sigmoid: tau must be > 0, got {tau}")
    r = r.double()
    ref = r_ref.double()
    ref = ref.unsqueeze(1) if ref.ndim == 1 else ref
    if ref.shape[0] != r.shape[0]:
        raise ValueError(f"par_sigmoid: r has {r.shape[0]} samples, r_ref {ref.shape[0]}")
    return torch.sigmoid((r.unsqueeze(1) - ref) / tau).mean(1)


def coefficient_of_variation(r: torch.Tensor) -> float:
    """``std(r) / mean(r)`` over all values (population std); inf for a zero mean with spread, 0 without."""
    r = r.double().flatten()
    m, s = float(r.mean()), float(r.std(unbiased=False)) if r.numel() > 1 else 0.0
    if m == 0.0:
        return 0.0 if s == 0.0 else float("inf")
    return s / m


def log_tamed(components: Mapping[str, torch.Tensor], weights: Mapping[str, float],
              delta: Union[float, str] = "mean", stats: Optional[Mapping[str, torch.Tensor]] = None
              ) -> tuple[torch.Tensor, dict[str, float], dict[str, bool]]:
    """PaCo's log-tamed aggregation. ``components`` name -> (N,) rewards of these samples; ``stats`` name -> the
    values the coefficients of variation are computed over (default: ``components``; the whole gathered batch when
    the samples are one process's share). Returns the (N,) total ``sum_k w_k R~_k``, ``h_k`` and which components
    were tamed. A tamed component must be > -1 (``log(1 + R)``)."""
    if not components:
        raise ValueError("log_tamed: no reward components")
    stats = components if stats is None else stats
    h = {k: coefficient_of_variation(stats[k]) for k in components}
    if isinstance(delta, str):
        if delta != "mean":
            raise ValueError(f"log_tamed: delta must be a number or 'mean', got {delta!r}")
        finite = [v for v in h.values() if v != float("inf")]
        thr = sum(finite) / len(finite) if finite else 0.0
    else:
        thr = float(delta)
    tamed = {k: h[k] > thr for k in components}
    total = None
    for k, r in components.items():
        r = r.double()
        if tamed[k]:
            if bool((r <= -1).any()):
                raise ValueError(f"log_tamed: component {k!r} has values <= -1: log(1 + R) is undefined")
            r = torch.log1p(r)
        term = float(weights.get(k, 1.0)) * r
        total = term if total is None else total + term
    return total, h, tamed
