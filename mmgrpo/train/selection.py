"""Offline data selection from K repeated base-model inferences per sample (pure functions).

* ``variance`` (Temporal-RLT): keep samples whose K rewards vary, var >= ``min_variance`` (highest first);
* ``gaussian`` (Time-R1, ``src/utils/process_data.py`` task ``gaussian_03``): only samples with mean reward > 0 are
  candidates (the release keeps difficulty = 100·IoU > 0: a sample the base model cannot hit at all is never
  drawn); weight exp(-(mean - mu)^2 / (2 sigma^2)), normalised over the candidates; draw ``num_keep`` without
  replacement proportionally to the weight (seeded; same distribution as the release's
  ``np.random.choice(n, k, replace=False, p)``, not the same draws). ``keep_zero=True`` makes the zero-reward samples
  candidates again (mmgrpo before issue #23). Deviation: when ``num_keep`` >= the number of candidates every
  candidate is kept (the release's ``np.random.choice`` raises and writes no file);
* ``nonconstant`` (DAPO-style): drop samples whose K rewards are all equal (all right / all wrong).
"""
from __future__ import annotations

import torch

__all__ = ["reward_stats", "select_indices"]


def reward_stats(rewards: torch.Tensor) -> dict[str, torch.Tensor]:
    """rewards (S, K) -> per-sample mean, population variance, min, max (each (S,) float64)."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    if r.dim() != 2 or r.shape[1] < 1:
        raise ValueError(f"rewards must be (num_samples, K), got {tuple(r.shape)}")
    return {"mean": r.mean(1), "var": r.var(1, unbiased=False), "min": r.min(1).values, "max": r.max(1).values}


def select_indices(rewards: torch.Tensor, criterion: str, min_variance: float = 0.0, num_keep: int = 0,
                   mu: float = 0.3, sigma: float = 0.2, seed: int = 0, keep_zero: bool = False) -> list[int]:
    """Indices (ascending) of the samples to keep; see the module docstring for the criteria."""
    st = reward_stats(rewards)
    S = st["mean"].shape[0]
    if criterion == "nonconstant":
        keep = [i for i in range(S) if st["max"][i] > st["min"][i]]
        return sorted(keep[:num_keep] if num_keep else keep)
    if criterion == "variance":
        ok = [i for i in range(S) if st["var"][i] >= min_variance and st["max"][i] > st["min"][i]]
        ok.sort(key=lambda i: (-float(st["var"][i]), i))
        return sorted(ok[:num_keep] if num_keep else ok)
    if criterion == "gaussian":
        if sigma <= 0:
            raise ValueError("gaussian selection needs sigma > 0")
        cand = torch.arange(S) if keep_zero else (st["mean"] > 0).nonzero().flatten()
        if not num_keep or num_keep >= cand.numel():
            return cand.tolist()
        w = torch.exp(-((st["mean"][cand] - mu) ** 2) / (2 * sigma**2))
        g = torch.Generator().manual_seed(int(seed))
        idx = torch.multinomial(w.clamp_min(1e-300), num_keep, replacement=False, generator=g)
        return sorted(cand[idx].tolist())
    raise ValueError(f"unknown selection criterion {criterion!r}; expected variance | gaussian | nonconstant")
