"""Write small mp4 files with PyAV (tests, synthetic benchmarks)."""
from __future__ import annotations

import os
from fractions import Fraction
from typing import Iterable


def write_video(path: str | os.PathLike, frames: Iterable, fps: float, codec: str = "libx264", crf: int = 12,
                pix_fmt: str = "yuv420p") -> str:
    """Encode RGB uint8 frames (each H x W x 3; H and W even for yuv420p) at a constant ``fps``.

    ``fps`` may be fractional (stored as an exact Fraction when possible).  A low ``crf`` keeps flat colours
    within a few grey levels of the input, which the synthetic benchmark's ground truth relies on.
    Returns the path.  Raises ValueError for no frames or mismatched sizes.
    """
    import av
    import numpy as np

    path = os.fspath(path)
    rate = Fraction(fps).limit_denominator(1001)
    it = iter(frames)
    try:
        first = np.asarray(next(it))
    except StopIteration:
        raise ValueError(f"{path}: no frames to write") from None
    if first.ndim != 3 or first.shape[2] != 3:
        raise ValueError(f"{path}: frames must be (H, W, 3), got {first.shape}")
    h, w = first.shape[:2]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with av.open(path, "w") as c:
        s = c.add_stream(codec, rate=rate)
        s.width, s.height, s.pix_fmt = w, h, pix_fmt
        if codec == "libx264":
            s.options = {"crf": str(crf), "preset": "veryfast"}
        k = 0
        for fr in _chain(first, it):
            fr = np.asarray(fr, dtype=np.uint8)
            if fr.shape != first.shape:
                raise ValueError(f"{path}: frame {k} has shape {fr.shape}, frame 0 has {first.shape}")
            for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(fr), format="rgb24")):
                c.mux(p)
            k += 1
        for p in s.encode():
            c.mux(p)
    return path


def _chain(first, rest):
    yield first
    yield from rest
