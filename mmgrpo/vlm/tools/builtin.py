"""Built-in tools: ``crop`` / ``zoom`` (images) and ``seek`` (videos). Each is a pure function of the sample and
its arguments (:mod:`mmgrpo.vlm.tools.base`, whose ``BUILTIN_TOOLS`` names them).

* ``crop {"bbox_2d": [x1, y1, x2, y2], "image": 0}``: the box is in the model's box frame
  (:mod:`mmgrpo.vlm.rewards.box`: Qwen2.5-VL absolute pixels of the resized model-input image, Qwen2-VL / Qwen3-VL
  0-1000), converted to pixels of the full-resolution source, cropped from the source (not from the downsized
  view) and resized to ``tools.crop_pixels`` (default: the first view's area) with sides on the patch grid.
* ``zoom {"point_2d": [x, y], "factor": 2, "image": 0}``: the same, for a box of 1/factor of the image's width
  and height centred at the point (shifted inside the image); ``bbox_2d`` may be given instead of a point.
* ``seek {"start": s, "end": e}``: seconds of the source video (absolute time); the window is sampled again at
  ``tools.seek_fps`` (at most ``tools.seek_max_frames`` frames) with :func:`mmgrpo.video.load_video`, so the frames
  carry their indices, timestamps and sample fps (the video contract); the text lists the timestamps, since
  Qwen2.5-VL's MRoPE time axis of a second video starts at its own first frame.
"""
from __future__ import annotations

import math
from typing import Any

from mmgrpo.vlm.rewards.box import as_box, frame_scale
from mmgrpo.vlm.tools.base import ToolContext, ToolError, ToolResult

__all__ = ["crop", "zoom", "seek", "source_box", "crop_size"]


def _number_list(args: dict, key: str, n: int) -> list[float]:
    v = args.get(key)
    if not isinstance(v, (list, tuple)) or len(v) != n:
        raise ToolError(f"{key!r} must be a list of {n} numbers, got {v!r}")
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ToolError(f"{key!r} must hold finite numbers, got {v!r}")
        out.append(float(x))
    return out


def _image(ctx: ToolContext, args: dict):
    k = args.get("image", 0)
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(ctx.images):
        raise ToolError(f"'image' must be an index in [0, {len(ctx.images)}), got {k!r}"
                        if ctx.images else "this sample has no image to crop")
    return k, ctx.images[k]


def _resized(ctx: ToolContext, k: int, im) -> tuple[int, int]:
    if k < len(ctx.resized_sizes) and ctx.resized_sizes[k]:
        return tuple(int(v) for v in ctx.resized_sizes[k])
    return im.size


def source_box(ctx: ToolContext, k: int, im, box_model: list[float]) -> tuple[int, int, int, int]:
    """A box in the model's frame -> integer pixel box of source image ``k`` (clamped; ToolError if empty)."""
    W, H = im.size
    sx, sy = frame_scale(ctx.family, image_size=(W, H), resized_size=_resized(ctx, k, im))
    x1, y1, x2, y2 = as_box(box_model)  # orders the corners
    x1, x2 = max(0, math.floor(x1 * sx)), min(W, math.ceil(x2 * sx))
    y1, y2 = max(0, math.floor(y1 * sy)), min(H, math.ceil(y2 * sy))
    m = int(getattr(ctx.options, "min_crop_size", 1) or 1)
    if x2 - x1 < m or y2 - y1 < m:
        raise ToolError(f"box {box_model} covers {max(0, x2 - x1)}x{max(0, y2 - y1)} source pixels of image {k} "
                        f"({W}x{H}); at least {m}x{m} are needed")
    return x1, y1, x2, y2


def crop_size(w: int, h: int, pixels: int, factor: int) -> tuple[int, int]:
    """(W', H'): ``w x h`` scaled (up or down) to about ``pixels`` pixels, aspect kept, sides multiples of
    ``factor`` rounded down (at least one patch): W'·H' <= pixels unless a side hits ``factor``."""
    beta = math.sqrt(pixels / (w * h))
    side = lambda x: max(factor, math.floor(x * beta / factor + 1e-9) * factor)  # noqa: E731 (1e-9: sqrt rounding)
    return side(w), side(h)


