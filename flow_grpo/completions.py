"""Batched deterministic (Euler) ODE completions from intermediate states, decoded and scored: the extra rewards
of the step credits (TP-GRPO turning points, G²RPO granularities; :mod:`flow_grpo.methods`)."""
from __future__ import annotations

from typing import Sequence

import torch

from .models.base import FlowModelAdapter, PromptEmbeds
from .scoring import score_rewards
from .sde import sde_step


def ode_complete(adapter: FlowModelAdapter, latents: torch.Tensor, embeds: PromptEmbeds,
                 schedules: Sequence[torch.Tensor], guidance_scale: float, cfg: bool,
                 max_batch: int = 32) -> tuple[torch.Tensor, int]:
    """Batched deterministic (Euler) completions with a per-item sigma schedule.

    ``latents`` (M, ...) are at ``schedules[m][0]``; item m is integrated along ``schedules[m]`` (1-D, decreasing,
    ending at 0). Items are aligned at the *end*: at round r every item with steps left advances one step, all in
    one model call with a (B,) sigma tensor, so the number of model calls per chunk is the longest schedule.
    Returns the final latents and the number of model calls made."""
    m = latents.shape[0]
    out = latents.clone().float()
    calls = 0
    lengths = [len(s) - 1 for s in schedules]
    for c0 in range(0, m, max_batch):
        idx = list(range(c0, min(m, c0 + max_batch)))
        L = max(lengths[i] for i in idx)
        for r in range(L):
            act = [i for i in idx if lengths[i] >= L - r]
            if not act:
                continue
            j = [r - (L - lengths[i]) for i in act]
            s = torch.stack([schedules[i][jj] for i, jj in zip(act, j)]).float()
            sn = torch.stack([schedules[i][jj + 1] for i, jj in zip(act, j)]).float()
            at = torch.tensor(act, dtype=torch.long, device=out.device)
            x = out[at]
            v = adapter.predict_velocity(x, s.to(x.device), embeds.index(at), guidance_scale, cfg)
            out[at] = sde_step(v, x, s.to(x.device), sn.to(x.device), kind="ode").prev_sample
            calls += 1
    return out, calls


def complete_and_score(adapter: FlowModelAdapter, traj, embeds: PromptEmbeds, latents: list, schedules: list,
                       src: list, reward_fn, weights) -> tuple[torch.Tensor, dict]:
    """ODE-complete ``latents[m]`` along ``schedules[m]`` with the prompt of sample ``src[m]`` of ``traj``, decode in
    chunks of ``sample.completion_batch_size`` and score: ``(total (M,), scores incl. "valid")``."""
    s = traj.sampling
    idx = torch.tensor(src, dtype=torch.long)
    out, _ = ode_complete(adapter, torch.stack(latents), embeds.index(idx.to(embeds.prompt_embeds.device)), schedules,
                          s.guidance_scale, s.cfg, s.completion_batch_size)
    bs = s.completion_batch_size
    imgs = torch.cat([adapter.decode(out[c:c + bs], s.height, s.width).cpu() for c in range(0, len(out), bs)])
    return score_rewards(reward_fn, imgs, [traj.prompts[i] for i in src], [traj.metadata[i] for i in src], weights)
