"""TP-GRPO (turning points): rewards R_0..R_n of ODE completions before every SDE step of a contiguous window
(``step_rewards``), turned into per-step rewards with turning points (:func:`mmgrpo.core.turning_point_rewards`,
balanced per group) and z-scored per step in each group (:func:`mmgrpo.core.step_advantages`)."""
from __future__ import annotations

import torch

from .base import CreditInputs, CreditOutput, FlowMethod


def window_layout(train_mask: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Window length n (equal for all samples) and, per sample, the column of its j-th SDE step (N, n)."""
    sde_counts = train_mask.sum(1)
    n = int(sde_counts[0])
    if not bool((sde_counts == n).all()) or n < 1:
        raise ValueError("tp_grpo needs the same number of SDE steps for every sample")
    pos = torch.stack([torch.nonzero(train_mask[i]).flatten() for i in range(train_mask.shape[0])])
    return n, pos


def tp_grpo_step_rewards(adapter, traj, embeds, sig, reward_fn, weights, r_final):
    """R (N, n+1): R_j = reward of the ODE completion from the state *before* the j-th SDE step (j = 0..n-1;
    R_0 is therefore the ODE completion of x_T itself through the shared ODE prefix), R_n = final reward.
    All n*N completions are batched (end-aligned, per-item sigma). Returns (R, completion NFEs per trajectory,
    (N,) validity: every completion of the sample was scored).

    The first Euler step of the completion from x_k uses v(x_k, sigma_k), which the rollout already evaluated
    (same latent, sigma, embeddings, guidance and CFG combination), so each completion starts from the stored
    ``traj.ode_next_latents`` = x_k + (sigma_{k+1} - sigma_k) v at sigma_{k+1} with schedule ``sig[k+1:]``:
    one NFE less per completion (FLUX K=6, n=5: 15 instead of 20 per trajectory). For k = K-1 the schedule is
    ``[0]`` (no call): the image is the decode of the stored Euler step. Without ``ode_next_latents`` (e.g. a
    Trajectories built elsewhere) it falls back to the full completion from ``traj.latents`` over ``sig[k:]``."""
    from flow_grpo.completions import complete_and_score

    n, pos = window_layout(traj.train_mask)
    N = len(traj)
    reuse = traj.ode_next_latents is not None
    items_lat, items_sched, items_src = [], [], []
    for j in range(n):
        for i in range(N):
            col = int(pos[i, j])
            k = int(traj.step_indices[col])
            if reuse:
                items_lat.append(traj.ode_next_latents[i, col])
                items_sched.append(sig[k + 1:])
            else:
                items_lat.append(traj.latents[i, col])
                items_sched.append(sig[k:])
            items_src.append(i)
    total, sc = complete_and_score(adapter, traj, embeds, items_lat, items_sched, items_src, reward_fn, weights)
    R = torch.cat([total.view(n, N).t(), r_final.view(N, 1)], dim=1)
    nfe = sum(len(s) - 1 for s in items_sched) / N
    return R, nfe, sc["valid"].view(n, N).all(0)


def tp_grpo_advantages(inp: CreditInputs) -> CreditOutput:
    """Invalid samples leave the turning-point statistics entirely; column j of the window of sample i gets
    A[i, j] (scattered to its trained column)."""
    from mmgrpo.core import step_advantages, turning_point_rewards

    N, T = inp.train_mask.shape
    (R_all, g_all, v_all), sl = inp.gather([inp.step_rewards, inp.group_ids, inp.valid])
    n = R_all.shape[1] - 1
    A_all = torch.zeros(R_all.shape[0], n)
    stats: dict = {}
    if bool(v_all.any()):
        credit = turning_point_rewards(R_all[v_all], g_all[v_all], balance=True, balance_scope="group")
        A_all[v_all] = step_advantages(credit.step_rewards, g_all[v_all], **inp.opts.kw()).float()
        stats.update(credit.stats())
        for j in range(n):
            stats[f"step_reward/mean_{j}"] = float(credit.step_rewards[:, j].float().mean())
    _, pos = window_layout(inp.train_mask)
    adv = torch.zeros(N, T)
    adv.scatter_(1, pos, A_all[sl])
    stats["adv/zero_std_fraction"] = float((A_all[v_all].abs().sum(0) == 0).float().mean()) \
        if bool(v_all.any()) else 1.0
    return CreditOutput(adv, stats)


def check_contiguous_plan(cfg) -> None:
    if cfg.step_mode not in ("window", "all"):
        raise ValueError("credit=tp_grpo needs step_mode window or all (a contiguous SDE block)")


class TPGRPO(FlowMethod):
    name = "tp_grpo"
    has_step_rewards = True
    keeps_ode_next = True

    def check_sampling(self, s) -> None:
        check_contiguous_plan(s)

    def step_rewards(self, adapter, traj, embeds, sig, reward_fn, weights, r_final):
        return tp_grpo_step_rewards(adapter, traj, embeds, sig, reward_fn, weights, r_final)

    def advantage_estimator(self):
        return tp_grpo_advantages