def _crop_result(ctx: ToolContext, k: int, im, box: tuple[int, int, int, int], what: str) -> ToolResult:
    from PIL import Image

    x1, y1, x2, y2 = box
    budget = int(getattr(ctx.options, "crop_pixels", 0) or 0)
    if budget <= 0:
        wr, hr = _resized(ctx, 0, ctx.images[0])
        budget = wr * hr
    out = im.crop(box).resize(crop_size(x2 - x1, y2 - y1, budget, ctx.image_factor), Image.BICUBIC)
    return ToolResult(text=f"{what} of image {k}: source pixels [{x1}, {y1}, {x2}, {y2}], shown at "
                           f"{out.width}x{out.height}.", images=[out])


def crop(ctx: ToolContext, args: dict) -> ToolResult:
    k, im = _image(ctx, args)
    box = source_box(ctx, k, im, _number_list(args, "bbox_2d", 4))
    return _crop_result(ctx, k, im, box, "Crop")


def zoom(ctx: ToolContext, args: dict) -> ToolResult:
    k, im = _image(ctx, args)
    if "bbox_2d" in args:
        return _crop_result(ctx, k, im, source_box(ctx, k, im, _number_list(args, "bbox_2d", 4)), "Zoom")
    px, py = _number_list(args, "point_2d", 2)
    f = args.get("factor", 2)
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 1 <= f <= 64:
        raise ToolError(f"'factor' must be a number in [1, 64], got {f!r}")
    W, H = im.size
    sx, sy = frame_scale(ctx.family, image_size=(W, H), resized_size=_resized(ctx, k, im))
    cx, cy = px * sx, py * sy
    if not (0 <= cx <= W and 0 <= cy <= H):
        raise ToolError(f"point {[px, py]} lies outside image {k}")
    bw, bh = max(1, round(W / f)), max(1, round(H / f))
    x1 = min(max(0, round(cx - bw / 2)), W - bw)
    y1 = min(max(0, round(cy - bh / 2)), H - bh)
    m = int(getattr(ctx.options, "min_crop_size", 1) or 1)
    if bw < m or bh < m:
        raise ToolError(f"factor {f} leaves {bw}x{bh} source pixels; at least {m}x{m} are needed")
    return _crop_result(ctx, k, im, (x1, y1, x1 + bw, y1 + bh), "Zoom")


def _video_source(ctx: ToolContext) -> tuple[Any, float | None]:
    clip = ctx.clip
    if clip is None:
        raise ToolError("this sample has no video to seek in")
    if clip.path is not None:
        return clip.path, None
    from mmgrpo.vlm.data.task import _get

    frames = _get(ctx.sample, "video")
    if frames is None or isinstance(frames, str):
        raise ToolError("the sample's video frames are not available")
    return frames, float(clip.video_fps)


def seek(ctx: ToolContext, args: dict) -> ToolResult:
    from mmgrpo.video import VideoError
    from mmgrpo.video.clip import load_video

    s, e = args.get("start"), args.get("end")
    for name, v in (("start", s), ("end", e)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ToolError(f"{name!r} must be a number of seconds, got {v!r}")
    clip = ctx.clip
    src, vfps = _video_source(ctx)
    dur = float(clip.duration)
    s, e = float(s), min(float(e), dur)
    if s < 0 or s >= dur or e <= s:
        raise ToolError(f"time window [{s:g}, {e:g}] s is empty or outside the video (0 to {dur:.2f} s)")
    o = ctx.options
    n_max = max(2, int(getattr(o, "seek_max_frames", 8)) // 2 * 2)
    max_px = int(getattr(o, "seek_max_pixels", 0) or 0) or clip.height * clip.width
    try:
        new = load_video(src, fps=float(getattr(o, "seek_fps", 4.0)), min_frames=2, max_frames=n_max,
                         max_pixels=max_px, min_pixels=min(max_px, 4 * ctx.image_factor ** 2),
                         video_start=s, video_end=e, image_factor=ctx.image_factor, video_fps=vfps)
    except VideoError as err:
        raise ToolError(f"cannot read [{s:g}, {e:g}] s: {err}") from err
    ts = ", ".join(f"{t:.2f}" for t in new.timestamps)
    return ToolResult(text=f"{new.num_frames} frames of {new.clip_start:.2f} to {new.clip_end:.2f} s at "
                           f"{new.sample_fps:.2f} fps, timestamps (s): {ts}.", clips=[new])
