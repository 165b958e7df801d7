"""G²RPO (multi-granularity): after the single SDE step of each sample, ODE completions at several strides
(``methods.g2rpo.granularities``; stride 1 = the trajectory itself) are scored (``step_rewards``); the advantage is the sum
over granularities of the group-normalised rewards, clamped to ``optim.adv_clip_max``."""
from __future__ import annotations

import torch

from .base import CreditInputs, CreditOutput, FlowMethod


def granular_schedule(sig: torch.Tensor, start: int, stride: int) -> torch.Tensor:
    """Sub-grid sig[start], sig[start+stride], ..., always ending with the final sigma (0)."""
    idx = list(range(start, len(sig), stride))
    if idx[-1] != len(sig) - 1:
        idx.append(len(sig) - 1)
    return sig[idx]


def g2rpo_step_rewards(adapter, traj, embeds, sig, reward_fn, weights, r_final, granularities=(1, 2)):
    """(N, |granularities|): reward of the ODE completion after the single SDE step at each stride;
    stride 1 is the trajectory itself (its final reward). Also returns the NFEs and the (N,) validity."""
    from flow_grpo.completions import complete_and_score

    N = len(traj)
    grans = [int(g) for g in granularities]
    if any(g < 1 for g in grans):
        raise ValueError(f"granularities must be >= 1, got {grans}")
    cols = torch.stack([torch.nonzero(traj.train_mask[i]).flatten()[0] for i in range(N)])
    R = torch.zeros(N, len(grans))
    items_lat, items_sched, items_src, items_g = [], [], [], []
    for gi, g in enumerate(grans):
        if g == 1:
            R[:, gi] = r_final
            continue
        for i in range(N):
            col = int(cols[i])
            k = int(traj.step_indices[col])
            items_lat.append(traj.next_latents[i, col])
            items_sched.append(granular_schedule(sig, k + 1, g))
            items_src.append(i)
            items_g.append(gi)
    nfe = 0.0
    valid = torch.ones(N, dtype=torch.bool)
    if items_lat:
        total, sc = complete_and_score(adapter, traj, embeds, items_lat, items_sched, items_src, reward_fn, weights)
        for t, ok, i, gi in zip(total.tolist(), sc["valid"].tolist(), items_src, items_g):
            R[i, gi] = t
            valid[i] &= bool(ok)
        nfe = sum(len(s) - 1 for s in items_sched) / N
    return R, nfe, valid


def g2rpo_advantages(inp: CreditInputs) -> CreditOutput:
    from mmgrpo.engine.groups import distributed_group_advantages

    N, T = inp.train_mask.shape
    dev = inp.device
    total = torch.zeros(N)
    fr = []
    for gi in range(inp.step_rewards.shape[1]):
        out = distributed_group_advantages(inp.step_rewards[:, gi].to(dev), inp.group_ids.to(dev),
                                           valid=inp.valid.to(dev), **inp.opts.kw())
        total += out.advantages.cpu().float()
        fr.append(out.zero_std_fraction)
    adv = total.clamp(-inp.opts.clamp, inp.opts.clamp).unsqueeze(1).expand(N, T).clone()
    return CreditOutput(adv, {"adv/zero_std_fraction": sum(fr) / len(fr)})


def check_single_plan(cfg) -> None:
    if cfg.step_mode != "single":
        raise ValueError("credit=g2rpo needs step_mode=single")


class G2RPO(FlowMethod):
    name = "g2rpo"
    has_step_rewards = True

    def check_sampling(self, s) -> None:
        check_single_plan(s)

    def step_rewards(self, adapter, traj, embeds, sig, reward_fn, weights, r_final):
        return g2rpo_step_rewards(adapter, traj, embeds, sig, reward_fn, weights, r_final,
                                  self.cfg.methods.g2rpo.granularities)

    def advantage_estimator(self):
        return g2rpo_advantages
