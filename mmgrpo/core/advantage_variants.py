r"""Advantage estimators beside GRPO's group z-score: BNPO's Beta normalisation and DCPO's smooth standardisation.

Both take (N,) rewards and (N,) group ids (plus ``valid``) and return an
:class:`~mmgrpo.core.advantages.AdvantageOutput`, like :func:`mmgrpo.core.group_advantages`; the front-end wires them
as the run's estimator (VLM: ``methods.bnpo``, ``methods.dcpo``).
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor

from .advantages import AdvantageOutput

__all__ = ["bnpo_advantages", "beta_moments", "PromptStats", "dcpo_smooth_advantages"]


def _groups(r: Tensor, gid: Tensor, ok: Tensor) -> list[Tensor]:
    return [torch.nonzero((gid == g) & ok).flatten() for g in torch.unique(gid[ok]).tolist()]


def beta_moments(p: Tensor) -> tuple[float, float]:
    r"""Method-of-moments Beta(a, b) fit of success rates p (K,): with mean m and unbiased variance v,
    :math:`a = m\,(m(1-m)/v - 1)`, :math:`b = (1-m)\,(m(1-m)/v - 1)`. Fewer than 2 rates (no variance): the
    release's fallback m = 0, v = 1 (a = 0, b = -1)."""
    p = p.double()
    if p.numel() > 1:
        m, v = float(p.mean()), float(p.var(unbiased=True))
    else:
        m, v = 0.0, 1.0
    k = m * (1.0 - m) / v - 1.0 if v > 0 else float("inf")
    return m * k, (1.0 - m) * k


def bnpo_advantages(rewards: Tensor, group_ids: Tensor, valid: Tensor | None = None, min_reward: float = 0.0,
                    max_reward: float = 1.0, max_weight: float = 1e6, **_: object) -> AdvantageOutput:
    r"""BNPO (Xiao et al. 2025, arXiv 2506.02864): Beta-normalised advantages.

    Rewards are mapped to [0, 1], :math:`s = (r - r_{min})/(r_{max}-r_{min})`; a group's success rate is its mean
    :math:`p_g`. The rates of the batch's groups are fitted by a Beta(a, b) (:func:`beta_moments`) and

    .. math::
        \alpha = \max(1 + a/3,\ 1),\quad \beta = \max(1 + b/3,\ 1),\quad
        A_i = \frac{s_i - p_g}{f(p_g;\alpha,\beta)}

    with f the Beta(α, β) density, :math:`1/f` capped at ``max_weight`` (the release: 1e6). α = β = 1 is REINFORCE
    with a mean baseline; α = β = 3/2 divides by a multiple of :math:`\sqrt{p(1-p)}`, the binary-reward group std
    (GRPO). BNPO adapts (α, β) to the policy's current success rates. A group whose rewards are all equal gets 0
    (:math:`s_i = p_g`); invalid rows get 0 and enter no statistic. ``scale``/``eps`` of the common estimator
    signature are ignored (the Beta density is the normaliser). Raises when a valid reward leaves
    [``min_reward``, ``max_reward``] (set them to the task's reward range)."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    gid = torch.as_tensor(group_ids)
    ok = torch.ones_like(gid, dtype=torch.bool) if valid is None else torch.as_tensor(valid, dtype=torch.bool)
    if not max_reward > min_reward:
        raise ValueError(f"BNPO needs max_reward > min_reward, got {min_reward} / {max_reward}")
    s = torch.where(ok, (r - min_reward) / (max_reward - min_reward), torch.zeros_like(r))
    tol = 1e-5
    if bool(((s < -tol) | (s > 1 + tol))[ok].any()):
        bad = float(r[ok][((s < -tol) | (s > 1 + tol))[ok]][0])
        raise ValueError(f"BNPO: reward {bad:g} is outside [min_reward, max_reward] = [{min_reward:g}, "
                         f"{max_reward:g}]; set methods.bnpo.min_reward / max_reward to the task's reward range")
    s = s.clamp(0.0, 1.0)
    groups = _groups(r, gid, ok)
    p_row = torch.zeros_like(r)
    rates = []
    for idx in groups:
        p = s[idx].mean() if idx.numel() > 1 else torch.zeros((), dtype=torch.float64)  # the release: 1 member -> 0
        p_row[idx] = p
        rates.append(p)
    a, b = beta_moments(torch.stack(rates)) if rates else (0.0, 0.0)
    alpha, beta = max(1.0 + a / 3.0, 1.0), max(1.0 + b / 3.0, 1.0)
    dens = torch.distributions.Beta(torch.tensor(alpha, dtype=torch.float64),
                                    torch.tensor(beta, dtype=torch.float64)).log_prob(
        p_row.clamp(1e-300, 1 - 1e-16)).exp()
    weight = torch.where(dens > 0, 1.0 / dens, torch.full_like(dens, float("inf"))).clamp(max=max_weight)
    adv = torch.where(ok, weight * (s - p_row), torch.zeros_like(s))
    zero = torch.zeros_like(ok)
    for idx in groups:
        if bool((r[idx] == r[idx][0]).all()):
            zero[idx] = True
            adv[idx] = 0.0
    n_zero = sum(bool(zero[idx].all()) for idx in groups)
    out_dtype = rewards.dtype if torch.as_tensor(rewards).dtype.is_floating_point else torch.float32
    out = AdvantageOutput(advantages=adv.to(out_dtype), zero_std_mask=zero,
                          zero_std_fraction=n_zero / len(groups) if groups else 0.0,
                          group_mean=p_row.to(out_dtype), group_std=weight.to(out_dtype), num_groups=len(groups))
    out.beta_params = (alpha, beta)  # type: ignore[attr-defined]  (logged by the method)
    return out


class PromptStats:
    """Running reward statistics per prompt key, for :func:`dcpo_smooth_advantages`: the number of steps the
    prompt was sampled (``visits``), and the count, sum and sum of squares of all its rewards so far (float64)."""

    def __init__(self):
        self.table: dict[str, list[float]] = {}  # key -> [visits, n, sum, sumsq]

    def update(self, key: str, rewards: Iterable[float]) -> tuple[int, float, float]:
        """Add one step's rewards of ``key``; returns (visits i, mean, unbiased std) over all of them so far."""
        v = self.table.setdefault(key, [0.0, 0.0, 0.0, 0.0])
        rs = [float(x) for x in rewards]
        v[0] += 1
        v[1] += len(rs)
        v[2] += sum(rs)
        v[3] += sum(x * x for x in rs)
        n, mean = v[1], v[2] / v[1]
        var = max(v[3] - n * mean * mean, 0.0) / max(n - 1.0, 1.0)
        return int(v[0]), mean, var ** 0.5

    def state_dict(self) -> dict:
        return {"table": {k: list(v) for k, v in self.table.items()}}

    def load_state_dict(self, sd: dict) -> None:
        self.table = {str(k): [float(x) for x in v] for k, v in sd["table"].items()}


