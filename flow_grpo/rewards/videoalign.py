"""``videoalign``: a VideoAlign / VideoReward-style video reward with per-dimension weights.

VideoReward (KwaiVGI/VideoAlign) scores a generated video on three dimensions:

* ``VQ`` visual quality (clarity, aesthetics, single-frame reasonableness),
* ``MQ`` motion quality (stability, naturalness, amplitude),
* ``TA`` text alignment (subject, motion, environment, style, camera relevance to the prompt).

The release's model is Qwen2-VL with a linear head (``hidden -> 3``) read at three special tokens
``<|VQ_reward|>``, ``<|MQ_reward|>``, ``<|TA_reward|>`` placed in its prompt; its inference returns, per video,
a dict ``{"VQ": v, "MQ": m, "TA": t, "Overall": v + m + t}`` where each dimension is first normalised with the
checkpoint's ``inference_config`` (``(x - <D>_mean) / <D>_std``; raw values when there is none).  This reward
reads that output format and weights the dimensions::

    r = sum_D w_D * s_D            (defaults w = 1, 1, 1: the release's "Overall")

with ``s_D`` the normalised per-dimension score.  The per-dimension scores are logged as ``<name>/vq``,
``<name>/mq``, ``<name>/ta`` and the release's unweighted ``<name>/overall``.  An entry that lacks a dimension or
carries a non-finite one (or a malformed list) is a counted failure (``<name>/failed = 1``, ``valid = False``,
the score 0), never a crash; ``reward.stats`` keeps running totals.

Where the scores come from (``scorer=``): any callable ``scorer(videos, prompts, fps) -> list of dicts`` in the
release's format, given uint8 videos (B, F, H, W, 3), the prompts and each video's frame rate -- e.g. a
wrapper that writes each video to a file and calls the release's ``VideoVLMRewardInference.reward(paths,
prompts, use_norm=False)`` (then pass ``norm=`` the checkpoint's ``inference_config`` here, or ``use_norm=True``
there and leave ``norm`` unset), or an HTTP client of a server running it in its own environment.  Running the
released checkpoint in process (Qwen2-VL + merged LoRA + the ``rm_head``) is not implemented here.

    build_reward("videoalign", scorer=my_scorer, weights={"VQ": 0.5, "MQ": 1.0, "TA": 1.0},
                 norm={"VQ_mean": ..., "VQ_std": ..., "MQ_mean": ..., ...})
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .base import NanPolicy, Reward

__all__ = ["VideoAlignReward", "read_videoalign_output", "VIDEOALIGN_DIMS"]

VIDEOALIGN_DIMS = ("VQ", "MQ", "TA")


def read_videoalign_output(rewards: Any, n: int, norm: Mapping[str, float] | None = None
                           ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The release's per-video dicts -> (``{D: (n,) scores}``, ``(n,)`` failed mask); never raises on content.

    ``norm``: the release's ``inference_config`` (``<D>_mean``, ``<D>_std``) applied as ``(x - mean) / std``;
    None: the values are taken as they are (already normalised, or raw).  A malformed list (not a sequence of
    ``n`` entries) fails every sample; an entry that is not a mapping or lacks a finite number for a dimension
    fails that sample (its scores are NaN).
    """
    scores = {d: np.full(n, np.nan) for d in VIDEOALIGN_DIMS}
    failed = np.ones(n, dtype=bool)
    if not isinstance(rewards, Sequence) or isinstance(rewards, (str, bytes)) or len(rewards) != n:
        return scores, failed
    for i, entry in enumerate(rewards):
        if not isinstance(entry, Mapping):
            continue
        vals = {}
        for d in VIDEOALIGN_DIMS:
            v = entry.get(d)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
                break
            v = float(v)
            if not math.isfinite(v):
                break
            if norm is not None:
                v = (v - float(norm[f"{d}_mean"])) / float(norm[f"{d}_std"])
            vals[d] = v
        else:
            for d in VIDEOALIGN_DIMS:
                scores[d][i] = vals[d]
            failed[i] = False
    return scores, failed


class VideoAlignReward(Reward):
    """VideoReward per-dimension scores as a weighted reward (module docstring).

    Args:
        scorer: ``scorer(videos uint8 (B, F, H, W, 3), prompts, fps list) -> list of B dicts`` with ``VQ`` /
            ``MQ`` / ``TA`` (the release's output format; an ``Overall`` key is ignored and recomputed).
        weights: ``{VQ, MQ, TA: w}`` (missing ones keep 1; 0 drops a dimension).
        norm: the checkpoint's ``inference_config`` (``VQ_mean``, ``VQ_std``, ...), or None.
        fps: frame rate of the given videos (``metadata[i]["fps"]`` overrides it per sample).
        name (default ``"videoalign"``), nan_policy.
    """

    accepts_video = True
    video_only = True
    name = "videoalign"

    def __init__(self, scorer: Callable[..., Any] | None = None, *, weights: Mapping[str, float] | None = None,
                 norm: Mapping[str, float] | None = None, fps: float = 8.0, name: str | None = None,
                 nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        if scorer is None or not callable(scorer):
            raise ValueError("videoalign: pass scorer= a callable (videos, prompts, fps) -> list of "
                             "{'VQ', 'MQ', 'TA'} dicts (the VideoAlign release's output; module docstring)")
        w = {d: 1.0 for d in VIDEOALIGN_DIMS}
        if weights is not None:
            unknown = set(weights) - set(VIDEOALIGN_DIMS)
            if unknown:
                raise ValueError(f"videoalign: weights for unknown dimensions {sorted(unknown)}; the dimensions "
                                 f"are {list(VIDEOALIGN_DIMS)}")
            w.update({k: float(v) for k, v in weights.items()})
        if not all(math.isfinite(v) for v in w.values()):
            raise ValueError(f"videoalign: weights must be finite, got {w}")
        if norm is not None:
            need = [f"{d}_{s}" for d in VIDEOALIGN_DIMS for s in ("mean", "std")]
            missing = [k for k in need if k not in norm]
            if missing or any(float(norm[f"{d}_std"]) <= 0 for d in VIDEOALIGN_DIMS if f"{d}_std" in norm):
                raise ValueError(f"videoalign: norm needs {need} with std > 0 (missing {missing})")
        if not fps > 0:
            raise ValueError(f"videoalign: fps must be > 0, got {fps}")
        self.scorer, self.weights, self.norm, self.fps = scorer, w, norm, float(fps)
        self.stats: Counter = Counter()

    def score(self, videos, prompts, metadata, **kwargs: Any):
        n = videos.shape[0]
        fps = [float(m.get("fps", self.fps)) for m in metadata]
        try:
            raw = self.scorer(videos, list(prompts), fps)
        except Exception as e:  # noqa: BLE001 - a scorer crash is the caller's (ResilientReward retries it)
            raise RuntimeError(f"reward {self.name!r}: the scorer raised {type(e).__name__}: {e}") from e
        scores, failed = read_videoalign_output(raw, n, self.norm)
        self.stats["judged"] += n
        self.stats["failed"] += int(failed.sum())
        ok = ~failed
        total = np.zeros(n)
        overall = np.zeros(n)
        for d in VIDEOALIGN_DIMS:
            s = np.where(ok, scores[d], 0.0)
            total += self.weights[d] * s
            overall += s
        out = {self.name: total, f"{self.name}/overall": overall, f"{self.name}/failed": failed.astype(float),
               "valid": ok}
        out.update({f"{self.name}/{d.lower()}": np.where(ok, scores[d], 0.0) for d in VIDEOALIGN_DIMS})
        return out
