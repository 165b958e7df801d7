"""PAR, Preference As Reward (Fu et al. 2025, "Reward Shaping to Mitigate Reward Hacking in RLHF"): the training
reward becomes ``sigmoid((r - r_ref) / tau)``, bounded, steepest at the reference and flat far above it (the
paper's principles: bounded, fast-then-slow growth, centred on the reference), :func:`mmgrpo.core.reward_shaping.
par_sigmoid`.

``r_ref`` is the reference policy's reward for the same prompt. The paper samples the reference (SFT) model's
responses for each prompt; here the reference reward of a prompt is the mean reward of the first group the run
draws for it (the initial policy's samples; kept per prompt in the checkpoint), which costs no extra rollout. A
prompt first drawn after the policy moved takes its reference from that group: with few prompts (every prompt in
the first epochs) this is the initial policy. ``tau`` = 1 is the paper's; a reward whose range is far from O(1)
needs a tau of its spread. ``methods.par.enabled=true``.

Note: under GRPO's per-group standardisation (``optim.adv_scale=group``/``batch``) a monotone map of the reward
changes the advantages only through its curvature; ``optim.adv_scale=none`` keeps PAR's bound on the advantages.
"""
from __future__ import annotations

import torch

from mmgrpo.core.reward_shaping import par_sigmoid

from .base import FlowMethod

__all__ = ["PAR"]


class PAR(FlowMethod):
    name = "par"

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.opts = cfg.methods.par
        self.ref: dict[int, float] = {}  # prompt key -> reference reward

    def on_rewards(self, traj) -> None:
        from ..data import prompt_keys

        r = traj.rewards["total"].double()
        valid = traj.rewards.get("valid", torch.ones(len(r), dtype=torch.bool)).bool()
        keys = prompt_keys(traj.prompts).tolist()
        gids = traj.group_ids.tolist()
        # reference of a prompt: the mean valid reward of its first group (this process's members of it)
        new: dict[int, list[float]] = {}
        for i, (k, g) in enumerate(zip(keys, gids)):
            if k not in self.ref and bool(valid[i]):
                new.setdefault(k, []).append(float(r[i]))
        self.ref.update({k: sum(v) / len(v) for k, v in new.items()})
        ref = torch.tensor([self.ref.get(k, float(r[i])) for i, k in enumerate(keys)], dtype=torch.float64)
        traj.rewards["proxy_total"] = traj.rewards["total"]
        traj.rewards["total"] = par_sigmoid(r, ref, self.opts.tau).float()
        self._above = float((r > ref).double().mean()) if len(r) else 0.0

    def end_of_step(self, traj, metrics: dict) -> None:
        metrics["par/frac_above_ref"] = getattr(self, "_above", 0.0)

    def state_dict(self):
        return {"ref": {str(k): v for k, v in self.ref.items()}}

    def load_state_dict(self, sd: dict) -> None:
        self.ref = {int(k): float(v) for k, v in (sd.get("ref") or {}).items()}
