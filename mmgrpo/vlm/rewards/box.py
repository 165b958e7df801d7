"""Box IoU and the coordinate frames of Qwen-VL model families (pure Python; no torch).

Boxes are ``[x1, y1, x2, y2]``; corners are ordered per axis before use. Ground-truth boxes are in **pixels of
the original image**, whose size is given as ``image_size = (W, H)`` (width first). A predicted box is first
converted from the frame the model writes in to that original frame:

========================  ============================================================================
frame (and aliases)       meaning of the numbers the model writes
========================  ============================================================================
``norm1000``              relative coordinates on a 0–1000 grid: x·W/1000, y·H/1000.
  ``qwen2_vl``            Qwen2-VL (``<|box_start|>(x1,y1),(x2,y2)<|box_end|>``, normalised to [0, 1000)).
  ``qwen3_vl``            Qwen3-VL: its README states the default changed back from Qwen2.5-VL's absolute
                          coordinates to relative 0–1000 ones (QwenLM/Qwen3-VL #1741, #1486).
``resized_abs``           absolute pixels of the *resized model-input image* (W_r, H_r): x·W/W_r, y·H/H_r.
  ``qwen2_5_vl``          Qwen2.5-VL (VLM-R1 REC reward; W_r = grid_w·14, H_r = grid_h·14 = smart_resize).
``abs``                   pixels of the original image (identity).
``norm1``                 relative coordinates in [0, 1]: x·W, y·H.
========================  ============================================================================

Every registered model family (``mmgrpo.vlm.models.adapters.ADAPTERS``) is an alias of the frame its adapter
declares (``box_frame``), so a family added there needs no line here.

Pixel convention: by default coordinates are **continuous** (``inclusive=False``): area = (x2−x1)(y2−y1), as in
torchvision/COCO -- and as in VLM-R1's REC reward and evaluation, whose IoU is the continuous one (intersection
min(x2)−max(x1) by min(y2)−max(y1), union from (x2−x1)(y2−y1)); its only difference is that an overlap at most
1 px wide or high counts as no overlap (IoU 0 here: a small positive number).  With ``inclusive=True`` x2, y2 are
*inclusive pixel indices* (the "+1" convention of the Pascal VOC devkit, not VLM-R1's): area = (x2−x1+1)(y2−y1+1),
so a box with x1 == x2 covers one pixel column.  Pick one and keep it fixed between training and evaluation; the
eval harness records it.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from mmgrpo.vlm.models.adapters import ADAPTERS  # no torch import

__all__ = [
    "BOX_FRAMES",
    "resolve_box_frame",
    "as_box",
    "box_to_original",
    "frame_scale",
    "clamp_box",
    "box_iou",
    "smart_resize",
]

FRAMES = ("norm1000", "resized_abs", "abs", "norm1")
# the frames and the family aliases registered at import time (choices of command lines); resolve_box_frame reads
# the registry itself
BOX_FRAMES: dict[str, str] = {**{f: f for f in FRAMES}, **{fam: a.box_frame for fam, a in ADAPTERS.items()}}


def resolve_box_frame(frame: str) -> str:
    """Canonical frame name for a frame or model-family alias; ValueError listing the choices otherwise."""
    if isinstance(frame, str) and frame in FRAMES:
        return frame
    if isinstance(frame, str) and frame in ADAPTERS:
        return ADAPTERS[frame].box_frame
    raise ValueError(f"unknown box frame {frame!r}; choose one of {sorted([*FRAMES, *ADAPTERS])}")


def as_box(x: Any) -> tuple[float, float, float, float]:
    """``(x1, y1, x2, y2)`` floats with corners ordered per axis; ValueError on non-finite/malformed input."""
    if all(hasattr(x, k) for k in ("x1", "y1", "x2", "y2")):
        vals = (x.x1, x.y1, x.x2, x.y2)
    else:
        try:
            vals = tuple(x)
        except TypeError:
            raise ValueError(f"a box must be [x1, y1, x2, y2], got {x!r}") from None
    if len(vals) != 4:
        raise ValueError(f"a box must have 4 numbers, got {x!r}")
    try:
        x1, y1, x2, y2 = (float(v) for v in vals)
    except (TypeError, ValueError):
        raise ValueError(f"box coordinates must be numbers, got {x!r}") from None
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
        raise ValueError(f"box has a non-finite coordinate: {x!r}")
    return min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)


def _size(size: Any, name: str) -> tuple[float, float]:
    try:
        w, h = (float(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be (W, H), got {size!r}") from None
    if not (math.isfinite(w) and math.isfinite(h) and w > 0 and h > 0):
        raise ValueError(f"{name} must be positive finite (W, H), got {size!r}")
    return w, h


def box_to_original(
    box: Any, frame: str, *, image_size: Sequence[float], resized_size: Optional[Sequence[float]] = None
) -> tuple[float, float, float, float]:
    """Convert a predicted box from ``frame`` to original-image pixels (see module table). ``resized_size``
    (W_r, H_r) is required for the ``resized_abs`` / ``qwen2_5_vl`` frame."""
    x1, y1, x2, y2 = as_box(box)
    sx, sy = frame_scale(frame, image_size=image_size, resized_size=resized_size)
    return x1 * sx, y1 * sy, x2 * sx, y2 * sy


def frame_scale(
    frame: str, *, image_size: Sequence[float], resized_size: Optional[Sequence[float]] = None
) -> tuple[float, float]:
    """(sx, sy) that map coordinates written in ``frame`` to original-image pixels (see the module table)."""
    kind = resolve_box_frame(frame)
    w, h = _size(image_size, "image_size")
    if kind == "abs":
        sx, sy = 1.0, 1.0
    elif kind == "norm1000":
        sx, sy = w / 1000.0, h / 1000.0
    elif kind == "norm1":
        sx, sy = w, h
    else:  # resized_abs
        if resized_size is None:
            raise ValueError(f"box frame {frame!r} needs resized_size (W_r, H_r) of the model-input image")
        wr, hr = _size(resized_size, "resized_size")
        sx, sy = w / wr, h / hr
    return sx, sy


def clamp_box(box: Any, image_size: Sequence[float], *, inclusive: bool = False) -> tuple[float, float, float, float]:
    """Order corners and clamp to the image: [0, W]×[0, H] (continuous) or [0, W−1]×[0, H−1] (inclusive)."""
    x1, y1, x2, y2 = as_box(box)
    w, h = _size(image_size, "image_size")
    xm, ym = (w - 1.0, h - 1.0) if inclusive else (w, h)
    xm, ym = max(xm, 0.0), max(ym, 0.0)
    return (min(max(x1, 0.0), xm), min(max(y1, 0.0), ym), min(max(x2, 0.0), xm), min(max(y2, 0.0), ym))


def box_iou(a: Any, b: Any, *, inclusive: bool = False) -> float:
    """IoU of two boxes in the same frame, in [0, 1]; a zero union gives 0.

    continuous (default; VLM-R1's REC IoU): area = (x2−x1)(y2−y1); inclusive: area = (x2−x1+1)(y2−y1+1), the
    pixel-index convention (see the module docstring).
    """
    ax1, ay1, ax2, ay2 = as_box(a)
    bx1, by1, bx2, by2 = as_box(b)
    k = 1.0 if inclusive else 0.0
    iw = min(ax2, bx2) - max(ax1, bx1) + k
    ih = min(ay2, by2) - max(ay1, by1) + k
    if iw <= 0.0 or ih <= 0.0:
        return 0.0
    inter = iw * ih
    area_a = (ax2 - ax1 + k) * (ay2 - ay1 + k)
    area_b = (bx2 - bx1 + k) * (by2 - by1 + k)
    union = area_a + area_b - inter
    if union <= 0.0:
        return 0.0
    return max(0.0, min(1.0, inter / union))


def smart_resize(
    height: int,
    width: int,
    *,
    factor: int = 28,
    min_pixels: Optional[int] = None,
    max_pixels: Optional[int] = None,
    max_ratio: float = 200.0,
) -> tuple[int, int]:
    """(H_r, W_r) of the model-input image, as qwen-vl-utils computes it (a local copy so that scoring needs
    neither torch nor qwen-vl-utils). ``factor`` = patch size · spatial merge = 28 for Qwen2/2.5-VL, 32 for
    Qwen3-VL. Defaults: min_pixels = 4·factor², max_pixels = 16384·factor² (qwen-vl-utils image defaults).

    Both sides are rounded to multiples of ``factor``; if the area leaves [min_pixels, max_pixels] the image is
    rescaled by β = sqrt(area ratio) with floor (too big) or ceil (too small) to the factor grid.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got H={height}, W={width}")
    max_pixels = max_pixels if max_pixels is not None else 16384 * factor * factor
    min_pixels = min_pixels if min_pixels is not None else 4 * factor * factor
    if max_pixels < min_pixels:
        raise ValueError(f"max_pixels ({max_pixels}) must be >= min_pixels ({min_pixels})")
    if max(height, width) / min(height, width) > max_ratio:
        raise ValueError(f"aspect ratio must be at most {max_ratio}, got {max(height, width) / min(height, width)}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
