"""Reward-model ensembles (Coste et al., ICLR 2024, "Reward Model Ensembles Help Mitigate Overoptimization"): the
training reward of each sample becomes the ensemble's worst case (WCO, ``min_k r_k``) or its uncertainty-weighted
mean (UWO, ``mean_k r_k - lam var_k r_k``) over the members, reward components named in ``reward.weights`` (their
weights only decide that they are scored; the ensemble replaces the weighted total). Formulas:
:mod:`mmgrpo.core.reward_shaping`.

``normalize=true`` puts the members on one scale first: each is standardised with the mean and std of its values
in the *first* batch the run scores (the initial policy's, kept in the checkpoint), as the paper normalises each
reward model on the initial policy's samples; a fixed affine map, so the members' later drift stays visible.
``methods.reward_ensemble.members=[a, b, ...]``.
"""
from __future__ import annotations

import torch

from mmgrpo.core.reward_shaping import uncertainty_weighted, worst_case
from mmgrpo.engine.dist import gather_rows

from .base import FlowMethod

__all__ = ["RewardEnsemble"]


class RewardEnsemble(FlowMethod):
    name = "reward_ensemble"

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.reward_ensemble
        missing = [k for k in o.members if k not in cfg.reward.weights]
        if missing:
            raise ValueError(f"methods.reward_ensemble.members {missing} are not scored: add them to reward.weights "
                             f"(weight 0 scores a component without adding it to the total)")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.opts = cfg.methods.reward_ensemble
        self.norm: dict = {}  # member -> (mean, std) of the first batch (normalize=true)

    def _device(self):
        return getattr(self.run, "device", None)

    def on_rewards(self, traj) -> None:
        o = self.opts
        r = torch.stack([traj.rewards[k].double() for k in o.members])  # (K, N)
        if o.normalize:
            if not self.norm:
                (allr,), _ = gather_rows([r.T.contiguous()], self._device())
                self.norm = {k: (float(allr[:, i].mean()), max(float(allr[:, i].std(unbiased=False)), 1e-6))
                             for i, k in enumerate(o.members)}
            r = torch.stack([(r[i] - self.norm[k][0]) / self.norm[k][1] for i, k in enumerate(o.members)])
        total = worst_case(r) if o.mode == "worst_case" else uncertainty_weighted(r, o.lam)
        traj.rewards["proxy_total"] = traj.rewards["total"]
        traj.rewards["total"] = total.float()
        self._spread = float(r.std(0, unbiased=False).mean()) if r.shape[0] > 1 else 0.0

    def end_of_step(self, traj, metrics: dict) -> None:
        metrics["reward_ensemble/member_std"] = getattr(self, "_spread", 0.0)

    def state_dict(self):
        return {"norm": {k: list(v) for k, v in self.norm.items()}}

    def load_state_dict(self, sd: dict) -> None:
        self.norm = {k: tuple(v) for k, v in (sd.get("norm") or {}).items()}
