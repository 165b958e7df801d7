"""Evaluation, sample grids and reward curves of a flow model: functions of explicit arguments (the adapter, the
rewards, prompts, settings), called by the recipe (:class:`flow_grpo.train.trainer.FlowGRPOTrainer`)."""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch

from mmgrpo.engine.dist import gather_rows
from mmgrpo.engine.errors import RewardCallFailed

from .distributed import sync_failure
from .sampler import generate_images
from .scoring import finish_scores

if TYPE_CHECKING:
    from .config import SamplingConfig
    from .ema import EMA
    from .models.base import FlowModelAdapter
    from .sampler import Trajectories
    from .scoring import RewardStack

__all__ = ["evaluate", "save_train_grid", "reward_curves"]


@torch.no_grad()
def evaluate(adapter: FlowModelAdapter, rewards: RewardStack, prompts: list[str], metadata: list[dict],
             sample: SamplingConfig, seed: int, *, ema: Optional[EMA] = None, rank: int = 0, world: int = 1,
             device="cpu", grid: Optional[Path] = None, logger=None, step: int = 0) -> dict:
    """Deterministic ODE images for the eval ``prompts`` (seed of prompt i = sample_seed(seed, 5, i), fixed for the
    whole run; ``sample.eval_num_steps`` steps), ``ema``'s weights swapped in if given; reward mean per component over
    all processes. Prompts are split evenly over the ``world`` processes (the last prompt repeats as padding so every
    process makes the same number of model calls, which sharded backends need). ``grid``: write the PNG grid there
    (the main process); ``logger``: also log it as the image ``eval/samples`` at ``step`` (TensorBoard)."""
    from mmgrpo.utils.seeding import sample_seed

    n = len(prompts)
    per = -(-n // world)
    idx = list(range(rank * per, (rank + 1) * per))
    real = torch.tensor([i < n for i in idx])
    idx = [min(i, n - 1) for i in idx]
    batch = [prompts[i] for i in idx]
    meta = [dict(metadata[i]) for i in idx]
    seeds = [sample_seed(seed, 5, i) for i in idx]
    t0 = time.perf_counter()
    adapter.model.eval()
    with ema.swapped_in() if ema is not None else contextlib.nullcontext():
        imgs = generate_images(adapter, batch, seeds, sample, num_steps=sample.eval_num_steps or None)
    err, scores = None, None
    try:
        scores = rewards.pointwise(imgs, batch, meta)
    except RewardCallFailed as exc:
        err = exc
    sync_failure(err)
    rewards.take_counters()  # eval calls are not training statistics
    total, comps = finish_scores(scores, len(batch))
    names = list(rewards.weights)
    cols = torch.stack([total] + [comps[k] for k in names], 1)
    (cols_all, v_all, r_all, imgs_all, idx_all), _ = gather_rows(
        [cols, comps["valid"], real, imgs, torch.tensor(idx)], device)
    keep = v_all & r_all
    out = {"eval/reward/total/mean": float(cols_all[keep, 0].mean()) if bool(keep.any()) else float("nan"),
           "eval/invalid": float((~v_all & r_all).sum()), "eval/num_prompts": float(n),
           "time/eval_s": time.perf_counter() - t0}
    for j, k in enumerate(names):
        out[f"eval/reward/{k}/mean"] = float(cols_all[keep, j + 1].mean()) if bool(keep.any()) else float("nan")
    if grid is not None:
        from .media import save_media_grid

        sel = torch.nonzero(r_all).flatten()
        caps = [f"{prompts[int(idx_all[i])]} r={float(cols_all[i, 0]):.3f}" for i in sel.tolist()]
        path = save_media_grid(imgs_all[sel], grid, nrow=min(8, len(sel)), captions=caps, min_tile=128)
        if logger is not None:
            import numpy as np
            from PIL import Image

            logger.log_image("eval/samples", np.asarray(Image.open(path).convert("RGB")), step)
    return out


def save_train_grid(traj: Trajectories, path: Path, group_size: int) -> None:
    """PNG grid of a rollout's images, one row per group, rewards as captions."""
    from .media import save_media_grid

    save_media_grid(traj.images, path, nrow=group_size, min_tile=128,
                    captions=[f"{p} r={r:.3f}" for p, r in zip(traj.prompts, traj.rewards["total"].tolist())])


def reward_curves(out: Path, reward_names: list[str]) -> None:
    """The train / eval reward curves of ``<out>/metrics.jsonl`` to ``<out>/reward_curves.png`` (per component too
    when there are several ``reward_names``)."""
    from mmgrpo.utils.logging import plot_curves, read_jsonl

    path = out / "metrics.jsonl"
    if not path.is_file():
        return
    present = set()
    for row in read_jsonl(path):
        present |= set(row)
    comps = list(reward_names) if len(reward_names) > 1 else []  # one reward = the mean
    keys = [k for k in ["reward/total/mean", "eval/reward/total/mean"] + [f"reward/{k}/mean" for k in comps] +
            [f"eval/reward/{k}/mean" for k in comps] if k in present]
    keys = list(dict.fromkeys(keys))
    if keys:
        plot_curves(path, keys, out / "reward_curves.png", title="rewards")
