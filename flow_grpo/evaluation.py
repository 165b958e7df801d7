"""Evaluation, sample grids and reward curves of the flow recipe (functions of
:class:`flow_grpo.train.trainer.FlowGRPOTrainer`)."""
from __future__ import annotations

import contextlib
import time

import torch

from mmgrpo.engine.dist import gather_rows
from mmgrpo.engine.errors import RewardCallFailed

from .distributed import sync_failure
from .sampler import generate_images
from .scoring import finish_scores


def eval_due(run, final: bool) -> bool:
    if not run.eval_prompts:
        return False
    every = run.cfg.run.eval_every
    return final or bool(every and run.state.epoch % every == 0)


@torch.no_grad()
def evaluate(run) -> dict:
    """Deterministic ODE images for the eval prompts (seed of prompt i = sample_seed(seed, 5, i), fixed for the
    whole run), EMA weights swapped in if EMA is on; reward mean per component over all processes; PNG grid.
    Prompts are split evenly over processes (the last prompt repeats as padding so every process makes the same
    number of model calls, which sharded backends need)."""
    from mmgrpo.utils.seeding import sample_seed

    c = run.cfg
    n = len(run.eval_prompts)
    per = -(-n // run.world)
    idx = list(range(run.rank * per, (run.rank + 1) * per))
    real = torch.tensor([i < n for i in idx])
    idx = [min(i, n - 1) for i in idx]
    prompts = [run.eval_prompts[i] for i in idx]
    meta = [dict(run.eval_metadata[i]) for i in idx]
    seeds = [sample_seed(c.run.seed, 5, i) for i in idx]
    t0 = time.perf_counter()
    run.model.eval()
    with run.ema.swapped_in() if run.ema is not None else contextlib.nullcontext():
        imgs = generate_images(run.adapter, prompts, seeds, c.sample, num_steps=c.sample.eval_num_steps or None)
    err, scores = None, None
    try:
        scores = run.rewards.pointwise(imgs, prompts, meta)
    except RewardCallFailed as exc:
        err = exc
    sync_failure(err)
    run.rewards.take_counters()  # eval calls are not training statistics
    total, comps = finish_scores(scores, len(prompts))
    names = list(run.rewards.weights)
    cols = torch.stack([total] + [comps[k] for k in names], 1)
    (cols_all, v_all, r_all, imgs_all, idx_all), _ = gather_rows(
        [cols, comps["valid"], real, imgs, torch.tensor(idx)], run.device)
    keep = v_all & r_all
    out = {"eval/reward/total/mean": float(cols_all[keep, 0].mean()) if bool(keep.any()) else float("nan"),
           "eval/invalid": float((~v_all & r_all).sum()), "eval/num_prompts": float(n),
           "time/eval_s": time.perf_counter() - t0}
    for j, k in enumerate(names):
        out[f"eval/reward/{k}/mean"] = float(cols_all[keep, j + 1].mean()) if bool(keep.any()) else float("nan")
    if run.is_main:
        from .media import save_media_grid

        sel = torch.nonzero(r_all).flatten()
        caps = [f"{run.eval_prompts[int(idx_all[i])]} r={float(cols_all[i, 0]):.3f}" for i in sel.tolist()]
        grid = save_media_grid(imgs_all[sel], run.out / "samples" / f"eval_epoch_{run.state.epoch:05d}.png",
                               nrow=min(8, len(sel)), captions=caps, min_tile=128)
        if run.logger is not None and c.run.tensorboard:
            import numpy as np
            from PIL import Image

            run.logger.log_image("eval/samples", np.asarray(Image.open(grid).convert("RGB")), run.state.global_step)
    return out


def save_train_grid(run) -> None:
    """PNG grid of the last epoch's rollouts (``run.image_grid_every``), one row per group, rewards as captions."""
    from .media import save_media_grid

    every = run.cfg.run.image_grid_every
    if not (every and run.state.epoch % every == 0):
        return
    t = run.state.last_traj
    save_media_grid(t.images, run.out / "samples" / f"epoch_{run.state.epoch:05d}.png",
                    nrow=run.cfg.data.group_size, min_tile=128,
                    captions=[f"{p} r={r:.3f}" for p, r in zip(t.prompts, t.rewards["total"].tolist())])


def reward_curves(run) -> None:
    """The train / eval reward curves of ``metrics.jsonl`` to ``reward_curves.png``."""
    from mmgrpo.utils.logging import plot_curves, read_jsonl

    path = run.out / "metrics.jsonl"
    if not path.is_file():
        return
    present = set()
    for row in read_jsonl(path):
        present |= set(row)
    comps = list(run.rewards.weights) if len(run.rewards.weights) > 1 else []  # one reward = the mean
    keys = [k for k in ["reward/total/mean", "eval/reward/total/mean"] + [f"reward/{k}/mean" for k in comps] +
            [f"eval/reward/{k}/mean" for k in comps] if k in present]
    keys = list(dict.fromkeys(keys))
    if keys:
        plot_curves(path, keys, run.out / "reward_curves.png", title="rewards")

