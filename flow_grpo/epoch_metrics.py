"""The metrics row of one flow training epoch, over the whole gathered batch (all processes): rewards, group and
advantage statistics, reward call counters, NFEs, timings, gradient norms and loss statistics. Functions of explicit
arguments; the recipe adds its run totals (epoch, LR, skipped steps)."""
from __future__ import annotations

import torch

from mmgrpo.engine.dist import all_gather_object, all_reduce, gather_rows

REWARD_COUNTERS = ("calls", "retries", "timeouts", "failed_calls", "dropped")


def _reward_metrics(traj, names: list[str], win_rate: bool, device) -> tuple[dict, float, float]:
    """Reward means (total, components, win rates) of the valid samples; also the image count and the number of
    samples with a trained step."""
    extra = ["win_rate", "pointwise_total"] if win_rate else []
    valid = traj.rewards["valid"]
    cols = torch.stack([traj.rewards["total"].float()] + [traj.rewards[k].float() for k in names + extra], 1)
    (cols_all, v_all, tm_all), _ = gather_rows([cols, valid, traj.train_mask.any(1)], device)
    vcols = cols_all[v_all]
    out = {
        "reward/total/mean": float(vcols[:, 0].mean()) if len(vcols) else float("nan"),
        "reward/total/std": float(vcols[:, 0].std()) if len(vcols) > 1 else 0.0,
        **{f"reward/{k}/mean": (float(vcols[:, j + 1].mean()) if len(vcols) else float("nan"))
           for j, k in enumerate(names + extra)},
        "reward/valid_fraction": float(v_all.float().mean()),
    }
    return out, float(cols_all.shape[0]), float(tm_all.sum())


def _update_metrics(upd: dict, beta: float) -> dict:
    """Loss statistics (``train/*``), on-policy ratios per step (``ratio/step_k``) and KL of every process."""
    out = {}
    merged: dict[str, tuple[float, int]] = {}
    for part in all_gather_object(upd["acc_metrics"]):
        for k, (s_, n_) in part.items():
            a, b = merged.get(k, (0.0, 0))
            merged[k] = (a + s_, b + n_)
    for k, (s_, n_) in sorted(merged.items()):
        out[f"train/{k}"] = s_ / max(n_, 1)
    cols_ratio: dict[int, list[float]] = {}
    for part in all_gather_object(upd["per_col"]):
        for k, v in part.items():
            cols_ratio.setdefault(k, []).extend(v)
    for k, v in sorted(cols_ratio.items()):
        out[f"ratio/step_{k}"] = sum(v) / len(v)
    if beta > 0:
        allk = [x for part in all_gather_object(upd["kls"]) for x in part]
        if allk:
            out["train/kl"] = sum(allk) / len(allk)
    return out


def epoch_metrics(traj, stats: dict, rsum: list, upd: dict, t_sample: float, t_train: float, *,
                  reward_names: list[str], win_rate: bool, kl_coef: float, device) -> dict:
    """``traj``: the epoch's rollouts (this process's); ``stats``: the advantage / group statistics; ``rsum``: the
    reward call counters (:data:`REWARD_COUNTERS`) summed over processes; ``upd``: what
    :func:`~flow_grpo.train.steps.run_updates` collected; ``reward_names``: the reward components; ``win_rate``: the
    totals are Pref-GRPO win rates (``reward.mode=win_rate``); ``kl_coef``: ``optim.kl_coef`` (a KL is logged when
    > 0)."""
    rewards, n_images, n_trained = _reward_metrics(traj, reward_names, win_rate, device)
    # NFEs per trajectory of the whole batch: each process's mean depends on its own step plans (TP-GRPO's and
    # G2RPO's completions start at each sample's window)
    nfe_sum, n_traj = all_reduce([traj.nfe_per_trajectory * len(traj), float(len(traj))], "sum", device)
    grad_norms, status = upd["grad_norms"], upd["status"]
    out = {
        **rewards,
        "reward/calls": rsum[0], "reward/retries": rsum[1], "reward/timeouts": rsum[2],
        "reward/failed_calls": rsum[3], "reward/dropped_by_failure": rsum[4],
        **stats,
        "nfe_per_trajectory": nfe_sum / max(n_traj, 1.0),
        "time/sample_s": t_sample, "time/train_s": t_train,
        "images_per_s": n_images / max(t_sample + t_train, 1e-9),
        "actual_batch_size": n_trained,
        "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
        "steps/applied": float(status["applied"]), "steps/skipped": float(status["skipped"]),
        "steps/empty": float(status["empty"]),
    }
    out.update(_update_metrics(upd, kl_coef))
    return out
