"""Outcome credit (Flow-GRPO, DanceGRPO, MixGRPO, Fast, Pref-GRPO on win rates): one reward per trajectory,
group-normalised with explicit group ids; every trained step of a sample gets its advantage. ``per_reward``
(GDPO, ``reward.mode=per_reward``): each reward component z-scored in its group, then the weighted sum."""
from __future__ import annotations

import torch

from .base import CreditInputs, CreditOutput, FlowMethod


def outcome_advantages(inp: CreditInputs) -> CreditOutput:
    from mmgrpo.engine.groups import distributed_group_advantages

    N, T = inp.train_mask.shape
    dev = inp.device
    out = distributed_group_advantages(inp.rewards["total"].to(dev), inp.group_ids.to(dev),
                                       valid=inp.valid.to(dev), **inp.opts.kw())
    adv = out.advantages.cpu().float().unsqueeze(1).expand(N, T).clone()
    return CreditOutput(adv, {"adv/zero_std_fraction": out.zero_std_fraction})


def per_reward_advantages(inp: CreditInputs) -> CreditOutput:
    from mmgrpo.core import multi_reward_advantages

    N, T = inp.train_mask.shape
    names = list(inp.weights)
    comps = torch.stack([inp.rewards[k].double() for k in names], 1)
    (comps_all, g_all, v_all), sl = inp.gather([comps, inp.group_ids, inp.valid])
    out = multi_reward_advantages({k: comps_all[:, j] for j, k in enumerate(names)}, g_all, dict(inp.weights),
                                  mode="normalize_then_sum", valid=v_all, **inp.opts.kw())
    adv = out.advantages[sl].float().unsqueeze(1).expand(N, T).clone()
    return CreditOutput(adv, {"adv/zero_std_fraction": out.zero_std_fraction})


class Outcome(FlowMethod):
    name = "outcome"

    def advantage_estimator(self):
        return outcome_advantages


class PerReward(FlowMethod):
    name = "per_reward"

    def advantage_estimator(self):
        return per_reward_advantages