def dcpo_smooth_advantages(rewards: Tensor, group_ids: Tensor, keys: list[str], stats: PromptStats,
                           valid: Tensor | None = None, eps: float = 1e-4, **_: object) -> AdvantageOutput:
    r"""DCPO's smooth advantage standardisation (arXiv 2509.02333). For a group of prompt k sampled for the i-th
    time, with the step's group statistics :math:`(\mu_{new}, \sigma_{new})` and those of every reward of k so far,
    this step's included, :math:`(\mu_{tot}, \sigma_{tot})` (unbiased std):

    .. math::
        A^{new} = \frac{r-\mu_{new}}{\sigma_{new}+\epsilon},\quad A^{tot} = \frac{r-\mu_{tot}}{\sigma_{tot}+\epsilon},
        \quad SA^{new} = \tfrac{i-1}{i}A^{new} + \tfrac1i A^{tot},\quad SA^{tot} = \tfrac1i A^{new}+\tfrac{i-1}{i}A^{tot}

    and :math:`\hat A = SA^{new}` if :math:`|SA^{new}| < |SA^{tot}|`, else :math:`SA^{tot}`. At the first visit
    both are GRPO's :math:`A^{new}`; a later group whose rewards are all equal (:math:`A^{new} = 0`) keeps
    :math:`\tfrac1i A^{tot}`, a signal against the prompt's own history, where GRPO gives 0.

    ``keys``: the prompt key of each row (rows of one group share it); ``stats`` is updated in place (every valid
    reward of the group). Invalid rows get 0 and enter no statistic; a group with < 2 valid rows gets 0 and does
    not update the history. ``zero_std_mask`` marks groups whose final advantages are all 0."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    gid = torch.as_tensor(group_ids)
    ok = torch.ones_like(gid, dtype=torch.bool) if valid is None else torch.as_tensor(valid, dtype=torch.bool)
    if len(keys) != r.numel():
        raise ValueError(f"dcpo_smooth_advantages: {len(keys)} keys for {r.numel()} rewards")
    adv, mean, std = (torch.zeros_like(r) for _ in range(3))
    zero = torch.zeros_like(ok)
    groups = _groups(r, gid, ok)
    for idx in groups:
        if idx.numel() < 2:
            zero[idx] = True
            continue
        if len({keys[j] for j in idx.tolist()}) != 1:
            raise ValueError(f"group {int(gid[idx[0]])} mixes prompt keys: one group is one prompt")
        x = r[idx]
        mu_n, sd_n = x.mean(), x.std(unbiased=True)
        i, mu_t, sd_t = stats.update(keys[int(idx[0])], x.tolist())
        a_new = (x - mu_n) / (sd_n + eps) if bool((x != x[0]).any()) else torch.zeros_like(x)
        a_tot = (x - mu_t) / (sd_t + eps) if sd_t > 0 else torch.zeros_like(x)
        sa_new = (i - 1) / i * a_new + a_tot / i
        sa_tot = a_new / i + (i - 1) / i * a_tot
        adv[idx] = torch.where(sa_new.abs() < sa_tot.abs(), sa_new, sa_tot)
        mean[idx], std[idx] = mu_n, sd_n
        zero[idx] = bool((adv[idx] == 0).all())
    n_zero = sum(bool(zero[idx].all()) for idx in groups)
    out_dtype = rewards.dtype if torch.as_tensor(rewards).dtype.is_floating_point else torch.float32
    return AdvantageOutput(advantages=adv.to(out_dtype), zero_std_mask=zero,
                           zero_std_fraction=n_zero / len(groups) if groups else 0.0,
                           group_mean=mean.to(out_dtype), group_std=std.to(out_dtype), num_groups=len(groups))
