r"""NGRPO (Negative-enhanced GRPO, Nan et al. 2025, arXiv 2509.18851): ``methods.ngrpo.enabled=true``.

**Advantage calibration.** Each group's statistics include k virtual samples with the maximum reward R
(``methods.ngrpo.max_reward``, ``num_virtual`` = k); only the real members are trained. For a group with valid
real rewards :math:`r_1..r_n`:

.. math::
    x = (r_1, \dots, r_n, \underbrace{R, \dots, R}_{k}),\quad \mu = \frac{1}{n+k}\sum x,\quad
    \sigma = \sqrt{\tfrac{1}{n+k-1}\sum (x-\mu)^2},\quad A_i = \frac{r_i-\mu}{\sigma+\epsilon}

so an all-wrong group (every :math:`r_i < R` and equal) keeps a negative advantage
:math:`-(R-r)\,k/(n+k)/\sigma` instead of 0, while an all-correct group (every :math:`r_i = R`) still gets 0 and is
the only kind flagged zero-variance (with ``algo.filter_zero_std`` DAPO's refill then drops exactly the
all-correct groups, the release's ``filter_groups.strategy=all_correct``). Example (the paper's): 1 correct of
8 binary answers gives A = 1.764 / -0.504 instead of GRPO's 2.474 / -0.354.

**Asymmetric clipping.** The PPO ratio is clipped to :math:`[1-\epsilon_{low}, 1+\epsilon_{high}]` with a looser
bound where it limits positive-advantage tokens and a tighter one for negative-advantage tokens
(``methods.ngrpo.clip_low`` / ``clip_high``, the release's 0.16 / 0.24; ``none`` keeps ``algo.clip_low`` /
``clip_high``). With PPO's min, ``clip_high`` only binds for A > 0 and ``clip_low`` only for A < 0, which is what
``core.policy_loss`` already does with two epsilons.

Defaults follow the release's training script (max reward 1.0, one virtual sample, clip 0.16 / 0.24, unbiased
std as ``torch.std``). Open choices and deviations, each with its switch:

* epsilon: ``algo.adv_eps`` (house default 1e-4; the release adds 1e-6 -- set ``algo.adv_eps=1e-6``);
* the estimator needs ``algo.adv_scale=group`` (the paper defines no batch / unscaled variant) and refuses
  ``methods.tempsamp_r1.mode=anchor`` (two estimators for one group);
* a valid reward above ``max_reward`` is an error, not a silent shift of the virtual sample: set
  ``max_reward`` to the task's largest weighted total (e.g. 1.1 for IoU + 0.1 format);
* groups with fewer than 2 valid real members get advantage 0 as with every estimator of this trainer (the release
  gives a lone response A = r, mean 0 / std 1; our groups always have G >= 2 members unless rewards failed);
* the release's DAPO group filter is not switched on by this method (``algo.filter_zero_std=true`` does it).
"""
from __future__ import annotations

import functools

import torch

from mmgrpo.core import AdvantageOutput
from mmgrpo.vlm.methods.base import Estimator, PolicyLoss, VLMMethod, grpo_loss

__all__ = ["NGRPO", "ngrpo_advantages"]


def ngrpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, max_reward: float = 1.0, num_virtual: int = 1,
                     eps: float = 1e-4, valid: torch.Tensor | None = None, scale: str = "group") -> AdvantageOutput:
    """Calibrated advantages (module docstring); rewards (N,) float, group_ids (N,) int64, valid (N,) bool.

    Statistics in float64; invalid rows get 0 and enter no statistic. ``zero_std_mask`` marks rows of groups
    whose augmented rewards are all equal (every real reward == max_reward)."""
    if scale != "group":
        raise ValueError(f"NGRPO normalises by the calibrated group std: algo.adv_scale must be 'group', got {scale!r}")
    if num_virtual < 1:
        raise ValueError(f"NGRPO needs num_virtual >= 1, got {num_virtual}")
    r = torch.as_tensor(rewards, dtype=torch.float64)
    gid = torch.as_tensor(group_ids)
    if r.dim() != 1 or gid.shape != r.shape:
        raise ValueError(f"rewards and group_ids must both be (N,), got {tuple(r.shape)} and {tuple(gid.shape)}")
    ok = torch.ones_like(gid, dtype=torch.bool) if valid is None else torch.as_tensor(valid, dtype=torch.bool)
    # a weighted total summed in float32 lands a rounding step off its exact value (IoU 1 + 0.1 x format 1 =
    # 1.10000002): within that tolerance it is the maximum, not above it, and counts as exactly max_reward
    tol = 1e-5 * max(1.0, abs(float(max_reward)))
    if (r[ok] > max_reward + tol).any():
        raise ValueError(f"NGRPO: a reward ({float(r[ok].max()):g}) exceeds methods.ngrpo.max_reward={max_reward:g}; "
                         "set it to the task's largest possible (weighted) reward")
    r = torch.where(ok & (r > max_reward), torch.full_like(r, float(max_reward)), r)
    adv, mean, std = (torch.zeros_like(r) for _ in range(3))
    zero = torch.zeros_like(ok)
    groups = torch.unique(gid[ok]).tolist()
    for g in groups:
        m = (gid == g) & ok
        x = torch.cat([r[m], torch.full((num_virtual,), float(max_reward), dtype=torch.float64)])
        mu, sd = x.mean(), x.std(unbiased=True)
        mean[m], std[m] = mu, sd
        if bool((x == x[0]).all()):
            zero[m] = True  # every member at the maximum: nothing to learn, advantage exactly 0
        else:
            adv[m] = (r[m] - mu) / (sd + eps)
    n_zero = len({int(g) for g in gid[zero].tolist()})
    out_dtype = rewards.dtype if torch.as_tensor(rewards).dtype.is_floating_point else torch.float32
    return AdvantageOutput(advantages=adv.to(out_dtype), zero_std_mask=zero,
                           zero_std_fraction=n_zero / len(groups) if groups else 0.0,
                           group_mean=mean.to(out_dtype), group_std=std.to(out_dtype), num_groups=len(groups))


class NGRPO(VLMMethod):
    name = "ngrpo"

    @classmethod
    def check(cls, cfg) -> None:
        if not cfg.methods.ngrpo.enabled:
            return
        if cfg.algo.adv_scale != "group":
            raise ValueError(f"methods.ngrpo needs algo.adv_scale=group (got {cfg.algo.adv_scale!r})")
        if cfg.methods.tempsamp_r1.enabled and cfg.methods.tempsamp_r1.mode == "anchor":
            raise ValueError("methods.ngrpo and methods.tempsamp_r1.mode=anchor both replace the advantage estimator; "
                             "use methods.tempsamp_r1.mode=shape or none")

    def advantage_estimator(self) -> Estimator:
        o = self.cfg.methods.ngrpo
        return Estimator(gathered=functools.partial(ngrpo_advantages, max_reward=o.max_reward,
                                                    num_virtual=o.num_virtual))

    def loss(self) -> PolicyLoss | None:
        """The default loss with NGRPO's asymmetric clip bounds (Reg-GRPO's loss, which has no clip, wins)."""
        o = self.cfg.methods.ngrpo
        if self.cfg.algo.loss_type == "reg":
            return None
        return PolicyLoss(functools.partial(grpo_loss, clip_low=o.clip_low, clip_high=o.clip_high))
