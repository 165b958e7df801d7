"""Group-relative advantages.

Everything here is a pure function of explicit tensors. Groups are identified by integer ``group_ids``
(never by decoded prompt strings), so a group may be any subset of the batch, in any order.

Notation: a batch holds N samples; sample i belongs to group g(i). Rewards are either one scalar per
sample, shape (N,), or one per (sample, step), shape (N, K); in the second case every statistic is
taken per step column k independently.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

import torch
from torch import Tensor

Scale = Literal["group", "batch", "none"]

__all__ = [
    "AdvantageOutput",
    "group_advantages",
    "multi_reward_advantages",
    "pairwise_win_rate",
    "tempsamp_shape",
    "anchor_offpolicy_advantages",
    "offpolicy_diagnostics",
]


@dataclass
class AdvantageOutput:
    """Result of :func:`group_advantages`.

    Attributes:
        advantages: same shape as the rewards, (N,) or (N, K).
        zero_std_mask: bool, same shape; True where the sample's group had all-equal rewards (per step for
            (N, K)). Those advantages are exactly 0.
        zero_std_fraction: fraction of (group[, step]) cells with all-equal rewards, in [0, 1].
        group_mean: per-sample broadcast of the group mean, same shape as rewards.
        group_std: per-sample broadcast of the group std (before eps), same shape as rewards.
        num_groups: number of distinct groups among the valid samples.
    """

    advantages: Tensor
    zero_std_mask: Tensor
    zero_std_fraction: float
    group_mean: Tensor
    group_std: Tensor
    num_groups: int


def _as_2d(x: Tensor) -> tuple[Tensor, bool]:
    if x.dim() == 1:
        return x.unsqueeze(1), True
    if x.dim() == 2:
        return x, False
    raise ValueError(f"rewards must have shape (N,) or (N, K), got {tuple(x.shape)}")


def _check_group_ids(group_ids: Tensor, n: int) -> Tensor:
    group_ids = torch.as_tensor(group_ids)
    if group_ids.dim() != 1 or group_ids.shape[0] != n:
        raise ValueError(f"group_ids must have shape ({n},), got {tuple(group_ids.shape)}")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise TypeError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    return group_ids


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    scale: Scale = "group",
    eps: float = 1e-4,
    unbiased: bool = True,
    clamp: float | None = None,
    valid: Tensor | None = None,
) -> AdvantageOutput:
    r"""Group-relative advantages (GRPO and its scale variants).

    For sample i in group g with valid members :math:`\mathcal G`:

    .. math::
        \mu_g = \frac1{|\mathcal G|}\sum_{j\in\mathcal G} r_j,\qquad
        \sigma_g = \sqrt{\tfrac{1}{|\mathcal G| - u}\sum_{j\in\mathcal G}(r_j-\mu_g)^2},\ u = 1 \text{ if unbiased else } 0

    * ``scale="group"`` (GRPO): :math:`A_i = (r_i-\mu_g)/(\sigma_g+\epsilon)`;
    * ``scale="batch"`` (Lite-PPO / TRL ``scale_rewards="batch"``): :math:`A_i = (r_i-\mu_g)/(\sigma_B+\epsilon)`
      where :math:`\sigma_B` is the std of all valid rewards (per step column);
    * ``scale="none"`` (Dr.GRPO): :math:`A_i = r_i-\mu_g`.

    A group whose valid rewards are all exactly equal (max == min) gets advantage exactly 0 and is flagged in
    ``zero_std_mask``; this includes groups with a single valid member (no baseline exists). ``clamp`` clips the
    result to ``[-clamp, clamp]`` (Flow-GRPO's ``adv_clip_max``). Invalid samples (``valid == False``, e.g. a
    reward that failed) do not enter any statistic and get advantage 0.

    Args:
        rewards: (N,) or (N, K) float rewards. Must be finite where valid.
        group_ids: (N,) integer group id per sample (any values, any order).
        scale: "group", "batch" or "none".
        eps: added to the std in the denominator.
        unbiased: Bessel-corrected std, divides by n-1 (``torch.std``: TRL, DanceGRPO, MixGRPO, G2RPO) or the
            population std, divides by n (``np.std``: Flow-GRPO's and TP-GRPO's ``PerPromptStatTracker``).
        clamp: optional symmetric clip of the advantages.
        valid: optional (N,) bool mask of samples that take part.

    Returns:
        :class:`AdvantageOutput`.
    """
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    r2, was_1d = _as_2d(torch.as_tensor(rewards))
    n, k = r2.shape
    group_ids = _check_group_ids(group_ids, n).to(r2.device)
    r2 = r2.to(torch.float64)  # statistics in float64: exact zero-variance detection, no cancellation
    if valid is None:
        valid_b = torch.ones(n, dtype=torch.bool, device=r2.device)
    else:
        valid_b = torch.as_tensor(valid, dtype=torch.bool, device=r2.device)
        if valid_b.shape != (n,):
            raise ValueError(f"valid must have shape ({n},), got {tuple(valid_b.shape)}")
    if not torch.isfinite(r2[valid_b]).all():
        bad = torch.nonzero(~torch.isfinite(r2).all(dim=1) & valid_b).flatten().tolist()
        raise ValueError(f"non-finite rewards at sample indices {bad[:20]}; drop them via `valid` or fix the reward")

    # Invalid rows may hold NaN (a failed reward): zero them first, since NaN * 0 is still NaN.
    r2 = torch.where(valid_b.unsqueeze(1), r2, torch.zeros_like(r2))
    uniq, inv = torch.unique(group_ids, return_inverse=True)
    num_g = uniq.numel()
    w = valid_b.to(r2.dtype).unsqueeze(1).expand(n, k)  # (N, K) participation weights
    idx = inv.unsqueeze(1).expand(n, k)
    count = torch.zeros(num_g, k, dtype=r2.dtype, device=r2.device).scatter_add_(0, idx, w)
    present = count > 0
    # Exact constancy test via max == min over valid members (float rounding in mean/std can't fake signal).
    big = torch.finfo(r2.dtype).max
    mx = torch.full((num_g, k), -big, dtype=r2.dtype, device=r2.device).scatter_reduce(
        0, idx, torch.where(w > 0, r2, torch.full_like(r2, -big)), reduce="amax"
    )
    mn = torch.full((num_g, k), big, dtype=r2.dtype, device=r2.device).scatter_reduce(
        0, idx, torch.where(w > 0, r2, torch.full_like(r2, big)), reduce="amin"
    )
    # Mean and std of the rewards *shifted by the group minimum* (the shifted-data algorithm): r - min is exact
    # when the group's rewards are close to each other (Sterbenz), so rewards that differ only in their last bits
    # (e.g. 1.0 vs 1.0 + 2**-52) still get zero-mean, correctly scaled advantages instead of rounding noise.
    shift = torch.where(present, mn, torch.zeros_like(mn))[inv]
    rs = torch.where(w > 0, r2 - shift, torch.zeros_like(r2))
    total = torch.zeros(num_g, k, dtype=r2.dtype, device=r2.device).scatter_add_(0, idx, rs)
    mean_s = total / count.clamp_min(1)  # group mean minus the group minimum
    centered = rs - mean_s[inv]
    dev = centered * w
    sq = torch.zeros(num_g, k, dtype=r2.dtype, device=r2.device).scatter_add_(0, idx, dev * dev)
    denom = (count - (1.0 if unbiased else 0.0)).clamp_min(1)
    std_g = torch.sqrt(sq / denom)
    mean_g = torch.where(present, mn + mean_s, torch.zeros_like(mean_s))  # reported only
    # Single-member groups are constant too; std == 0 also catches differences so tiny (subnormal) that their
    # square underflows, which would otherwise divide by zero when eps = 0.
    constant_g = present & ((mx == mn) | (std_g == 0))

    if scale == "group":
        adv = centered / (std_g[inv] + eps)
    elif scale == "batch":
        vr = r2[valid_b]
        if vr.shape[0] > 1:
            std_b = vr.std(dim=0, unbiased=unbiased)
        else:
            std_b = torch.zeros(k, dtype=r2.dtype, device=r2.device)
        adv = centered / (std_b.unsqueeze(0) + eps)
    else:
        adv = centered
    zero_mask = constant_g[inv] & valid_b.unsqueeze(1)
    adv = torch.where(zero_mask | ~valid_b.unsqueeze(1), torch.zeros_like(adv), adv)
    if clamp is not None:
        adv = adv.clamp(-clamp, clamp)
    n_cells = int(present.sum().item())
    frac = float(constant_g.sum().item()) / n_cells if n_cells else 0.0
    out_dtype = rewards.dtype if torch.as_tensor(rewards).dtype.is_floating_point else torch.float32
    squeeze = (lambda t: t.squeeze(1)) if was_1d else (lambda t: t)
    return AdvantageOutput(
        advantages=squeeze(adv).to(out_dtype),
        zero_std_mask=squeeze(zero_mask),
        zero_std_fraction=frac,
        group_mean=squeeze(mean_g[inv]).to(out_dtype),
        group_std=squeeze(std_g[inv]).to(out_dtype),
        num_groups=int((count[:, 0] > 0).sum().item()),
    )


def multi_reward_advantages(
    rewards: Mapping[str, Tensor] | Tensor,
    group_ids: Tensor,
    weights: Mapping[str, float] | Sequence[float] | None = None,
    mode: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize",
    renormalize: bool = True,
    **adv_kwargs,
) -> AdvantageOutput:
    r"""Advantages from several reward components :math:`R^{(m)}` with weights :math:`w_m`.

    * ``"sum_then_normalize"`` (default GRPO): :math:`A = \text{adv}(\sum_m w_m R^{(m)})`.
    * ``"normalize_then_sum"`` (GDPO, reward-decoupled normalisation; TRL's ``normalize_then_sum``):
      :math:`A' = \sum_m w_m\, \text{adv}(R^{(m)})`, each component normalised in its own group first so that a
      high-variance reward cannot drown a low-variance one. With ``renormalize=True`` the sum is then
      standardised over the whole (valid) batch, :math:`A = (A'-\bar{A'})/(\text{std}(A')+\epsilon)`, which keeps
      the advantage scale independent of the number of components (as GDPO does).

    Args:
        rewards: dict name -> (N,) tensor, or an (N, M) tensor of M components.
        group_ids: (N,) integer group ids.
        weights: per-component weights (dict keyed like ``rewards`` or a sequence); default all 1.
        mode: aggregation order.
        renormalize: batch-standardise the summed advantages in ``normalize_then_sum`` mode.
        **adv_kwargs: forwarded to :func:`group_advantages` (scale, eps, unbiased, clamp, valid).
    """
    if isinstance(rewards, Mapping):
        names = list(rewards.keys())
        comps = torch.stack([torch.as_tensor(rewards[n], dtype=torch.float64) for n in names], dim=1)
        if weights is None:
            w = torch.ones(len(names), dtype=torch.float64)
        elif isinstance(weights, Mapping):
            unknown = set(weights) - set(names)
            if unknown:
                raise KeyError(f"weights for unknown rewards {sorted(unknown)}; rewards are {names}")
            w = torch.tensor([float(weights.get(n, 1.0)) for n in names], dtype=torch.float64)
        else:
            w = torch.as_tensor(list(weights), dtype=torch.float64)
    else:
        comps = torch.as_tensor(rewards, dtype=torch.float64)
        if comps.dim() != 2:
            raise ValueError(f"tensor rewards must be (N, M), got {tuple(comps.shape)}")
        w = torch.ones(comps.shape[1], dtype=torch.float64) if weights is None else torch.as_tensor(
            list(weights), dtype=torch.float64)
    if w.numel() != comps.shape[1]:
        raise ValueError(f"{w.numel()} weights for {comps.shape[1]} reward components")

    if mode == "sum_then_normalize":
        return group_advantages(comps @ w, group_ids, **adv_kwargs)
    if mode != "normalize_then_sum":
        raise ValueError(f"unknown mode {mode!r}")
    clamp = adv_kwargs.pop("clamp", None)
    parts = [group_advantages(comps[:, m], group_ids, **adv_kwargs) for m in range(comps.shape[1])]
    summed = sum(w[m] * parts[m].advantages.to(torch.float64) for m in range(len(parts)))
    zero = torch.stack([p.zero_std_mask for p in parts], dim=0).all(dim=0)
    valid = adv_kwargs.get("valid")
    vmask = torch.ones_like(zero) if valid is None else torch.as_tensor(valid, dtype=torch.bool)
    if renormalize:
        eps = adv_kwargs.get("eps", 1e-4)
        vals = summed[vmask]
        mu = vals.mean() if vals.numel() else torch.tensor(0.0, dtype=torch.float64)
        sd = vals.std(unbiased=adv_kwargs.get("unbiased", True)) if vals.numel() > 1 else torch.tensor(0.0)
        summed = torch.where(vmask, (summed - mu) / (sd + eps), torch.zeros_like(summed))
    summed = torch.where(zero, torch.zeros_like(summed), summed)
    if clamp is not None:
        summed = summed.clamp(-clamp, clamp)
    base = group_advantages(comps @ w, group_ids, **adv_kwargs)
    n_groups = len(torch.unique(torch.as_tensor(group_ids)[vmask]))
    zero_groups = len(torch.unique(torch.as_tensor(group_ids)[zero & vmask]))
    return AdvantageOutput(
        advantages=summed.to(torch.float32),
        zero_std_mask=zero,
        zero_std_fraction=zero_groups / n_groups if n_groups else 0.0,
        group_mean=base.group_mean,
        group_std=base.group_std,
        num_groups=base.num_groups,
    )


def pairwise_win_rate(preference: Tensor, group_ids: Tensor) -> Tensor:
    r"""Pairwise win-rate rewards inside each group (Pref-GRPO); the one implementation used by both trainers
    (``flow_grpo.rewards.PairwisePreferenceReward`` calls it; ``flow_grpo.rewards.win_rate`` is an alias).

    ``preference[i, j]`` is the probability (or 0/1/0.5 verdict, a tie counting 0.5) that sample i is preferred
    over sample j. Only pairs in the same group are read (other entries, even NaN, are ignored):

    .. math:: r_i = \frac{1}{|\mathcal G_{g(i)}|-1}\sum_{j\in\mathcal G_{g(i)},\,j\ne i} P(i\succ j)

    A singleton group gets 0.5 (no comparison; neutral). Sums in float64; returns (N,) float32.
    """
    p = torch.as_tensor(preference, dtype=torch.float64)
    n = p.shape[0]
    if p.shape != (n, n):
        raise ValueError(f"preference must be square (N, N), got {tuple(p.shape)}")
    g = _check_group_ids(group_ids, n)
    same = (g.unsqueeze(0) == g.unsqueeze(1)) & ~torch.eye(n, dtype=torch.bool)
    wins = torch.where(same, p, torch.zeros((), dtype=torch.float64)).sum(dim=1)
    cnt = same.sum(dim=1)
    out = torch.where(cnt > 0, wins / cnt.clamp_min(1), torch.full_like(wins, 0.5))
    return out.to(torch.float32)


def tempsamp_shape(rewards: Tensor, tau: float = 0.8, alpha1: float = 0.01, alpha2: float = 1.0) -> Tensor:
    r"""TempSamp-R1 asymmetric non-linear soft reward shaping, applied before group normalisation.

    .. math::
        \tilde r = \begin{cases} \tau + \alpha_1 \ln\big((r-\tau)+1\big) & r \ge \tau \\
                   \tau - \dfrac{e^{\alpha_2(\tau-r)}-1}{e^{\alpha_2}-1} & r < \tau \end{cases}

    Defaults τ=0.8, α1=0.01, α2=1 (the paper's): IoU 1 → 0.8018, IoU 0 → 0.0868. High rewards are flattened into a
    plateau (so the injected ground truth cannot dominate the group mean) and differences among poor answers are
    amplified. Continuous at r=τ.

    What it is applied to matters: the TempSamp-R1 release shapes the IoU alone and then adds the format term
    (score = f(IoU) + 0.1·format; IoU 1, format 1 -> 0.9018), which is what the VLM trainer does by default
    (``methods.tempsamp_r1.shape_reward=auto``); f(weighted total) would give f(1.1) = 0.8026 (``shape_reward=total``).
    """
    r = torch.as_tensor(rewards)
    rf = r.to(torch.float64)
    hi = tau + alpha1 * torch.log1p((rf - tau).clamp_min(0.0))
    lo = tau - torch.expm1(alpha2 * (tau - rf).clamp_min(0.0)) / torch.expm1(torch.tensor(alpha2, dtype=torch.float64))
    out = torch.where(rf >= tau, hi, lo)
    return out.to(r.dtype if r.dtype.is_floating_point else torch.float32)


def anchor_offpolicy_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    is_offpolicy: Tensor,
    lam: float = 1.2,
    min_value: float | None = None,
    **adv_kwargs,
) -> AdvantageOutput:
    r"""TempSamp-R1 advantage anchoring for injected off-policy (ground-truth) group members.

    On-policy members are normalised among themselves only (the ground truth does not shift their baseline);
    each off-policy member gets :math:`A_{gt} = \lambda\cdot\max\{A_i: i \text{ on-policy in its group}\}`.
    If that max is <= 0 (e.g. all on-policy answers scored the same), :math:`A_{gt}` would be <= 0; pass
    ``min_value`` to floor it (not in the paper; off by default).
    """
    offp = torch.as_tensor(is_offpolicy, dtype=torch.bool)
    g = _check_group_ids(group_ids, offp.shape[0])
    valid = adv_kwargs.pop("valid", None)
    on_valid = ~offp if valid is None else (~offp & torch.as_tensor(valid, dtype=torch.bool))
    base = group_advantages(rewards, g, valid=on_valid, **adv_kwargs)
    adv = base.advantages.clone()
    if adv.dim() != 1:
        raise ValueError("anchoring is defined for per-sample rewards (N,)")
    uniq, inv = torch.unique(g, return_inverse=True)
    neg_inf = torch.full((uniq.numel(),), float("-inf"), dtype=adv.dtype)
    max_on = neg_inf.scatter_reduce(0, inv[on_valid], adv[on_valid], reduce="amax")
    anchored = lam * max_on[inv]
    anchored = torch.where(torch.isfinite(anchored), anchored, torch.zeros_like(anchored))
    if min_value is not None:
        anchored = anchored.clamp_min(min_value)
    adv = torch.where(offp, anchored, adv)
    return AdvantageOutput(adv, base.zero_std_mask & ~offp, base.zero_std_fraction, base.group_mean,
                           base.group_std, base.num_groups)


def offpolicy_diagnostics(
    rewards: Tensor, advantages: Tensor, group_ids: Tensor, is_offpolicy: Tensor, eps: float = 1e-4
) -> dict[str, float]:
    r"""Diagnostics of mixed-policy groups (TempSamp-R1), averaged over groups that contain an off-policy member.

    * ``mu_onpolicy`` / ``mu_group``: mean on-policy reward vs mean of the whole group;
    * ``sigma_onpolicy`` / ``sigma_group``: the corresponding (population) stds;
    * ``contamination``: :math:`|\mu_g-\mu_{op}|/(\sigma_{op}+\epsilon)`;
    * ``sign_flip_rate``: fraction of on-policy samples whose advantage sign (as given) differs from the sign of
      :math:`r_i-\mu_{op}` (their sign had the off-policy member not been in the group); zeros count as no flip;
    * ``groups_no_positive_onpolicy``: fraction of such groups where no on-policy advantage is > 0.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64)
    a = torch.as_tensor(advantages, dtype=torch.float64)
    offp = torch.as_tensor(is_offpolicy, dtype=torch.bool)
    g = _check_group_ids(group_ids, r.shape[0])
    stats = {k: [] for k in ("mu_onpolicy", "mu_group", "sigma_onpolicy", "sigma_group", "contamination",
                             "groups_no_positive_onpolicy")}
    flips, n_on = 0, 0
    for gid in torch.unique(g[offp]).tolist():
        m = g == gid
        on = m & ~offp
        if on.sum() == 0:
            continue
        r_on, r_all = r[on], r[m]
        mu_op, mu_g = r_on.mean(), r_all.mean()
        sd_op = r_on.std(unbiased=False)
        stats["mu_onpolicy"].append(mu_op.item())
        stats["mu_group"].append(mu_g.item())
        stats["sigma_onpolicy"].append(sd_op.item())
        stats["sigma_group"].append(r_all.std(unbiased=False).item())
        stats["contamination"].append((abs(mu_g - mu_op) / (sd_op + eps)).item())
        stats["groups_no_positive_onpolicy"].append(float(not bool((a[on] > 0).any())))
        ref_sign = torch.sign(r_on - mu_op)
        got_sign = torch.sign(a[on])
        flips += int(((ref_sign * got_sign) < 0).sum().item())
        n_on += int(on.sum().item())
    out = {k: (sum(v) / len(v) if v else 0.0) for k, v in stats.items()}
    out["sign_flip_rate"] = flips / n_on if n_on else 0.0
    return out

