"""Shape primitives of the synthetic video benchmarks: colours, shape kinds, the background and crisp shape masks.

Shared by the temporal-grounding generators of the VLM front-end (:mod:`mmgrpo.vlm.synthetic.tvg`,
:mod:`mmgrpo.vlm.synthetic.grounding`) and the text-to-video benchmark (:mod:`mmgrpo.synthetic.t2v`). Pure numpy.
"""
from __future__ import annotations

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30),
    "green": (30, 200, 40),
    "blue": (40, 70, 235),
    "yellow": (240, 225, 30),
    "magenta": (220, 40, 220),
    "cyan": (40, 220, 225),
}
SHAPES = ("circle", "square", "triangle")
BACKGROUND = (70, 70, 70)


def _shape_mask(shape: str, size: int):
    import numpy as np

    yy, xx = np.mgrid[0:size, 0:size]
    c = (size - 1) / 2.0
    if shape == "circle":
        return (yy - c) ** 2 + (xx - c) ** 2 <= (size / 2.0) ** 2
    if shape == "square":
        return np.ones((size, size), bool)
    if shape == "triangle":  # apex up: row y spans a width growing linearly
        half = (yy + 1) / size * (size / 2.0)
        return np.abs(xx - c) <= half
    raise ValueError(f"unknown shape {shape!r}")
