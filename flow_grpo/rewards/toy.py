"""CPU-only toy rewards for tests and smoke runs (no model, exact formulas).

* ``brightness``:   ``r = mean(x) / 255`` over all pixels and channels, in [0, 1].
* ``color_target``: ``r = 1 - mean_p ||x_p - c||_2 / (255 * sqrt(3))`` for a target RGB colour ``c``, in [0, 1].
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import NanPolicy, Reward

__all__ = ["Brightness", "ColorTarget"]


class Brightness(Reward):
    name = "brightness"

    def score(self, images: np.ndarray, prompts, metadata, **kwargs: Any):
        return images.reshape(images.shape[0], -1).astype(np.float64).mean(axis=1) / 255.0


class ColorTarget(Reward):
    name = "color_target"

    def __init__(self, color: Sequence[int] = (255, 0, 0), name: str | None = None, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        c = np.asarray(color, dtype=np.float64).reshape(-1)
        if c.shape != (3,) or (c < 0).any() or (c > 255).any():
            raise ValueError(f"color must be 3 values in [0, 255], got {color!r}")
        self.color = c

    def score(self, images: np.ndarray, prompts, metadata, **kwargs: Any):
        d = np.linalg.norm(images.astype(np.float64) - self.color, axis=-1)  # (N, H, W)
        return 1.0 - d.reshape(d.shape[0], -1).mean(axis=1) / (255.0 * math.sqrt(3.0))
