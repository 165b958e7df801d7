"""GRPO-Guard (Wang et al., arXiv 2510.22319): the per-step importance ratio normalised before PPO's clip.

Flow-GRPO's SDE steps have a Gaussian policy ``N(mu_theta, s_k^2 I)`` whose std ``s_k`` shrinks toward the end of
sampling. The plain log-ratio of one step, averaged over the D latent dims as the project (and Flow-GRPO) scores
it, is

    Delta_k = mean_d[(x - mu_old)^2 - (x - mu)^2] / (2 s_k^2)
            = mean_d[(mu - mu_old) (x - mu_old)] / s_k^2 - mean_d[(mu - mu_old)^2] / (2 s_k^2):

its mean over rollouts is negative once the policy moved (the ratio's mean is < 1: the second term) and its spread
scales with 1 / s_k, so low-noise steps are clipped far more than high-noise ones and their gradients dominate.
GRPO-Guard replaces it by

    g_k = Delta_k * s_k + mean_d[(mu - mu_old)^2] / (2 s_k) = mean_d[(mu - mu_old) * eps_old],

``eps_old = (x - mu_old) / s_k`` the standard normal noise of the recorded transition: the bias term is removed
(RatioNorm: E[g_k] = 0 whatever the step) and the ratio lives on one scale at every step, so the same clip range
regulates every step alike (the "regulated clipping") and the gradient of step k is reweighted by s_k. PPO's clip
then acts on ``exp(g_k)``. With one optimizer step per rollout (mu = mu_old when the gradient is taken) the
gradient is ``s_k`` times the plain one at every step. ``s_k`` is the step's std (``SDEStepOutput.std``:
``g sqrt(-dt)`` for flow/dance, Flow-Factory's ``sqrt(-dt) * std_dev_t``).

The old mean ``mu_old`` is recorded by the rollout (``FlowMethod.keeps_means`` -> ``Trajectories.old_means``).
``methods.grpo_guard.enabled=true``. Not combinable with a credit that replaces the loss (DiffusionNFT) or with
``sample.cps_tempered`` (its log-prob is not a Gaussian's).
"""
from __future__ import annotations

import torch

from .base import ColumnContext, FlowMethod

__all__ = ["guard_log_ratio", "GRPOGuard"]


def guard_log_ratio(log_ratio: torch.Tensor, mean: torch.Tensor, old_mean: torch.Tensor,
                    std: torch.Tensor) -> torch.Tensor:
    """(B,) ``g = log_ratio * s + mean_d (mu - mu_old)^2 / (2 s)``. ``log_ratio`` (B,) the plain per-dim-mean
    log-ratio, ``mean`` / ``old_mean`` (B, *latent), ``std`` (B,) or broadcastable (B, 1, ..., 1), > 0."""
    s = std.float().reshape(std.shape[0], -1)[:, 0]
    if bool((s <= 0).any()):
        raise ValueError("guard_log_ratio: the step's std must be > 0")
    mse = (mean.float() - old_mean.float()).pow(2).flatten(1).mean(1)
    return log_ratio.float() * s + mse / (2 * s)


class GRPOGuard(FlowMethod):
    name = "grpo_guard"
    keeps_means = True

    @classmethod
    def check(cls, cfg) -> None:
        if cfg.sample.cps_tempered:
            raise ValueError("methods.grpo_guard needs the Gaussian log-prob: set sample.cps_tempered=false")
        if cfg.sample.credit == "nft":
            raise ValueError("methods.grpo_guard normalises the PPO ratio; sample.credit=nft has no ratio")

    def adjust_log_ratio(self, ctx: ColumnContext, log_ratio: torch.Tensor) -> torch.Tensor:
        traj = ctx.traj
        if traj.old_means is None:
            raise RuntimeError("grpo_guard: the rollout did not record the old means (Trajectories.old_means)")
        c0, c1 = ctx.chunk
        old_mean = traj.old_means[c0:c1, ctx.col].to(ctx.out.mean.device)
        std = torch.where(ctx.mask.view(-1, *([1] * (ctx.out.std.ndim - 1))).to(ctx.out.std.device), ctx.out.std,
                          torch.ones_like(ctx.out.std))  # rows not trained may be ODE steps (std 0)
        g = guard_log_ratio(log_ratio.squeeze(1), ctx.out.mean, old_mean, std)
        g = torch.where(ctx.mask.to(g.device), g, torch.zeros_like(g))
        if bool(ctx.mask.any()):
            self._g.append(float(g.detach()[ctx.mask.to(g.device)].mean()))
        return g.unsqueeze(1).to(log_ratio.dtype)

    def on_train_start(self, resumed: bool) -> None:
        self._g = []

    def end_of_step(self, traj, metrics: dict) -> None:
        g = getattr(self, "_g", [])
        metrics["grpo_guard/log_ratio_mean"] = sum(g) / len(g) if g else 0.0
        self._g = []
