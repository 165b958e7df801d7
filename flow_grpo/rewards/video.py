"""Video rewards: image rewards applied per frame and aggregated over time, and a temporal-consistency reward.

Contract: as :mod:`flow_grpo.rewards.base`, with ``images`` a uint8 video batch (B, F, H, W, 3) (what a video
adapter's ``decode`` returns, see :mod:`flow_grpo.media`) instead of (B, H, W, 3); outputs are (B,) per video.

* ``video_per_frame`` (:class:`PerFrameReward`): any image reward run on frames and aggregated over time,
  ``r_i = agg_f r_img(frame_{i,f}, prompt_i, metadata_i)`` over the frames ``f = 0, s, 2s, ...`` (``frame_stride``
  ``s``; the last frame is always included) with

  - ``aggregate="mean"``: the average frame score (every frame counts equally; a bad frame costs 1/F of it);
  - ``aggregate="min"``: the worst frame's score (strict: the video is as good as its worst frame, so a single
    broken or off-prompt frame is not averaged away; noisier, since one frame decides).

  Every output key of the image reward is aggregated the same way and keeps its name (``clip_score`` stays
  ``clip_score``, so reward weights written for the image reward apply unchanged); a per-frame ``valid`` becomes
  "all scored frames valid". The image reward sees each frame with its video's prompt and metadata.
* ``temporal_consistency`` (:class:`TemporalConsistency`): ``r = 1 - mean_{f=1..F-1} d_f`` with
  ``d_f = mean_{pixels, channels} |x_f - x_{f-1}| / 255`` in [0, 1] (1 = every frame equal to the previous one); aux
  ``temporal_consistency/max_step`` = ``max_f d_f`` (the largest jump, e.g. a flicker or a cut). A one-frame video
  scores 1. It rewards static videos too: use it as a small-weight regulariser next to a content or motion reward,
  never alone.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Union

import numpy as np

from .base import NanPolicy, Reward, RewardFn, build_reward, check_shapes

__all__ = ["VideoReward", "PerFrameReward", "TemporalConsistency"]

AGGREGATES = ("mean", "min")


class VideoReward(Reward):
    """Base class of rewards over videos: ``score(videos (B, F, H, W, 3) uint8, prompts, metadata)``."""

    accepts_video = True
    video_only = True  # Reward.evaluate converts with flow_grpo.media.to_uint8_videos


class PerFrameReward(VideoReward):
    """An image reward on the frames of each video, aggregated over time (module docstring).

    Args:
        reward: a registered image reward name (built with ``reward_kwargs``) or a ready reward callable.
        aggregate: ``"mean"`` or ``"min"`` over the scored frames.
        frame_stride: score frames ``0, s, 2s, ...`` and the last one (1 = every frame).
        name: the main output key; default the image reward's name.
    """

    def __init__(self, reward: Union[str, RewardFn] = "brightness", aggregate: Literal["mean", "min"] = "mean",
                 frame_stride: int = 1, name: str | None = None, nan_policy: NanPolicy = "raise",
                 reward_kwargs: Mapping[str, Any] | None = None):
        if aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
        if int(frame_stride) < 1:
            raise ValueError(f"frame_stride must be >= 1, got {frame_stride}")
        self.inner = build_reward(reward, **dict(reward_kwargs or {})) if isinstance(reward, str) else reward
        if getattr(self.inner, "accepts_video", False):
            raise ValueError(f"PerFrameReward: {reward!r} is already a video reward")
        super().__init__(name=name or getattr(self.inner, "name", None) or str(reward), nan_policy=nan_policy)
        self.aggregate = aggregate
        self.frame_stride = int(frame_stride)

    def frame_indices(self, num_frames: int) -> list[int]:
        idx = list(range(0, num_frames, self.frame_stride))
        return idx if idx[-1] == num_frames - 1 else idx + [num_frames - 1]

    def score(self, videos: np.ndarray, prompts: list[str], metadata: list[Mapping[str, Any]], **kwargs: Any):
        b = videos.shape[0]
        idx = self.frame_indices(videos.shape[1])
        f = len(idx)
        frames = np.ascontiguousarray(videos[:, idx].reshape(b * f, *videos.shape[2:]))
        # sample-major: the f frames of video i take rows i*f .. i*f+f-1, with video i's prompt and metadata
        rep_prompts = [p for p in prompts for _ in range(f)]
        rep_md = [m for m in metadata for _ in range(f)]
        raw = self.inner(frames, rep_prompts, rep_md, **kwargs)
        check_shapes(raw, b * f, self.name)
        agg = np.mean if self.aggregate == "mean" else np.min
        out: dict[str, Any] = {}
        for key, value in raw.items():
            v = np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value)
            if key == "valid":
                out["valid"] = v.reshape(b, f).astype(bool).all(axis=1)
            else:
                out[key] = agg(v.astype(np.float64).reshape(b, f), axis=1)
        if self.name not in out:
            raise ValueError(f"PerFrameReward: the image reward returned keys {sorted(out)} without {self.name!r} "
                             "(pass name= the key to optimise)")
        return out


class TemporalConsistency(VideoReward):
    """``1 - mean_f mean|x_f - x_{f-1}| / 255`` (module docstring)."""

    name = "temporal_consistency"

    def score(self, videos: np.ndarray, prompts, metadata, **kwargs: Any):
        b, f = videos.shape[:2]
        if f < 2:
            return {self.name: np.ones(b), f"{self.name}/max_step": np.zeros(b)}
        x = videos.astype(np.float64)
        d = np.abs(x[:, 1:] - x[:, :-1]).reshape(b, f - 1, -1).mean(axis=2) / 255.0  # (B, F-1)
        return {self.name: 1.0 - d.mean(axis=1), f"{self.name}/max_step": d.max(axis=1)}
