"""Write small mp4 files with PyAV (tests, synthetic benchmarks)."""
from __future__ import annotations

import os
from fractions import Fraction
from typing import Iterable


def write_video(path: str | os.PathLike, frames: Iterable, fps: float, codec: str = "libx264", crf: int = 12,
                pix_fmt: str = "yuv420p", threads: int = 1) -> str:
    """Encode RGB uint8 frames (each H x W x 3; H and W even for yuv420p) at a constant ``fps``.

    ``fps`` may be fractional (stored as an exact Fraction when possible).  yuv420p input is converted from RGB
    here with BT.601 limited-range coefficients (what decoders assume for untagged SD video).  A low ``crf`` keeps flat colours
    within a few grey levels of the input, which the synthetic benchmark's ground truth relies on.  One encoder
    thread by default: multi-threaded x264 output is not byte-reproducible.
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
            s.options = {"crf": str(crf), "preset": "veryfast", "threads": str(threads)}
        else:
            s.thread_count = threads
        k = 0
        for fr in _chain(first, it):
            fr = np.asarray(fr, dtype=np.uint8)
            if fr.shape != first.shape:
                raise ValueError(f"{path}: frame {k} has shape {fr.shape}, frame 0 has {first.shape}")
            if pix_fmt == "yuv420p" and h % 2 == 0 and w % 2 == 0:
                vf = av.VideoFrame.from_ndarray(rgb_to_yuv420p(fr), format="yuv420p")
            else:
                vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(fr), format="rgb24")
            for p in s.encode(vf):
                c.mux(p)
            k += 1
        for p in s.encode():
            c.mux(p)
    return path


def rgb_to_yuv420p(rgb):
    """(H, W, 3) uint8 RGB -> (3H/2, W) uint8 planar Y, U, V (BT.601 limited range, 2x2 chroma average).

    Done here rather than by PyAV's swscale path, whose cached conversion context changes after the process has
    decoded frames to RGB, making the same input encode to different bytes (seen with PyAV 18)."""
    import numpy as np

    x = rgb.astype(np.float64)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    y = 16.0 + (65.481 * r + 128.553 * g + 24.966 * b) / 255.0
    cb = 128.0 + (-37.797 * r - 74.203 * g + 112.0 * b) / 255.0
    cr = 128.0 + (112.0 * r - 93.786 * g - 18.214 * b) / 255.0
    h, w = y.shape

    def sub(c):
        return c.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))

    planes = [y.ravel(), sub(cb).ravel(), sub(cr).ravel()]
    out = np.clip(np.rint(np.concatenate(planes)), 0, 255).astype(np.uint8)
    return out.reshape(h * 3 // 2, w)


def _chain(first, rest):
    yield first
    yield from rest
