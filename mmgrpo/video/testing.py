"""Test helpers: videos whose frames carry their own index, so decoded frame indices can be checked independently.

Frame i shows the bits of i as an ``bits``-cell row of black/white blocks (cell = w // bits pixels wide, full
height), least significant bit on the left.  Blocks survive H.264 and bicubic resizing; :func:`decode_frame_index`
reads them back by thresholding each cell's centre.
"""
from __future__ import annotations

import os


def index_frame(i: int, height: int = 48, width: int = 64, bits: int = 8):
    """uint8 (H, W, 3) frame encoding ``i`` (0 <= i < 2**bits)."""
    import numpy as np

    if not 0 <= i < 2 ** bits:
        raise ValueError(f"index {i} does not fit in {bits} bits")
    cell = width // bits
    a = np.zeros((height, width, 3), np.uint8)
    for b in range(bits):
        if (i >> b) & 1:
            a[:, b * cell:(b + 1) * cell] = 255
    return a


def decode_frame_index(frame, bits: int = 8) -> int:
    """Inverse of :func:`index_frame` for an (H, W, 3) frame (any size: cells scale with the width)."""
    import numpy as np

    f = np.asarray(frame).astype(np.float32).mean(-1)
    h, w = f.shape
    cell = w / bits
    i = 0
    for b in range(bits):
        x0, x1 = int(b * cell + cell * 0.3), int(b * cell + cell * 0.7)
        if f[h // 4: 3 * h // 4, x0:max(x1, x0 + 1)].mean() > 127:
            i |= 1 << b
    return i


def write_index_video(path: str | os.PathLike, num_frames: int, fps: float, height: int = 48,
                      width: int = 64) -> str:
    """An mp4 of ``num_frames`` index-coded frames at ``fps`` (PyAV, libx264)."""
    from .writer import write_video

    bits = max(8, int(num_frames - 1).bit_length())
    return write_video(path, (index_frame(i, height, width, bits) for i in range(num_frames)), fps)
