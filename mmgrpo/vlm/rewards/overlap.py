"""Rewards computed while the rollout still generates (``reward.overlap_prompts`` > 0).

The rollout generates the step's prompts in chunks of ``reward.overlap_prompts`` prompts; each chunk's rows are
handed to :meth:`RewardOverlap.submit`, which scores them in one background thread (the same
:meth:`mmgrpo.vlm.rewards.scoring.RewardScorer.score` call, with its retries / timeout / drop policy) while the next
chunk generates.
:meth:`RewardOverlap.collect` waits for the chunks and returns the rewards of the final rows in their order; rows a
method added after the rollout (``after_rollout``: e.g. TempSamp-R1's ground-truth member) are scored then, in one
synchronous call. The rewards are the ones the synchronous path computes (a reward is a function of the completion
and its sample; a chunk's rows are sampled with the same per-row seeds), only the wall time differs: the reward
calls of chunk i overlap the generation of chunk i+1 (a slow judge or remote reward hides behind generation).

Threading: one worker, chunks scored in order; the reward function must tolerate running beside generation (a
judge on the same GPU competes with it for the device).
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

__all__ = ["RewardOverlap", "merge_scores"]


def merge_scores(parts: list[dict[str, torch.Tensor]], index: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Rows ``index[i] = (part, row)`` of the scored ``parts``, as one dict of (N,) tensors. A key some part lacks
    (a failed call returns only ``total``) is NaN (float) / False (bool) there."""
    keys = list(dict.fromkeys(k for p in parts for k in p))
    out = {}
    for k in keys:
        dtype = next(p[k].dtype for p in parts if k in p)
        fill = False if dtype == torch.bool else float("nan")
        out[k] = torch.tensor([p[k][r].item() if k in p else fill for p, r in ((parts[j], r) for j, r in index)],
                              dtype=dtype)
    return out


class RewardOverlap:
    """Background scoring of the rollout's chunks: ``score_fn(texts, samples) -> dict[str, (n,) tensor]``."""

    def __init__(self, score_fn: Callable[[list[str], list[Any]], dict]):
        self.score_fn = score_fn
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmgrpo-reward-overlap")
        self.jobs: list[tuple[list[dict], Future]] = []
        self.spans: list[tuple[float, float]] = []  # (start, end) wall time of each background call

    def _timed(self, texts: list[str], samples: list[Any]) -> dict:
        t0 = time.perf_counter()
        try:
            return self.score_fn(texts, samples)
        finally:
            self.spans.append((t0, time.perf_counter()))

    def submit(self, rows: list[dict]) -> None:
        """Start scoring ``rows`` (dicts with ``text`` and ``pp.reward_sample``) in the background."""
        if rows:
            self.jobs.append((rows, self.pool.submit(self._timed, [r["text"] for r in rows],
                                                     [r["pp"].reward_sample for r in rows])))

    def collect(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        """The rewards of ``rows`` (in order): from the background calls, and one call for rows never submitted."""
        try:
            parts, where = [], {}
            for j, (sub, fut) in enumerate(self.jobs):
                parts.append(fut.result())  # re-raises what score() raised (never a reward failure: it drops)
                where.update({id(r): (j, i) for i, r in enumerate(sub)})
            new = [r for r in rows if id(r) not in where]
            if new:
                parts.append(self.score_fn([r["text"] for r in new], [r["pp"].reward_sample for r in new]))
                where.update({id(r): (len(parts) - 1, i) for i, r in enumerate(new)})
            return merge_scores(parts, [where[id(r)] for r in rows])
        finally:
            self.pool.shutdown(wait=True)
