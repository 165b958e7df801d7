"""JPEG (in)compressibility rewards, as in DDPO.

``size_kB(x) = len(JPEG(x, quality)) / 1000``;  compressibility ``r = -size_kB / scale``;
incompressibility ``r = +size_kB / scale``.  Encoding is PIL's baseline JPEG at ``quality`` (DDPO uses 95).
"""
from __future__ import annotations

import io
from typing import Any

import numpy as np

from .base import NanPolicy, Reward

__all__ = ["jpeg_size_kb", "JpegCompressibility", "JpegIncompressibility"]


def jpeg_size_kb(images: np.ndarray, quality: int = 95) -> np.ndarray:
    """(N,) float64 JPEG sizes in kB (1 kB = 1000 bytes) of uint8 (N, H, W, 3) images."""
    from PIL import Image

    sizes = np.empty(images.shape[0], dtype=np.float64)
    for i, img in enumerate(images):
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=quality)
        sizes[i] = buf.tell() / 1000.0
    return sizes


class JpegCompressibility(Reward):
    """``r = -size_kB / scale`` (smaller files are better)."""

    name = "jpeg_compressibility"
    sign = -1.0

    def __init__(self, quality: int = 95, scale: float = 1.0, name: str | None = None,
                 nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        if not 1 <= int(quality) <= 100:
            raise ValueError(f"quality must be in [1, 100], got {quality}")
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.quality = int(quality)
        self.scale = float(scale)

    def score(self, images: np.ndarray, prompts: list[str], metadata: list[Any], **kwargs: Any):
        return self.sign * jpeg_size_kb(images, self.quality) / self.scale


class JpegIncompressibility(JpegCompressibility):
    """``r = +size_kB / scale`` (larger files are better)."""

    name = "jpeg_incompressibility"
    sign = 1.0
